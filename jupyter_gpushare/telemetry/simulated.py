"""Simulated GPUs: plausible, deterministic load curves where no GPU exists.

Every sample it produces says ``simulated=True``. Per-process memory can be set by
hand (:meth:`SimulatedSampler.set_process_memory`), which is how the watchdog is
exercised without a GPU: make a real kernel process "use" N MiB.

A notebook makes its own kernel "use" simulated GPU memory and compute with
:mod:`jupyter_gpushare.simgpu` (``use_gpu_memory("6 GiB")``): the request is a small file
per kernel process (:mod:`.simrequests`), read here at each sample for the server's own
kernels (``own_pids``) only, bounded by the card, and dropped when the kernel dies.

A server's own use is modelled from its real processes (``own_pids``): a process computes
on its simulated GPU as hard as it computes on the CPU, up to the grant's compute share
(``own_compute_pct``). An idle kernel uses nothing; a cell that runs shows up at once.
The card's total adds a varying load from other users (``background_load``).
"""

from __future__ import annotations

import math
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .model import GPUSample, ProcessSample, Sample
from .sampler import DEFAULT_HISTORY_S, DEFAULT_INTERVAL_S, Sampler
from .simrequests import SimRequest, read_request, remove_request, requests_dir

DEFAULT_MODEL = "H200-sim"
DEFAULT_MEMORY_MIB = 143771
DEFAULT_COUNT = 2


@dataclass
class _SimProcess:
    pid: int
    gpu_uuid: str
    memory_mib: float
    sm_util_pct: float


def default_uuids(count: int, node: str = "local") -> tuple[str, ...]:
    """UUIDs of ``count`` simulated GPUs, in the ``GPU-sim-<node>-<i>`` style."""
    return tuple(f"GPU-sim-{node}-{i}" for i in range(count))


def _phase(uuid: str) -> float:
    return (zlib.crc32(uuid.encode()) % 10_000) / 10_000 * 2 * math.pi


def _wave(t: float, period_s: float, phase: float) -> float:
    return math.sin(2 * math.pi * t / period_s + phase)


def _clamp(x: float, lo: float, hi: float) -> float:
    return max(lo, min(hi, x))


class SimulatedSampler(Sampler):
    """A stand-in with the NVML sampler's interface; always labelled simulated."""

    source = "simulated"

    def __init__(
        self,
        interval_s: float = DEFAULT_INTERVAL_S,
        history_s: float = DEFAULT_HISTORY_S,
        uuids: Sequence[str] = (),
        count: int = DEFAULT_COUNT,
        model: str = DEFAULT_MODEL,
        memory_total_mib: float = DEFAULT_MEMORY_MIB,
        background_load: bool = True,
        power_limit_w: float = 700.0,
        own_pids: Callable[[], Iterable[int]] | None = None,
        own_compute_pct: float | None = None,
        requests_folder: Path | None = None,
    ) -> None:
        super().__init__(interval_s, history_s)
        self.own_pids = own_pids
        self.own_compute_pct = float(own_compute_pct or 100.0)
        self._ps: dict[int, Any] = {}
        self.uuids: tuple[str, ...] = tuple(uuids) or default_uuids(count)
        self.model = model
        self.memory_total_mib = float(memory_total_mib)
        self.background_load = background_load
        self.power_limit_w = power_limit_w
        self._procs: dict[tuple[int, str], _SimProcess] = {}
        self._lock = threading.Lock()
        self.requests_folder = requests_folder
        self._own_seen: set[int] = set()

    @property
    def simulated(self) -> bool:
        return True

    # -- test / demo hooks ---------------------------------------------------------
    def set_process_memory(
        self, pid: int, memory_mib: float, gpu_uuid: str | None = None, sm_util_pct: float = 0.0
    ) -> None:
        """Make process ``pid`` "use" ``memory_mib`` MiB on a GPU (0 removes it)."""
        uuid = gpu_uuid or self.uuids[0]
        if uuid not in self.uuids:
            raise ValueError(f"{uuid} is not a simulated GPU here ({', '.join(self.uuids)})")
        with self._lock:
            if memory_mib <= 0:
                self._procs.pop((pid, uuid), None)
            else:
                self._procs[(pid, uuid)] = _SimProcess(pid, uuid, float(memory_mib), sm_util_pct)

    def clear_processes(self) -> None:
        with self._lock:
            self._procs.clear()

    def process_memory(self) -> dict[int, float]:
        """Total simulated MiB per pid."""
        with self._lock:
            out: dict[int, float] = {}
            for p in self._procs.values():
                out[p.pid] = out.get(p.pid, 0.0) + p.memory_mib
            return out

    def modelled_use(self) -> dict[int, float]:
        """Compute (%) each of ``own_pids`` uses now: its CPU use since the last sample,
        scaled to the grant's compute share. Blocking (psutil): the sampler thread's."""
        if self.own_pids is None:
            return {}
        import psutil

        out: dict[int, float] = {}
        alive: dict[int, Any] = {}
        for pid in {p for p in self.own_pids() if p}:
            proc = self._ps.get(pid)
            try:
                if proc is None:
                    proc = psutil.Process(pid)
                    proc.cpu_percent(None)  # the first call starts the interval
                    alive[pid] = proc
                    continue
                cpu = float(proc.cpu_percent(None))
            except psutil.Error:
                continue
            alive[pid] = proc
            util = min(self.own_compute_pct, cpu / 100.0 * self.own_compute_pct)
            if util >= 0.5:
                out[pid] = round(util, 1)
        self._ps = alive
        return out

    def requested_use(self) -> dict[int, SimRequest]:
        """What the server's own kernels asked to use (:mod:`jupyter_gpushare.simgpu`),
        bounded by the card; the request of a kernel that left ``own_pids`` (it died or
        restarted) is deleted. Blocking (files, psutil): the sampler thread's."""
        if self.own_pids is None:
            return {}
        if self.requests_folder is None:
            self.requests_folder = requests_dir()
        own = {p for p in self.own_pids() if p}
        for pid in self._own_seen - own:
            remove_request(pid, self.requests_folder)
        self._own_seen = own
        out: dict[int, SimRequest] = {}
        for pid in own:
            req = read_request(pid, self.memory_total_mib, len(self.uuids), self.requests_folder)
            if req is not None:  # zeros too: "release" overrides simulated_kernel_memory_mib
                out[pid] = req
        return out

    def _with_requests(self, procs: list[_SimProcess]) -> list[_SimProcess]:
        """``procs`` with each requesting kernel's use replaced by what it asked for."""
        requests = self.requested_use()
        if not requests:
            return procs
        kept = [p for p in procs if p.pid not in requests]
        return kept + [_SimProcess(r.pid, self.uuids[r.gpu], r.memory_mib, r.compute_pct)
                       for r in requests.values()]

    # -- sampling ------------------------------------------------------------------
    def _gpu(self, index: int, uuid: str, t: float, procs: list[_SimProcess]) -> GPUSample:
        ph = _phase(uuid)
        proc_mem = sum(p.memory_mib for p in procs)
        proc_util = sum(p.sm_util_pct for p in procs)
        if self.background_load:
            util = 45 + 30 * _wave(t, 120, ph) + 10 * _wave(t, 17, 2 * ph)
            base_mem = self.memory_total_mib * (0.25 + 0.1 * _wave(t, 300, ph))
        else:
            util, base_mem = 0.0, 0.0
        util = _clamp(util + proc_util, 0.0, 100.0)
        used = _clamp(base_mem + proc_mem, 0.0, self.memory_total_mib)
        return GPUSample(
            index=index,
            uuid=uuid,
            name=self.model,
            memory_used_mib=round(used, 1),
            memory_total_mib=self.memory_total_mib,
            utilization_pct=round(util, 1),
            memory_bandwidth_pct=round(util * 0.6, 1),
            temperature_c=round(32 + util * 0.4, 1),
            power_w=round(80 + util / 100 * (self.power_limit_w - 80), 1),
            power_limit_w=self.power_limit_w,
        )

    def collect(self) -> Sample:
        t = time.time()
        modelled = self.modelled_use()
        with self._lock:
            procs = list(self._procs.values())
        procs = self._with_requests(procs)
        if modelled:
            first = self.uuids[0]
            by_pid = {p.pid: p for p in procs if p.gpu_uuid == first}
            for pid, util in modelled.items():
                p = by_pid.get(pid)
                if p is not None:
                    procs[procs.index(p)] = _SimProcess(
                        pid, first, p.memory_mib, max(p.sm_util_pct, util)
                    )
                else:
                    procs.append(_SimProcess(pid, first, 0.0, util))
        gpus = tuple(
            self._gpu(i, u, t, [p for p in procs if p.gpu_uuid == u])
            for i, u in enumerate(self.uuids)
        )
        processes = tuple(
            ProcessSample(
                pid=p.pid,
                gpu_uuid=p.gpu_uuid,
                memory_used_mib=p.memory_mib,
                sm_util_pct=p.sm_util_pct,
                mem_util_pct=round(p.sm_util_pct * 0.6, 1),
            )
            for p in procs
        )
        return Sample(
            ts=t,
            gpus=gpus,
            processes=processes,
            simulated=True,
            source=self.source,
            process_utilization=True,
        )
