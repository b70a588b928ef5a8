"""Plain input rows of the monthly report (what the database adapter hands the figures).

Everything is a dataclass of numbers and strings: the figures
(:mod:`.figures`) and the recommendation rule (:mod:`.rule`) never see SQLAlchemy,
the policy loader or the clock, so they are tested on hand-made rows.
Times are POSIX seconds (UTC); GPU units are floats (1.0 = one whole GPU).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class SliceRow:
    """The share of one GPU a grant holds."""

    gpu_uuid: str
    memory_mib: int
    compute: float  # 1.0 = the whole GPU's compute


@dataclass(slots=True)
class GrantRow:
    """One grant of the ledger: the interval ``[granted_at, released_at)`` and its share."""

    id: str
    request_id: str
    user: str
    team: str
    pool: str
    node: str
    units: float
    borrowed: bool
    granted_at: float
    released_at: float | None = None
    release_reason: str = ""
    slices: tuple[SliceRow, ...] = ()
    kind: str = "interactive"
    end_kind: str = ""  # how it ended (core.grant_end.EndKind value); "" while it lives
    ended_by_team: str = ""  # preempted: the team it was taken for


@dataclass(slots=True)
class RequestRow:
    """One request: when it was made, what it asked, how it ended."""

    id: str
    user: str
    team: str
    pool: str
    units: float
    status: str  # granted | queued | preempting | refused | cancelled | released
    code: str
    created_at: float
    updated_at: float
    granted_at: float | None = None  # of its grant, if it got one


@dataclass(slots=True)
class GPUUse:
    """Heartbeat aggregate of one grant on one GPU over the month."""

    samples: int
    mean_util_pct: float  # mean of the samples' utilisation of the card (0..100)
    mean_memory_mib: float  # mean memory the grant's processes held on the card


@dataclass(frozen=True)
class UsageRow:
    """Measured use of one grant: one :class:`GPUUse` per GPU uuid it reported."""

    grant_id: str
    gpus: dict[str, GPUUse] = field(default_factory=dict)


@dataclass(frozen=True)
class PowerRow:
    """Power of one node over the month: the hours with samples of the node's total power,
    the mean of those hours' means, and the highest sample."""

    node: str
    hours: int
    average_w: float
    peak_w: float


@dataclass(frozen=True)
class QuotaRow:
    """A team's quota in a pool, from the policy."""

    team: str
    pool: str
    guaranteed: float
    borrow_limit: float
    budget_gpu_hours: float | None = None


@dataclass(frozen=True)
class PoolRow:
    """A pool's capacity from the policy's inventory."""

    name: str
    capacity: float  # GPU units
    gpus: int
    nodes: tuple[str, ...] = ()


@dataclass(frozen=True)
class MonthRows:
    """Everything the figures of one month need."""

    year: int
    month: int
    start: float
    end: float
    pools: tuple[PoolRow, ...]
    quotas: tuple[QuotaRow, ...]
    grants: tuple[GrantRow, ...] = ()
    requests: tuple[RequestRow, ...] = ()
    usage: tuple[UsageRow, ...] = ()
    power: tuple[PowerRow, ...] = ()
    policy_version: str = ""
    now: float | None = None  # when the report was made; before ``end``: a partial month
