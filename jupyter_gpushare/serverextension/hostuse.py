"""Host CPU and memory of this server's processes, beside the GPU figure in JupyterLab.

The same measure as jupyter-resource-usage (the server and all its children: RSS, and CPU
as the sum of the processes' ``cpu_percent``). Where jupyter-resource-usage is loaded its
own endpoint (``/api/metrics/v1``) already measures this, so this module measures nothing
and the sample says where the figures are (``source``): the two never measure twice.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any

import psutil

MIB = 1024 * 1024
RESOURCE_USAGE = "jupyter-resource-usage"
OWN = "gpushare"


@dataclass(frozen=True)
class HostUse:
    """One reading: this server's processes' memory (MiB) and CPU (% of one core)."""

    source: str
    rss_mib: float | None = None
    memory_limit_mib: float | None = None
    cpu_pct: float | None = None
    cpu_count: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _env_number(name: str) -> float | None:
    raw = os.environ.get(name, "").strip()
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if value > 0 else None


class HostMeter:
    """Measures the process tree of ``server_pid`` (blocking: call it off the event loop)."""

    def __init__(self, server_pid: int) -> None:
        self.server_pid = server_pid
        self._procs: dict[int, psutil.Process] = {}

    def measure(self) -> HostUse:
        try:
            root = psutil.Process(self.server_pid)
            tree = [root, *root.children(recursive=True)]
        except psutil.Error:
            return HostUse(source=OWN)
        # keep the Process objects: cpu_percent() compares with the previous call on each
        kept = {p.pid: self._procs.get(p.pid, p) for p in tree}
        self._procs = kept
        rss = 0.0
        cpu = 0.0
        for p in kept.values():
            try:
                rss += p.memory_info().rss
                cpu += p.cpu_percent(interval=None)
            except psutil.Error:
                continue
        limit = _env_number("MEM_LIMIT")  # bytes, as jupyter-resource-usage reads it
        return HostUse(
            source=OWN,
            rss_mib=round(rss / MIB, 1),
            memory_limit_mib=round(limit / MIB, 1) if limit else None,
            cpu_pct=round(cpu, 1),
            cpu_count=psutil.cpu_count() or None,
        )


def resource_usage_loaded(settings: dict[str, Any]) -> bool:
    """Whether jupyter-resource-usage's server extension runs in this server."""
    return "jupyter_resource_usage_display_config" in settings
