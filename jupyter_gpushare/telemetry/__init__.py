"""Live GPU telemetry: samplers (NVML or simulated), attribution, watchdog, hints.

Nothing here calls NVML at import time; samplers open NVML in their own background
thread, so the Jupyter server's event loop never blocks on the driver.
"""

from .factory import make_sampler
from .model import GPUSample, MIGSample, ProcessSample, Sample
from .sampler import RingBuffer, Sampler

__all__ = [
    "GPUSample",
    "MIGSample",
    "ProcessSample",
    "RingBuffer",
    "Sample",
    "Sampler",
    "make_sampler",
]
