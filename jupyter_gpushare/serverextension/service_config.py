"""The telemetry service's configuration: every setting of :class:`TelemetryService`, filled
from the ExtensionApp's traitlets."""

from __future__ import annotations

import os
from dataclasses import dataclass, field


@dataclass
class ServiceConfig:
    """Everything configurable (filled from the ExtensionApp's traitlets)."""

    sampler: str = "auto"
    interval_s: float = 1.0
    history_s: float = 900.0
    watchdog_action: str = "restart"
    watchdog_enabled: bool = True
    watchdog_grace_samples: int = 2
    watchdog_cooldown_s: float = 10.0
    watchdog_kill_grace_s: float = 5.0
    low_util_threshold_pct: float = 20.0
    low_util_window_s: float = 300.0
    low_util_min_memory_mib: float = 1024.0
    heartbeat_interval_s: float = 60.0
    # the first heartbeat goes out once the first sample is in, at most this long after start
    # (then every heartbeat_interval_s): the first minute of a server is measured too
    first_heartbeat_within_s: float = 3.0
    notices_interval_s: float = 5.0
    notices_to_kernels: bool = True
    broker_timeout_s: float = 5.0
    simulated_gpu_count: int = 2
    simulated_gpu_model: str = "H200-sim"
    simulated_gpu_memory_mib: int = 143771
    simulated_kernel_memory_mib: int = 0
    simulated_background_load: bool = True
    api_token: str = field(default_factory=lambda: os.environ.get("JUPYTERHUB_API_TOKEN", ""))
