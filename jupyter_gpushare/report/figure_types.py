"""The monthly report's figures as data: the thresholds they are computed with, and the
figures per team and pool, per pool, per node (power), per day (series), the projection of a
month in progress and the whole month. :mod:`.figures` defines and computes them."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Thresholds:
    """Where a session counts as data-bound (documented in ``docs/report.md``)."""

    data_bound_util: float = 0.3  # use below this share of the grant's compute ...
    data_bound_memory: float = 0.5  # ... while holding at least this share of its memory


@dataclass
class TeamPoolFigures:
    """The month of one team in one pool."""

    team: str
    pool: str
    guaranteed_units: float = 0.0
    borrow_limit_units: float = 0.0
    budget_gpu_hours: float | None = None
    guaranteed_gpu_hours: float = 0.0
    granted_gpu_hours: float = 0.0
    borrowed_gpu_hours: float = 0.0
    lent_gpu_hours: float = 0.0
    measured_gpu_hours: float = 0.0
    used_gpu_hours: float = 0.0
    idle_share: float | None = None
    queued_gpu_hours: float = 0.0
    refused_gpu_hours: float = 0.0
    requests: int = 0
    grants: int = 0
    queue_wait_median_s: float | None = None
    queue_wait_p95_s: float | None = None
    refusals: dict[str, int] = field(default_factory=dict)
    preemptions: dict[str, int] = field(default_factory=dict)
    culled: int = 0
    data_bound_sessions: int = 0
    data_bound_gpu_hours: float = 0.0
    budget_used_share: float | None = None

    @property
    def unmet_gpu_hours(self) -> float:
        return self.queued_gpu_hours + self.refused_gpu_hours


@dataclass
class PoolFigures:
    """The month of one pool, all teams together."""

    pool: str
    capacity_units: float
    gpus: int
    capacity_gpu_hours: float
    guaranteed_gpu_hours: float = 0.0
    granted_gpu_hours: float = 0.0
    borrowed_gpu_hours: float = 0.0
    measured_gpu_hours: float = 0.0
    used_gpu_hours: float = 0.0
    queued_gpu_hours: float = 0.0
    refused_gpu_hours: float = 0.0
    demand_gpu_hours: float = 0.0
    demand_share: float | None = None  # demand / capacity
    occupancy: float | None = None  # granted / capacity
    utilisation: float | None = None  # used / measured
    idle_share: float | None = None
    queue_wait_median_s: float | None = None
    queue_wait_p95_s: float | None = None
    refusals: dict[str, int] = field(default_factory=dict)
    preemptions: dict[str, int] = field(default_factory=dict)
    culled: int = 0
    data_bound_sessions: int = 0
    data_bound_gpu_hours: float = 0.0

    @property
    def unmet_gpu_hours(self) -> float:
        return self.queued_gpu_hours + self.refused_gpu_hours


@dataclass
class NodePower:
    """Power of one node's GPUs over the month's hours that had samples."""

    node: str
    pool: str
    hours: int
    peak_w: float
    average_w: float

    @property
    def peak_to_average(self) -> float | None:
        return self.peak_w / self.average_w if self.average_w else None


@dataclass
class Series:
    """What the plots draw: per day and the utilisation histogram."""

    days: int
    gpu_hours_per_team_day: dict[str, list[float]]
    util_histogram_gpu_hours: list[float]  # HIST_BINS bins of use / share, by GPU-hours
    wait_median_per_day_s: list[float | None]
    wait_p95_per_day_s: list[float | None]


@dataclass
class Projection:
    """A linear projection of a partial month to its end: NOT a measurement. Each figure
    is the elapsed figure x (hours of the month / hours elapsed)."""

    factor: float  # month hours / elapsed hours
    granted_gpu_hours: dict[str, float] = field(default_factory=dict)  # "team/pool" -> GPU-h
    budget_share: dict[str, float] = field(default_factory=dict)  # "team/pool" -> share


@dataclass
class MonthFigures:
    """All figures of one month (the recommendation is added by :mod:`.rule`).

    For a month in progress (``partial``) every figure covers ``[start, until)`` only:
    ``hours`` are the elapsed hours (``month_hours`` the whole month's), guarantees and
    capacity count those hours, budgets are the share used so far; ``projection`` is the
    separate, labelled extrapolation."""

    month: str
    start: float
    end: float
    hours: float
    teams: list[TeamPoolFigures]
    pools: list[PoolFigures]
    power: list[NodePower]
    power_note: str
    series: Series
    thresholds: Thresholds
    policy_version: str = ""
    until: float = 0.0  # the figures stop here: ``end``, or the report's ``now`` if earlier
    partial: bool = False
    month_hours: float = 0.0
    projection: Projection | None = None

    @property
    def elapsed_share(self) -> float:
        """The share of the month the figures cover (1.0 for a finished month)."""
        return self.hours / self.month_hours if self.month_hours else 1.0
