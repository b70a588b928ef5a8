"""The demand a what-if replays: one record per server or job, as plain data (no I/O).

A :class:`Demand` is what a user asked for, independent of what the broker answered:

* ``requests``: the recorded attempts, in order (the first is the arrival). An interactive
  request refused and asked again by the same user for the same server within the retry
  window is one demand with retries (``offsets``: when each attempt arrived, counted from
  the first); a batch job preempted and requeued is one demand whose later attempts are
  the requeued requests;
* ``work_s``: how long a grant holds its GPUs: the recorded hold of the grant that ended
  the demand (a job that checkpoints: the sum of its attempts' holds, since each resumes);
  for a demand never granted in the record, an estimate (:func:`estimate_work`);
* ``patience_s``: a request cancelled while it waited gives up after that long;
* ``requeue_delays``: how long after each preemption the job was asked again.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from statistics import median

from ..core.model import Grant, Kind, Request

DEFAULT_WORK_S = 3600.0
"""Hold of a never-granted request when nothing granted resembles it (one hour)."""


@dataclass(frozen=True)
class Demand:
    """One server's or job's demand, replayed from its arrival (see the module's docstring)."""

    id: str
    requests: tuple[Request, ...]
    work_s: float
    offsets: tuple[float, ...] = ()  # arrival of attempt k after the first (interactive retries)
    patience_s: float | None = None
    requeue_delays: tuple[float, ...] = ()
    estimated: bool = False  # work_s is an estimate (never granted in the record)
    known_work_s: float = 0.0  # estimated: work it had at least (held before a preemption)
    placed: Grant | None = None  # its grant was live when the window began: starts on it
    enter_at: float | None = None  # made before the window, waiting: first decided then
    utilization: float | None = None  # measured mean use of its grants (0..1); None: no heartbeats

    @property
    def first(self) -> Request:
        return self.requests[0]

    @property
    def arrival(self) -> float:
        return self.first.created_at

    @property
    def enters(self) -> float:
        """When the replay first takes it: its arrival, or the window's start for one made
        before the window (waiting, or already granted: then at its grant)."""
        if self.placed is not None:
            return self.placed.granted_at
        return self.enter_at if self.enter_at is not None else self.arrival

    @property
    def team(self) -> str:
        return self.first.team

    @property
    def pool(self) -> str:
        return self.first.pool

    @property
    def units_milli(self) -> int:
        return self.first.gpu.units_milli

    def attempt(self, k: int, at: float) -> Request:
        """The request of attempt ``k`` arriving at ``at`` (the recorded one, or a copy of
        the last recorded one with a new id)."""
        if k < len(self.requests):
            req = self.requests[k]
            if k == 0 and self.enter_at is not None:
                return req  # it keeps its age (its place in the queue)
        else:
            req = dataclasses.replace(self.requests[-1], id=f"{self.id}~{k}")
        return req if req.created_at == at else dataclasses.replace(req, created_at=at)

    def requeue_delay(self, k: int, default: float) -> float:
        """Delay before attempt ``k + 1`` after attempt ``k`` was preempted."""
        return self.requeue_delays[k] if k < len(self.requeue_delays) else default

    def retry_at(self, k: int) -> float | None:
        """When attempt ``k`` (k >= 1) arrives after a refusal, or ``None`` if never."""
        if k < len(self.offsets):
            return self.arrival + self.offsets[k]
        return None


def _shape_key(req: Request) -> tuple[str, str, str, int]:
    return (req.kind.value, req.pool, req.profile, req.gpu.units_milli)


def estimate_work(demands: Sequence[Demand]) -> list[Demand]:
    """The demands with the work of each never-granted one estimated: the median hold of
    granted demands of the same kind, pool, profile and size; else of the same kind and
    pool; else :data:`DEFAULT_WORK_S`. A job whose last attempt was never granted after
    earlier ones were preempted gets that estimate on top of what it had held."""
    exact: dict[tuple[str, str, str, int], list[float]] = defaultdict(list)
    loose: dict[tuple[str, str], list[float]] = defaultdict(list)
    for d in demands:
        if not d.estimated:
            exact[_shape_key(d.first)].append(d.work_s)
            loose[(d.first.kind.value, d.pool)].append(d.work_s)
    out = []
    for d in demands:
        if d.estimated:
            holds = exact.get(_shape_key(d.first)) or loose.get((d.first.kind.value, d.pool))
            guess = median(holds) if holds else DEFAULT_WORK_S
            d = dataclasses.replace(d, work_s=d.known_work_s + guess)
        out.append(d)
    return out


def sort_demands(demands: Iterable[Demand]) -> list[Demand]:
    """Demands in arrival order (ties: by first request id), as the replay takes them."""
    return sorted(demands, key=lambda d: (d.enters, d.first.id))


def is_batch(demand: Demand) -> bool:
    return demand.first.kind is Kind.BATCH
