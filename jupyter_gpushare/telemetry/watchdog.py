"""Limit watchdog: which process went over the grant's GPU memory limit (pure logic).

Used only where nothing else holds memory (local "env" enforcement): with MPS, MIG or
HAMi the allocation itself fails at the limit. The decision is separate from the
action: the server extension interrupts, restarts or shuts down an offending kernel, and
stops any other process of the server (``python train.py`` from a terminal) with SIGTERM,
then SIGKILL after a grace period. The limit holds for every process of the server.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from .attribution import MODE_PROCESSES, Attribution, KernelUsage
from .grant import MIB_PER_GIB, GrantInfo

ACTIONS = ("interrupt", "restart", "shutdown")


@dataclass(frozen=True)
class Violation:
    """One kernel over the limit on one GPU."""

    kernel_id: str | None
    path: str | None
    gpu_uuid: str
    used_mib: float
    server_used_mib: float
    limit_mib: int
    ts: float
    message: str
    pid: int | None = None  # a process of the server that is not a kernel

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def gib(mib: float) -> str:
    return f"{mib / MIB_PER_GIB:.1f} GiB"


def violation_message(
    limit_mib: int,
    label: str | None,
    used_mib: float,
    server_used_mib: float,
    uuid: str,
    pid: int | None = None,
) -> str:
    """``GPU memory limit 10.0 GiB exceeded: kernel of analysis.ipynb used 11.2 GiB``."""
    if label:
        who = f"kernel of {label}"
    elif pid is not None:
        who = f"process {pid} of this server (not a kernel)"
    else:
        who = "a process of this server that is not a kernel"
    msg = f"GPU memory limit {gib(limit_mib)} exceeded: {who} used {gib(used_mib)}"
    if server_used_mib - used_mib >= 0.05 * MIB_PER_GIB:
        msg += f" (this server used {gib(server_used_mib)} in all on {uuid})"
    return msg


def watchdog_applies(grant: GrantInfo) -> tuple[bool, str]:
    """Whether the watchdog must hold memory for this grant, and why (not)."""
    if grant.memory_limit_mib is None:
        return False, "no memory limit in the grant"
    if grant.memory_is_hard_limited:
        return False, f"memory is held by {grant.enforcement} enforcement"
    return True, f"local enforcement ({grant.enforcement or 'none'}): the watchdog holds memory"


@dataclass
class LimitWatchdog:
    """Flags a kernel once the server's memory on a granted GPU stays over the limit.

    ``grace_samples`` consecutive over-limit samples are needed (a single spike is
    not acted on); after acting on a kernel it is left alone for ``cooldown_s``.
    """

    limit_mib: int
    grace_samples: int = 2
    cooldown_s: float = 10.0
    _over: dict[str, int] = field(default_factory=dict)
    _acted: dict[str, float] = field(default_factory=dict)

    server_pid: int | None = None  # never stopped by the watchdog (it is the server)

    def _offender(self, att: Attribution, uuid: str) -> KernelUsage | None:
        holders = [k for k in att.kernels if k.memory_mib_by_gpu.get(uuid, 0.0) > 0]
        return max(holders, key=lambda k: k.memory_mib_by_gpu[uuid], default=None)

    def _process_offender(self, att: Attribution, uuid: str) -> tuple[int, float] | None:
        """The non-kernel process of the server with the most memory on ``uuid``."""
        used: dict[int, float] = {}
        for p, kernel_id in att.processes:
            if kernel_id is not None or p.gpu_uuid != uuid or p.pid == self.server_pid:
                continue
            used[p.pid] = used.get(p.pid, 0.0) + (p.memory_used_mib or 0.0)
        if not used:
            return None
        pid = max(used, key=lambda q: used[q])
        return (pid, used[pid]) if used[pid] > 0 else None

    @staticmethod
    def _non_kernel_use(att: Attribution, uuid: str) -> float:
        """The most memory one non-kernel process holds on ``uuid``."""
        per: dict[int, float] = {}
        for p, kernel_id in att.processes:
            if kernel_id is None and p.gpu_uuid == uuid:
                per[p.pid] = per.get(p.pid, 0.0) + (p.memory_used_mib or 0.0)
        return max(per.values(), default=0.0)

    def check(self, att: Attribution, now: float) -> list[Violation]:
        """Violations to act on now (stateful: counts consecutive samples)."""
        if att.mode != MODE_PROCESSES:
            return []
        out: list[Violation] = []
        seen: set[str] = set()
        for g in att.gpus:
            if g.own_memory_mib <= self.limit_mib:
                continue
            k = self._offender(att, g.uuid)
            proc = None
            if k is None or k.memory_mib_by_gpu[g.uuid] < self._non_kernel_use(att, g.uuid):
                proc = self._process_offender(att, g.uuid)
                if proc is not None:
                    k = None
            key = (
                f"{k.kernel.kernel_id}@{g.uuid}" if k
                else f"pid:{proc[0]}@{g.uuid}" if proc
                else f"-@{g.uuid}"
            )
            seen.add(key)
            self._over[key] = self._over.get(key, 0) + 1
            if self._over[key] < self.grace_samples:
                continue
            if now - self._acted.get(key, float("-inf")) < self.cooldown_s:
                continue
            self._acted[key] = now
            used = (
                k.memory_mib_by_gpu[g.uuid] if k else proc[1] if proc else g.own_memory_mib
            )
            label = k.kernel.label if k else None
            pid = proc[0] if proc and not k else None
            out.append(
                Violation(
                    kernel_id=k.kernel.kernel_id if k else None,
                    path=k.kernel.path if k else None,
                    gpu_uuid=g.uuid,
                    used_mib=round(used, 1),
                    server_used_mib=round(g.own_memory_mib, 1),
                    limit_mib=self.limit_mib,
                    ts=now,
                    message=violation_message(
                        self.limit_mib, label, used, g.own_memory_mib, g.uuid, pid
                    ),
                    pid=pid,
                )
            )
        for key in list(self._over):
            if key not in seen:
                del self._over[key]
        return out
