"""Limit watchdog: which kernel went over the grant's GPU memory limit (pure logic).

Used only where nothing else holds memory (local "env" enforcement): with MPS, MIG or
HAMi the allocation itself fails at the limit. The decision is separate from the
action; the server extension interrupts, restarts or shuts the kernel down.
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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def gib(mib: float) -> str:
    return f"{mib / MIB_PER_GIB:.1f} GiB"


def violation_message(
    limit_mib: int, label: str | None, used_mib: float, server_used_mib: float, uuid: str
) -> str:
    """``GPU memory limit 10.0 GiB exceeded: kernel of analysis.ipynb used 11.2 GiB``."""
    who = f"kernel of {label}" if label else "a process of this server that is not a kernel"
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

    def _offender(self, att: Attribution, uuid: str) -> KernelUsage | None:
        holders = [k for k in att.kernels if k.memory_mib_by_gpu.get(uuid, 0.0) > 0]
        return max(holders, key=lambda k: k.memory_mib_by_gpu[uuid], default=None)

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
            key = f"{k.kernel.kernel_id if k else '-'}@{g.uuid}"
            seen.add(key)
            self._over[key] = self._over.get(key, 0) + 1
            if self._over[key] < self.grace_samples:
                continue
            if now - self._acted.get(key, float("-inf")) < self.cooldown_s:
                continue
            self._acted[key] = now
            used = k.memory_mib_by_gpu[g.uuid] if k else g.own_memory_mib
            label = k.kernel.label if k else None
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
                        self.limit_mib, label, used, g.own_memory_mib, g.uuid
                    ),
                )
            )
        for key in list(self._over):
            if key not in seen:
                del self._over[key]
        return out
