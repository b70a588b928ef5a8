"""The what-if replay's records: its queue limits, every grant it made, what became of each
demand and the whole result; and what the replay keeps of a request waiting for preemption
victims and of a live grant. Pure (no I/O)."""

from __future__ import annotations

from dataclasses import dataclass

from ..core.model import UNIT, Policy, Request
from .demand import Demand


@dataclass(frozen=True)
class QueueLimits:
    """The broker's queue limits (``BrokerLimits``); 0: no limit."""

    per_user: int = 50
    per_team: int = 500


@dataclass
class GrantRecord:
    """One grant of the replay (or of the record, for the fidelity comparison)."""

    request_id: str
    demand_id: str
    team: str
    pool: str
    kind: str
    units_milli: int
    node: str
    gpus: tuple[str, ...]
    granted_at: float
    released_at: float | None = None
    end: str | None = None
    borrowed: bool = False


@dataclass
class DemandOutcome:
    """What became of one demand in the replay."""

    demand_id: str
    team: str
    pool: str
    kind: str
    units_milli: int
    arrival: float
    work_s: float
    first_granted_at: float | None = None
    status: str = "waiting"  # served, refused, gave_up, lost_preempted, waiting
    preemptions: int = 0
    attempts: int = 0
    lost_s: float = 0.0  # seconds of work (x units) never served: refused, gave up, stopped
    utilization: float | None = None  # the demand's recorded mean use (0..1); None: unmeasured

    @property
    def wait_s(self) -> float | None:
        return None if self.first_granted_at is None else self.first_granted_at - self.arrival

    @property
    def lost_gpu_hours(self) -> float:
        return self.units_milli * self.lost_s / UNIT / 3600.0


@dataclass
class ReplayResult:
    """Every grant and every demand's outcome of one replay."""

    policy: Policy
    grants: list[GrantRecord]
    outcomes: list[DemandOutcome]
    decisions: int = 0


@dataclass
class _Pending:
    request: Request
    victims: set[str]
    deadline: float
    reason: str


@dataclass
class _Live:
    demand: Demand
    attempt: int
    work_left: float  # seconds of work this grant must still hold for
    record: GrantRecord
