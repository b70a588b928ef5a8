"""Which GPUs and processes are this server's, and which kernel each process serves.

:func:`collect_process_tree` reads the live process tree (psutil, blocking: call it off
the event loop). :func:`attribute` is pure: sample + grant UUIDs + tree in, this
server's view out. Where a container hides the host's process ids (NVML reports pids
that do not exist in this pid namespace), it falls back to device totals and says so.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .model import GPUSample, ProcessSample, Sample

MODE_PROCESSES = "processes"
MODE_DEVICE_TOTALS = "device_totals"
HIDDEN_PIDS_NOTE = (
    "this container hides the host's process ids, so GPU use cannot be attributed to "
    "this server's processes: figures are device totals (they include anyone else "
    "sharing the GPU)"
)
NO_PROCESS_MEMORY_NOTE = (
    "the driver does not report per-process GPU memory here: figures are device totals"
)


@dataclass(frozen=True)
class KernelInfo:
    """A kernel of this server: its id, process id and notebook path (if any)."""

    kernel_id: str
    pid: int | None
    path: str | None = None
    name: str = ""

    @property
    def label(self) -> str:
        return self.path or f"kernel {self.kernel_id[:8]}"


@dataclass(frozen=True)
class ProcessTree:
    """This server's processes: pid -> kernel id (``None`` for non-kernel processes)."""

    server_pid: int
    owner: dict[int, str | None] = field(default_factory=dict)

    def __contains__(self, pid: object) -> bool:
        return pid in self.owner


def collect_process_tree(server_pid: int, kernels: Iterable[KernelInfo]) -> ProcessTree:
    """Walk the live process tree of ``server_pid`` and mark each kernel's subtree."""
    import psutil  # here, not at import: the server's start-up does not pay for it

    owner: dict[int, str | None] = {server_pid: None}
    try:
        root = psutil.Process(server_pid)
        for child in root.children(recursive=True):
            owner[child.pid] = None
    except psutil.Error:
        pass
    for k in kernels:
        if k.pid is None:
            continue
        owner[k.pid] = k.kernel_id
        try:
            for child in psutil.Process(k.pid).children(recursive=True):
                owner[child.pid] = k.kernel_id
        except psutil.Error:
            continue
    return ProcessTree(server_pid, owner)


@dataclass(frozen=True)
class OwnGPU:
    """One granted GPU (or MIG device) with the server's share of it."""

    uuid: str
    gpu: GPUSample
    memory_used_mib: float
    memory_total_mib: float
    own_memory_mib: float
    own_util_pct: float | None

    def to_dict(self, limit_mib: int | None) -> dict[str, Any]:
        g = self.gpu
        return {
            "uuid": self.uuid,
            "physical_uuid": g.uuid,
            "index": g.index,
            "name": g.name,
            "memory_used_mib": round(self.memory_used_mib, 1),
            "memory_total_mib": round(self.memory_total_mib, 1),
            "own_memory_mib": round(self.own_memory_mib, 1),
            "memory_limit_mib": limit_mib,
            "utilization_pct": g.utilization_pct,
            "own_utilization_pct": self.own_util_pct,
            "memory_bandwidth_pct": g.memory_bandwidth_pct,
            "temperature_c": g.temperature_c,
            "power_w": None if g.power_w is None else round(g.power_w, 1),
            "power_limit_w": g.power_limit_w,
            "mig_mode": g.mig_mode,
        }


@dataclass(frozen=True)
class KernelUsage:
    """GPU use of one kernel (its whole process subtree)."""

    kernel: KernelInfo
    memory_mib_by_gpu: dict[str, float]
    sm_util_pct: float | None

    @property
    def memory_mib(self) -> float:
        return sum(self.memory_mib_by_gpu.values())

    def to_dict(self) -> dict[str, Any]:
        return {
            "kernel_id": self.kernel.kernel_id,
            "path": self.kernel.path,
            "pid": self.kernel.pid,
            "memory_mib": round(self.memory_mib, 1),
            "memory_mib_by_gpu": {u: round(m, 1) for u, m in self.memory_mib_by_gpu.items()},
            "sm_util_pct": self.sm_util_pct,
        }


@dataclass(frozen=True)
class Attribution:
    """This server's view of one sample."""

    mode: str
    note: str | None
    gpus: tuple[OwnGPU, ...]
    processes: tuple[tuple[ProcessSample, str | None], ...]
    kernels: tuple[KernelUsage, ...]
    missing_uuids: tuple[str, ...] = ()

    def own_gpu(self, uuid: str) -> OwnGPU | None:
        return next((g for g in self.gpus if g.uuid == uuid), None)

    def to_dict(self, limit_mib: int | None = None) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "note": self.note,
            "missing_gpus": list(self.missing_uuids),
            "processes": [
                {
                    "pid": p.pid,
                    "gpu_uuid": p.gpu_uuid,
                    "memory_used_mib": p.memory_used_mib,
                    "sm_util_pct": p.sm_util_pct,
                    "kernel_id": kid,
                }
                for p, kid in self.processes
            ],
            "kernels": [k.to_dict() for k in self.kernels],
        }


def _device_view(gpu: GPUSample, uuid: str) -> tuple[float, float]:
    """(used, total) MiB of the GPU or, for a MIG UUID, of that MIG device."""
    for m in gpu.mig_devices:
        if m.uuid == uuid:
            return m.memory_used_mib, m.memory_total_mib
    return gpu.memory_used_mib, gpu.memory_total_mib


def _own_uuids(sample: Sample, grant_uuids: Sequence[str]) -> tuple[list[str], list[str]]:
    if not grant_uuids:
        return [g.uuid for g in sample.gpus], []
    found = [u for u in grant_uuids if sample.gpu(u) is not None]
    return found, [u for u in grant_uuids if sample.gpu(u) is None]


def _on(uuid: str, p: ProcessSample, sample: Sample) -> bool:
    if p.gpu_uuid == uuid:
        return True
    g = sample.gpu(p.gpu_uuid)
    return g is not None and g.uuid == uuid and not g.mig_mode


def _util_sum(vals: Iterable[float | None]) -> float | None:
    xs = [v for v in vals if v is not None]
    return round(min(100.0, sum(xs)), 1) if xs else None


def attribute(
    sample: Sample,
    grant_uuids: Sequence[str],
    tree: ProcessTree,
    kernels: Sequence[KernelInfo] = (),
    pid_exists: Callable[[int], bool] | None = None,
) -> Attribution:
    """This server's GPUs, processes and per-kernel use in ``sample``."""
    if pid_exists is None:
        import psutil

        pid_exists = psutil.pid_exists
    own, missing = _own_uuids(sample, grant_uuids)
    on_own = [(u, p) for p in sample.processes for u in own if _on(u, p, sample)]
    hidden = bool(on_own) and not any(pid_exists(p.pid) for _, p in on_own)
    no_mem = bool(on_own) and all(p.memory_used_mib is None for _, p in on_own)
    mode = MODE_DEVICE_TOTALS if hidden or no_mem else MODE_PROCESSES
    note = HIDDEN_PIDS_NOTE if hidden else NO_PROCESS_MEMORY_NOTE if no_mem else None

    mine = [(u, p) for u, p in on_own if p.pid in tree]
    gpus = []
    for u in own:
        g = sample.gpu(u)
        assert g is not None
        used, total = _device_view(g, u)
        procs = [p for pu, p in mine if pu == u]
        if mode == MODE_DEVICE_TOTALS:
            own_mem, own_util = used, g.utilization_pct
        else:
            own_mem = sum(p.memory_used_mib or 0.0 for p in procs)
            own_util = (
                _util_sum(p.sm_util_pct for p in procs) or 0.0  # none of ours: idle
                if sample.process_utilization
                else None
            )
        gpus.append(OwnGPU(u, g, used, total, own_mem, own_util))

    usages = []
    if mode == MODE_PROCESSES:
        for k in kernels:
            by_gpu: dict[str, float] = {}
            utils: list[float | None] = []
            for u, p in mine:
                if tree.owner.get(p.pid) == k.kernel_id:
                    by_gpu[u] = by_gpu.get(u, 0.0) + (p.memory_used_mib or 0.0)
                    utils.append(p.sm_util_pct)
            usages.append(KernelUsage(k, by_gpu, _util_sum(utils)))
    return Attribution(
        mode=mode,
        note=note,
        gpus=tuple(gpus),
        processes=tuple((p, tree.owner.get(p.pid)) for _, p in mine),
        kernels=tuple(usages),
        missing_uuids=tuple(missing),
    )
