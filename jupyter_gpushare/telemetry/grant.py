"""The grant as the spawner hands it to the single-user server (``GPUSHARE_*`` env)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

MIB_PER_GIB = 1024.0
# Enforcement modes where hardware or MPS already holds memory: no watchdog needed.
HARD_MEMORY_ENFORCEMENT = frozenset({"mps", "mig", "hami"})


def _int(v: str | None) -> int | None:
    try:
        return int(float(v)) if v not in (None, "") else None
    except ValueError:
        return None


def _float(v: str | None) -> float | None:
    try:
        return float(v) if v not in (None, "") else None
    except ValueError:
        return None


def _bool(v: str | None) -> bool:
    return (v or "").strip().lower() in {"1", "true", "yes", "on"}


@dataclass(frozen=True)
class GrantInfo:
    """What this server was granted; ``grant_id is None`` means "no grant"."""

    grant_id: str | None = None
    gpu_uuids: tuple[str, ...] = ()
    memory_limit_mib: int | None = None
    gpu_memory_mib: int | None = None  # the whole card's memory (GPUSHARE_GPU_MEMORY_MIB)
    compute_pct: float | None = None
    units: float | None = None
    profile: str | None = None
    team: str | None = None
    pool: str | None = None
    borrowed: bool = False
    preemptible: bool = False
    enforcement: str | None = None
    simulated: bool = False
    broker_url: str | None = None
    user: str | None = None
    server_name: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> GrantInfo:
        """Read the ``GPUSHARE_*`` contract; missing variables mean "no grant"."""
        e = os.environ if env is None else env
        uuids = tuple(u.strip() for u in e.get("GPUSHARE_GPU_UUIDS", "").split(",") if u.strip())
        return cls(
            grant_id=e.get("GPUSHARE_GRANT_ID") or None,
            gpu_uuids=uuids,
            memory_limit_mib=_int(e.get("GPUSHARE_MEMORY_LIMIT_MIB")),
            gpu_memory_mib=_int(e.get("GPUSHARE_GPU_MEMORY_MIB")),
            compute_pct=_float(e.get("GPUSHARE_COMPUTE_PCT")),
            units=_float(e.get("GPUSHARE_UNITS")),
            profile=e.get("GPUSHARE_PROFILE") or None,
            team=e.get("GPUSHARE_TEAM") or None,
            pool=e.get("GPUSHARE_POOL") or None,
            borrowed=_bool(e.get("GPUSHARE_BORROWED")),
            preemptible=_bool(e.get("GPUSHARE_PREEMPTIBLE")),
            enforcement=(e.get("GPUSHARE_ENFORCEMENT") or "").strip().lower() or None,
            simulated=_bool(e.get("GPUSHARE_SIMULATED"))
            or any(u.startswith("GPU-sim") for u in uuids),
            broker_url=(e.get("GPUSHARE_BROKER_URL") or "").rstrip("/") or None,
            user=e.get("JUPYTERHUB_USER") or None,
            server_name=e.get("JUPYTERHUB_SERVER_NAME") or None,
        )

    @property
    def has_grant(self) -> bool:
        return self.grant_id is not None

    @property
    def memory_limit_gib(self) -> float | None:
        return None if self.memory_limit_mib is None else self.memory_limit_mib / MIB_PER_GIB

    @property
    def memory_is_hard_limited(self) -> bool:
        """True where hardware or MPS already stops a process at its memory limit."""
        return (self.enforcement or "") in HARD_MEMORY_ENFORCEMENT

    def limits(self) -> dict[str, Any]:
        return {
            "memory_mib": self.memory_limit_mib,
            "compute_pct": self.compute_pct,
            "enforcement": self.enforcement,
            "memory_hard_limited": self.memory_is_hard_limited,
        }

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["gpu_uuids"] = list(self.gpu_uuids)
        d.pop("broker_url")
        d["has_grant"] = self.has_grant
        if not self.has_grant:
            d["status"] = "no grant"
        return d
