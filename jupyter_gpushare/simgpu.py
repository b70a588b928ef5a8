"""Make this notebook's kernel "use" simulated GPU memory and compute (demo, Binder, CI).

With simulated GPUs (the demo hub, Binder, a laptop) nothing a notebook does moves its GPU
figures. In a notebook::

    from jupyter_gpushare.simgpu import use_gpu_memory, use_gpu_compute, release_gpu

    use_gpu_memory("6 GiB")   # the status bar shows 6.0 GiB of your limit
    use_gpu_compute(50)       # 50 % of the card's compute
    use_gpu_memory("20 GiB")  # over a 14 GiB limit: the watchdog acts (restart by default)
    release_gpu()             # back to nothing (also over simulated_kernel_memory_mib)

The server's simulated sampler shows it for this kernel only, on the next sample (every
second by default), as if the kernel's process held that memory: the status bar, the GPU
panel, the watchdog and the limit all see it. Memory is bounded by the simulated card's
memory, compute by 100 %. A kernel that restarts or dies starts again from nothing (a real
one frees its GPU memory too). With real GPUs these calls change nothing the server shows,
and say so by their return value.

How it travels: :mod:`jupyter_gpushare.telemetry.simrequests` (one small file per kernel
process, in ``$GPUSHARE_SIMGPU_DIR`` or Jupyter's runtime folder).
"""

from __future__ import annotations

import atexit
import os
from dataclasses import asdict, replace
from typing import Any

from .policy_units import UnitError, parse_memory_mib
from .telemetry.simrequests import (
    SimRequest,
    process_started,
    read_request,
    remove_request,
    write_request,
)

__all__ = ["release_gpu", "simulated_use", "use_gpu_compute", "use_gpu_memory"]

_cleanup_registered = False


def _simulated() -> bool:
    """Whether this kernel's server is on simulated GPUs (its grant says so, or it has none)."""
    return os.environ.get("GPUSHARE_SIMULATED", "").lower() in ("1", "true", "yes") or not \
        os.environ.get("GPUSHARE_GPU_UUIDS")


def _current() -> SimRequest:
    pid = os.getpid()
    got = read_request(pid, float("inf"), 1 << 16)
    return got if got is not None else SimRequest(pid=pid, started=process_started(pid))


def _save(req: SimRequest) -> dict[str, Any]:
    """Write the request (zeros too: they override the server's
    ``simulated_kernel_memory_mib`` for this kernel); deleted when this process exits."""
    global _cleanup_registered
    write_request(req)
    if not _cleanup_registered:
        atexit.register(remove_request, req.pid)
        _cleanup_registered = True
    return _view(req)


def _view(req: SimRequest) -> dict[str, Any]:
    out = {k: v for k, v in asdict(req).items() if k in ("pid", "memory_mib", "compute_pct",
                                                         "gpu")}
    out["simulated"] = _simulated()
    if not out["simulated"]:
        out["note"] = "this server samples real GPUs: simulated use is not shown"
    return out


def use_gpu_memory(amount: str | float, gpu: int = 0) -> dict[str, Any]:
    """Show ``amount`` of GPU memory held by this kernel: ``"6 GiB"``, ``"512 MiB"`` or a
    number of MiB; ``0`` frees it. ``gpu``: which of the server's GPUs (0 = the first).
    Returns what is now asked (``memory_mib`` in MiB, ``compute_pct`` in %)."""
    try:
        mib = parse_memory_mib(amount)
    except UnitError as exc:
        raise ValueError(f"use_gpu_memory: amount {amount!r}: expected {exc}") from None
    return _save(replace(_current(), memory_mib=float(mib), gpu=_gpu_index(gpu)))


def use_gpu_compute(percent: float, gpu: int = 0) -> dict[str, Any]:
    """Show this kernel computing at ``percent`` (0..100) of the GPU's compute; 0 stops it."""
    if isinstance(percent, bool) or not isinstance(percent, (int, float)) or \
            not 0 <= percent <= 100:
        raise ValueError(f"use_gpu_compute: percent {percent!r}: expected a number from 0 "
                         "to 100 (% of the GPU's compute)")
    return _save(replace(_current(), compute_pct=float(percent), gpu=_gpu_index(gpu)))


def release_gpu() -> dict[str, Any]:
    """Free all simulated GPU memory and compute of this kernel."""
    return _save(replace(_current(), memory_mib=0.0, compute_pct=0.0))


def simulated_use() -> dict[str, Any]:
    """What this kernel asks the simulated GPUs to show now."""
    return _view(_current())


def _gpu_index(gpu: int) -> int:
    if isinstance(gpu, bool) or not isinstance(gpu, int) or not 0 <= gpu < 1 << 16:
        raise ValueError(f"gpu {gpu!r}: expected the index of one of the server's GPUs "
                         "(0 = the first)")
    return gpu
