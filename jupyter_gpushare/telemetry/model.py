"""Plain data for one telemetry sample: per GPU, per MIG device and per process.

All memory figures are MiB, utilisation is percent (0-100), ``None`` means the
driver does not report the figure. Samples are immutable and JSON-ready through
:meth:`Sample.to_dict`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class ProcessSample:
    """GPU use of one operating-system process on one GPU (or MIG device)."""

    pid: int
    gpu_uuid: str
    memory_used_mib: float | None
    sm_util_pct: float | None = None
    mem_util_pct: float | None = None
    kind: str = "compute"


@dataclass(frozen=True, slots=True)
class MIGSample:
    """One MIG device (hardware partition) of a GPU in MIG mode."""

    uuid: str
    index: int
    memory_used_mib: float
    memory_total_mib: float
    name: str = ""


@dataclass(frozen=True, slots=True)
class GPUSample:
    """Device-wide figures of one physical GPU."""

    index: int
    uuid: str
    name: str
    memory_used_mib: float
    memory_total_mib: float
    utilization_pct: float | None
    memory_bandwidth_pct: float | None
    temperature_c: float | None
    power_w: float | None
    power_limit_w: float | None = None
    mig_mode: bool = False
    mig_devices: tuple[MIGSample, ...] = ()
    vendor: str = ""  # "NVIDIA", "AMD", "MetaX" (empty where unknown, e.g. simulated)

    def owns_uuid(self, uuid: str) -> bool:
        """True when ``uuid`` names this GPU or one of its MIG devices."""
        return uuid == self.uuid or any(m.uuid == uuid for m in self.mig_devices)


@dataclass(frozen=True, slots=True)
class Sample:
    """Everything one sampling tick saw."""

    ts: float
    gpus: tuple[GPUSample, ...]
    processes: tuple[ProcessSample, ...] = ()
    simulated: bool = False
    source: str = "nvml"
    error: str | None = None
    process_utilization: bool = False
    notes: tuple[str, ...] = field(default=())

    def gpu(self, uuid: str) -> GPUSample | None:
        """The GPU with this UUID (or owning this MIG UUID), if sampled."""
        for g in self.gpus:
            if g.owns_uuid(uuid):
                return g
        return None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        d = asdict(self)
        d["gpus"] = [asdict(g) for g in self.gpus]
        d["processes"] = [asdict(p) for p in self.processes]
        d["notes"] = list(self.notes)
        return d

    def compact(self) -> dict[str, Any]:
        """Small form for history: device figures only, no processes."""
        return {
            "ts": self.ts,
            "simulated": self.simulated,
            "gpus": [
                {
                    "uuid": g.uuid,
                    "memory_used_mib": g.memory_used_mib,
                    "utilization_pct": g.utilization_pct,
                    "memory_bandwidth_pct": g.memory_bandwidth_pct,
                }
                for g in self.gpus
            ],
        }
