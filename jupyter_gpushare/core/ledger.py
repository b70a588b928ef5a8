"""GPU-hours: use and idle time from grant intervals, per team, pool and period.

A grant held from ``start`` to ``end`` (``None`` while it lives) with ``u`` GPU units
costs ``u x hours`` of overlap with the period asked about. Periods are half-open
``[start, end)`` in POSIX seconds; :func:`month_bounds` gives calendar months in UTC.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from datetime import datetime, timezone

from .model import UNIT


@dataclass(frozen=True)
class Interval:
    """One grant's life, as the ledger keeps it."""

    grant_id: str
    team: str
    pool: str
    user: str
    units_milli: int
    start: float
    end: float | None = None


def month_bounds(year: int, month: int) -> tuple[float, float]:
    """POSIX seconds of the first instant of ``year-month`` and of the next month (UTC)."""
    start = datetime(year, month, 1, tzinfo=timezone.utc)
    nxt = datetime(year + (month == 12), month % 12 + 1, 1, tzinfo=timezone.utc)
    return start.timestamp(), nxt.timestamp()


def month_of(ts: float) -> tuple[int, int]:
    """The (year, month) in UTC that contains ``ts``."""
    moment = datetime.fromtimestamp(ts, tz=timezone.utc)
    return moment.year, moment.month


def overlap_hours(interval: Interval, start: float, end: float, now: float) -> float:
    """Hours of ``interval`` inside ``[start, end)``, counting a live grant up to ``now``."""
    stop = interval.end if interval.end is not None else now
    seconds = min(stop, end) - max(interval.start, start)
    return max(0.0, seconds) / 3600.0


def gpu_hours(
    intervals: Iterable[Interval],
    start: float,
    end: float,
    now: float,
    key: Callable[[Interval], Hashable] = lambda i: (i.team, i.pool),
) -> dict[Hashable, float]:
    """GPU-hours used in ``[start, end)`` grouped by ``key`` (default: team and pool)."""
    totals: dict[Hashable, float] = defaultdict(float)
    for interval in intervals:
        hours = overlap_hours(interval, start, end, now)
        if hours:
            totals[key(interval)] += hours * interval.units_milli / UNIT
    return dict(totals)


def capacity_hours(capacity_milli: int, start: float, end: float, now: float) -> float:
    """GPU-hours a pool of ``capacity_milli`` offers in ``[start, end)`` up to ``now``."""
    seconds = max(0.0, min(end, now) - start)
    return capacity_milli / UNIT * seconds / 3600.0
