"""The monthly report's figures, computed from plain rows (standard library only, no I/O).

Every figure is defined here once; ``docs/report.md`` explains them for admins. ``H`` is
the number of hours in the month and *overlap* the hours of an interval inside it.

Per team and pool
  guaranteed GPU-hours  guaranteed units x H
  granted GPU-hours     sum over grants of units x overlap
  borrowed GPU-hours    the same over grants admitted as borrowed
  lent GPU-hours        at each instant a team's unused guarantee ``u = max(0, G - in use)``
                        is lent in proportion to everyone's unused guarantee:
                        ``u x min(1, B / U)`` with ``B`` the pool's borrowed units and ``U``
                        the sum of ``u`` over teams; integrated over the month
  measured GPU-hours    granted GPU-hours of grants that sent heartbeats
  used GPU-hours        over measured grants: overlap x sum over its GPUs of
                        ``min(share of the GPU's compute, mean card utilisation / 100)``
  idle share            1 - used / measured
  queued GPU-hours      units x overlap of each request's wait ``[created, granted)``
                        (still waiting: to its last change or the month's end)
  refused GPU-hours     units of each refused request x the median duration of the
                        pool's grants that ended in the month (1 h when none did)
  queue wait            ``granted_at - created_at`` of requests made in the month that got
                        a grant: median, and p95 by nearest rank
  refusals              refused requests made in the month, by code
  preemptions           grants whose end record (:mod:`jupyter_gpushare.core.grant_end`)
                        is ``preempted``, ended in the month: ``reclaimed`` (the grant
                        was borrowed) or ``priority`` (it was not)
  culled                grants whose end record is ``culled``, ended in the month
  data-bound sessions   measured grants whose use is below ``data_bound_util`` of their share
                        while they held at least ``data_bound_memory`` of their memory
  budget used           granted GPU-hours / the team's monthly budget

Per pool: capacity GPU-hours (GPU units x H), the sums of the above, demand (granted +
queued + refused GPU-hours), occupancy (granted / capacity) and utilisation (used /
measured). Per node: the peak (highest sample of the node's total power) and the average
(mean over the hours that had samples of each hour's mean).

A month in progress (``MonthRows.now`` before its end) stops at ``now``: ``H`` is the hours
elapsed, nothing after ``now`` counts (a live grant or a waiting request runs to ``now``),
the series has the days begun only, and :class:`Projection` holds the linear extrapolation
apart.

The figures' types are in :mod:`.figure_types` and the arithmetic under them in
:mod:`.figure_math`; here they are computed.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from dataclasses import dataclass, field

from ..core.grant_end import EndKind, kind_of
from .figure_math import (
    DAY_S,
    _grant_use,
    _lent_hours,
    _ratio,
    _split_days,
    median,
    overlap_h,
    p95,
)
from .figure_types import (
    MonthFigures,
    NodePower,
    PoolFigures,
    Projection,
    Series,
    TeamPoolFigures,
    Thresholds,
)
from .rows import GrantRow, MonthRows, RequestRow, UsageRow

__all__ = [
    "DAY_S",
    "HIST_BINS",
    "NO_POWER_NOTE",
    "MonthFigures",
    "NodePower",
    "PoolFigures",
    "Projection",
    "Series",
    "TeamPoolFigures",
    "Thresholds",
    "compute",
    "median",
    "overlap_h",
    "p95",
]

HIST_BINS = 10

NO_POWER_NOTE = (
    "The heartbeats of this month carried no power samples, so peak and average power per "
    "node cannot be given. Servers send the card's power (power_w) with each heartbeat "
    "from this version on."
)


def compute(rows: MonthRows, thresholds: Thresholds | None = None) -> MonthFigures:
    """Every figure of the month described by ``rows``."""
    th = thresholds or Thresholds()
    span = _span(rows)
    table = _TeamPoolTable()
    _add_quotas(table, rows, span)
    tally = _add_grants(table, rows, span, th)
    waits = _add_requests(table, rows, span, _reference_durations(tally.durations))
    _finish_team_figures(table, waits)
    _add_lent(table, tally.by_pool, span)
    power = _node_power(rows)
    teams = sorted(table.values(), key=lambda f: (f.pool, f.team))
    month_hours = (span.month_end - span.start) / 3600.0
    partial = span.end < span.month_end
    projection = (
        _projection(teams, month_hours / span.hours) if partial and span.hours > 0 else None
    )
    return MonthFigures(
        month=f"{rows.year:04d}-{rows.month:02d}",
        start=span.start,
        end=span.end,
        hours=span.hours,
        teams=teams,
        pools=_pool_figures(rows, table, span, waits),
        power=power,
        power_note="" if power else NO_POWER_NOTE,
        series=_series(span, tally, waits),
        thresholds=th,
        policy_version=rows.policy_version,
        until=span.end,
        partial=partial,
        month_hours=month_hours,
        projection=projection,
    )


# -- the month's span ------------------------------------------------------------------------


@dataclass(frozen=True)
class _Span:
    """What the figures cover: ``[start, end)``, ``hours`` long, on ``days`` days begun."""

    start: float
    end: float  # the month's end, or the report's `now` in a month in progress
    month_end: float
    hours: float
    days: int


def _span(rows: MonthRows) -> _Span:
    """A month in progress stops at `now`: nothing after it is counted (no open server or
    waiting request runs on to the month's end, no bar on a day still to come)."""
    start, month_end = rows.start, rows.end
    end = month_end if rows.now is None else min(month_end, max(start, rows.now))
    days = max(1, math.ceil((end - start) / DAY_S))
    return _Span(start, end, month_end, (end - start) / 3600.0, days)


class _TeamPoolTable:
    """The figures of each team in each pool, made on first mention (in that order)."""

    def __init__(self) -> None:
        self._figures: dict[tuple[str, str], TeamPoolFigures] = {}

    def of(self, team: str, pool: str) -> TeamPoolFigures:
        f = self._figures.get((team, pool))
        if f is None:
            f = self._figures[(team, pool)] = TeamPoolFigures(team, pool)
        return f

    def values(self) -> list[TeamPoolFigures]:
        return list(self._figures.values())

    def in_pool(self, pool: str) -> list[TeamPoolFigures]:
        return [f for f in self._figures.values() if f.pool == pool]


# -- per team and pool: quotas ---------------------------------------------------------------


def _add_quotas(table: _TeamPoolTable, rows: MonthRows, span: _Span) -> None:
    """Guarantees, borrow limits and budgets from the policy; guaranteed GPU-hours."""
    for q in rows.quotas:
        f = table.of(q.team, q.pool)
        f.guaranteed_units = q.guaranteed
        f.borrow_limit_units = q.borrow_limit
        f.budget_gpu_hours = q.budget_gpu_hours
        f.guaranteed_gpu_hours = q.guaranteed * span.hours


# -- per team and pool: grants ---------------------------------------------------------------


@dataclass
class _GrantTally:
    """What the grants leave beside the team figures: for lending, refusals and plots."""

    days: int
    by_pool: dict[str, list[GrantRow]] = field(default_factory=lambda: defaultdict(list))
    durations: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    daily: dict[str, list[float]] = field(default_factory=dict)  # team -> GPU-hours a day
    hist: list[float] = field(default_factory=lambda: [0.0] * HIST_BINS)


def _add_grants(table: _TeamPoolTable, rows: MonthRows, span: _Span, th: Thresholds) -> _GrantTally:
    """Granted, borrowed, measured and used GPU-hours, ends and data-bound sessions of the
    grants that overlap the span or ended in it."""
    usage = {u.grant_id: u for u in rows.usage}
    tally = _GrantTally(span.days)
    for g in rows.grants:
        h = overlap_h(g.granted_at, g.released_at, span.start, span.end)
        ended_in_month = g.released_at is not None and span.start <= g.released_at < span.end
        if g.granted_at >= span.end:
            continue  # granted after the figures stop (a partial month's `now`)
        if h <= 0 and not ended_in_month:
            continue
        tally.by_pool[g.pool].append(g)
        f = table.of(g.team, g.pool)
        _count_granted(f, g, h, span)
        if ended_in_month:
            _count_end(f, g, tally.durations)
        use = usage.get(g.id)
        if use is not None and use.gpus and g.units > 0:
            _count_use(f, g, use, h, tally.hist, th)
        if h > 0:
            _count_daily(tally, g, span)
    return tally


def _count_granted(f: TeamPoolFigures, g: GrantRow, h: float, span: _Span) -> None:
    gh = g.units * h
    f.granted_gpu_hours += gh
    if g.granted_at >= span.start and g.granted_at < span.end:
        f.grants += 1
    if g.borrowed:
        f.borrowed_gpu_hours += gh


def _count_end(f: TeamPoolFigures, g: GrantRow, durations: dict[str, list[float]]) -> None:
    """A grant that ended in the month: its duration, and a preemption or cull by its end
    record."""
    assert g.released_at is not None
    durations[g.pool].append((g.released_at - g.granted_at) / 3600.0)
    kind = kind_of(g.end_kind, g.release_reason)  # the grant's end record
    if kind is EndKind.PREEMPTED:
        why = "reclaimed" if g.borrowed else "priority"
        f.preemptions[why] = f.preemptions.get(why, 0) + 1
    elif kind is EndKind.CULLED:
        f.culled += 1


def _count_use(
    f: TeamPoolFigures, g: GrantRow, use: UsageRow, h: float, hist: list[float], th: Thresholds
) -> None:
    """A measured grant: measured and used GPU-hours, the utilisation histogram, and
    whether it was data-bound."""
    gh = g.units * h
    used_units, mem_share = _grant_use(g, use)
    f.measured_gpu_hours += gh
    f.used_gpu_hours += used_units * h
    rel = used_units / g.units
    if gh > 0:
        hist[min(HIST_BINS - 1, int(rel * HIST_BINS))] += gh
    if mem_share is not None and rel < th.data_bound_util and mem_share >= th.data_bound_memory:
        f.data_bound_sessions += 1
        f.data_bound_gpu_hours += gh


def _count_daily(tally: _GrantTally, g: GrantRow, span: _Span) -> None:
    """The grant's GPU-hours on each day of the span it overlaps."""
    begin = max(g.granted_at, span.start)
    stop = span.end if g.released_at is None else min(g.released_at, span.end)
    per_day = tally.daily.setdefault(g.team, [0.0] * span.days)
    for day, piece in _split_days(begin, stop, span.start, span.days):
        per_day[day] += piece * g.units


def _reference_durations(durations: dict[str, list[float]]) -> dict[str, float]:
    """Per pool: the median hours of the grants that ended in the month (what a refused
    request is counted as)."""
    return {p: (float(statistics.median(d)) if d else 1.0) for p, d in durations.items()}


# -- per team and pool: requests -------------------------------------------------------------


@dataclass
class _Waits:
    """Queue waits of the requests made in the month that got a grant, three ways."""

    days: int
    by_team_pool: dict[tuple[str, str], list[float]] = field(
        default_factory=lambda: defaultdict(list)
    )
    by_pool: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    by_day: list[list[float]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.by_day = [[] for _ in range(self.days)]

    def add(self, r: RequestRow, wait: float, span: _Span) -> None:
        self.by_team_pool[(r.team, r.pool)].append(wait)
        self.by_pool[r.pool].append(wait)
        day = int((r.created_at - span.start) // DAY_S)
        if 0 <= day < self.days:
            self.by_day[day].append(wait)


def _add_requests(
    table: _TeamPoolTable, rows: MonthRows, span: _Span, ref_duration: dict[str, float]
) -> _Waits:
    """Queued GPU-hours of every request that waited in the span; requests, refusals,
    refused GPU-hours and queue waits of those made in it."""
    waits = _Waits(span.days)
    for r in rows.requests:
        if r.created_at >= span.end:
            continue  # made after the figures stop
        f = table.of(r.team, r.pool)
        granted_at = r.granted_at if r.granted_at is not None and r.granted_at < span.end else None
        wait_end = _wait_end(r, granted_at, span)
        f.queued_gpu_hours += r.units * overlap_h(r.created_at, wait_end, span.start, span.end)
        if not span.start <= r.created_at < span.end:
            continue  # made before the month
        f.requests += 1
        if r.status == "refused":
            code = r.code or "refused"
            f.refusals[code] = f.refusals.get(code, 0) + 1
            f.refused_gpu_hours += r.units * ref_duration.get(r.pool, 1.0)
        if granted_at is not None:
            waits.add(r, max(0.0, granted_at - r.created_at), span)
    return waits


def _wait_end(r: RequestRow, granted_at: float | None, span: _Span) -> float | None:
    """When the request stopped waiting; ``None``: it still waits (at the month's end, or
    at `now`)."""
    if granted_at is not None:
        return granted_at
    if r.status in ("queued", "preempting") or r.granted_at is not None:
        return None
    return r.updated_at if r.updated_at < span.end else None


def _finish_team_figures(table: _TeamPoolTable, waits: _Waits) -> None:
    """The figures made of the others: queue waits, idle share, budget used."""
    for f in table.values():
        w = waits.by_team_pool.get((f.team, f.pool), [])
        f.queue_wait_median_s = median(w)
        f.queue_wait_p95_s = p95(w)
        if f.measured_gpu_hours > 0:
            f.idle_share = 1.0 - f.used_gpu_hours / f.measured_gpu_hours
        if f.budget_gpu_hours:
            f.budget_used_share = f.granted_gpu_hours / f.budget_gpu_hours


def _add_lent(table: _TeamPoolTable, by_pool: dict[str, list[GrantRow]], span: _Span) -> None:
    """Lent GPU-hours of each team, pool by pool (:func:`.figure_math._lent_hours`)."""
    for pool_name, pool_grants in by_pool.items():
        guaranteed = {f.team: f.guaranteed_units for f in table.in_pool(pool_name)}
        for team, lent in _lent_hours(pool_grants, guaranteed, span.start, span.end).items():
            table.of(team, pool_name).lent_gpu_hours = lent


# -- per pool --------------------------------------------------------------------------------


def _pool_figures(
    rows: MonthRows, table: _TeamPoolTable, span: _Span, waits: _Waits
) -> list[PoolFigures]:
    """Every pool of the policy or of the figures, by name: its capacity, the sums of its
    teams' figures, and the ratios of those."""
    pools = {p.name: p for p in rows.pools}
    out: list[PoolFigures] = []
    for name in sorted(set(pools) | {f.pool for f in table.values()}):
        prow = pools.get(name)
        cap = prow.capacity if prow else 0.0
        pf = PoolFigures(name, cap, prow.gpus if prow else 0, cap * span.hours)
        for f in table.in_pool(name):
            _add_team_to_pool(pf, f)
        _pool_ratios(pf)
        pf.queue_wait_median_s = median(waits.by_pool.get(name, []))
        pf.queue_wait_p95_s = p95(waits.by_pool.get(name, []))
        out.append(pf)
    return out


def _add_team_to_pool(pf: PoolFigures, f: TeamPoolFigures) -> None:
    pf.guaranteed_gpu_hours += f.guaranteed_gpu_hours
    pf.granted_gpu_hours += f.granted_gpu_hours
    pf.borrowed_gpu_hours += f.borrowed_gpu_hours
    pf.measured_gpu_hours += f.measured_gpu_hours
    pf.used_gpu_hours += f.used_gpu_hours
    pf.queued_gpu_hours += f.queued_gpu_hours
    pf.refused_gpu_hours += f.refused_gpu_hours
    pf.culled += f.culled
    pf.data_bound_sessions += f.data_bound_sessions
    pf.data_bound_gpu_hours += f.data_bound_gpu_hours
    for k, v in f.refusals.items():
        pf.refusals[k] = pf.refusals.get(k, 0) + v
    for k, v in f.preemptions.items():
        pf.preemptions[k] = pf.preemptions.get(k, 0) + v


def _pool_ratios(pf: PoolFigures) -> None:
    """Demand, its share of capacity, occupancy, utilisation and idle share."""
    pf.demand_gpu_hours = pf.granted_gpu_hours + pf.queued_gpu_hours + pf.refused_gpu_hours
    pf.demand_share = _ratio(pf.demand_gpu_hours, pf.capacity_gpu_hours)
    pf.occupancy = _ratio(pf.granted_gpu_hours, pf.capacity_gpu_hours)
    pf.utilisation = _ratio(pf.used_gpu_hours, pf.measured_gpu_hours)
    pf.idle_share = None if pf.utilisation is None else 1.0 - pf.utilisation


# -- per node and per day --------------------------------------------------------------------


def _node_power(rows: MonthRows) -> list[NodePower]:
    """Peak and average power of each node that had samples, by name, with its pool."""
    node_pool = {n: p.name for p in rows.pools for n in p.nodes}
    return [
        NodePower(pw.node, node_pool.get(pw.node, ""), pw.hours, pw.peak_w, pw.average_w)
        for pw in sorted(rows.power, key=lambda p: p.node)
        if pw.hours > 0
    ]


def _series(span: _Span, tally: _GrantTally, waits: _Waits) -> Series:
    """What the plots draw: GPU-hours per team and day, the utilisation histogram, and the
    queue wait per day."""
    return Series(
        days=span.days,
        gpu_hours_per_team_day=dict(sorted(tally.daily.items())),
        util_histogram_gpu_hours=tally.hist,
        wait_median_per_day_s=[median(w) for w in waits.by_day],
        wait_p95_per_day_s=[p95(w) for w in waits.by_day],
    )


def _projection(teams: list[TeamPoolFigures], factor: float) -> Projection:
    """Granted GPU-hours and budget shares of a partial month, extrapolated linearly."""
    proj = Projection(factor)
    for f in teams:
        key = f"{f.team}/{f.pool}"
        proj.granted_gpu_hours[key] = f.granted_gpu_hours * factor
        if f.budget_gpu_hours:
            proj.budget_share[key] = f.granted_gpu_hours * factor / f.budget_gpu_hours
    return proj
