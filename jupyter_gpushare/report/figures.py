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
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from ..core.grant_end import EndKind, kind_of
from .rows import GrantRow, MonthRows, UsageRow

DAY_S = 86400.0
HIST_BINS = 10

NO_POWER_NOTE = (
    "The heartbeats of this month carried no power samples, so peak and average power per "
    "node cannot be given. Servers send the card's power (power_w) with each heartbeat "
    "from this version on."
)


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


# -- helpers ------------------------------------------------------------------------------


def overlap_h(begin: float, stop: float | None, start: float, end: float) -> float:
    """Hours of ``[begin, stop)`` inside ``[start, end)`` (``stop`` None: open to ``end``)."""
    last = end if stop is None else min(stop, end)
    return max(0.0, last - max(begin, start)) / 3600.0


def median(values: Sequence[float]) -> float | None:
    return float(statistics.median(values)) if values else None


def p95(values: Sequence[float]) -> float | None:
    """The 95th percentile by nearest rank (a value that occurred)."""
    if not values:
        return None
    ordered = sorted(values)
    return float(ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)])


def _ratio(a: float, b: float) -> float | None:
    return a / b if b else None


def _grant_use(grant: GrantRow, use: UsageRow | None) -> tuple[float, float | None]:
    """(used units, memory share held) of a measured grant; (0, None) without slices."""
    if use is None:
        return 0.0, None
    used = 0.0
    mem_held = 0.0
    mem_total = 0
    for sl in grant.slices:
        g = use.gpus.get(sl.gpu_uuid)
        mem_total += sl.memory_mib
        if g is None:
            continue
        used += min(sl.compute, max(0.0, g.mean_util_pct) / 100.0)
        mem_held += min(float(sl.memory_mib), max(0.0, g.mean_memory_mib))
    if not grant.slices:  # no slices recorded: the grant's units stand for its compute
        means = [g.mean_util_pct for g in use.gpus.values()]
        used = min(grant.units, sum(max(0.0, m) for m in means) / 100.0)
    return used, (mem_held / mem_total if mem_total else None)


def _lent_hours(
    grants: Iterable[GrantRow], guaranteed: dict[str, float], start: float, end: float
) -> dict[str, float]:
    """Lent GPU-hours per team of one pool (see the module docstring), by one sweep."""
    events: list[tuple[float, int, str, float, float]] = []
    for g in grants:
        begin = max(g.granted_at, start)
        stop = end if g.released_at is None else min(g.released_at, end)
        if stop <= begin:
            continue
        borrowed = g.units if g.borrowed else 0.0
        events.append((begin, 1, g.team, g.units, borrowed))
        events.append((stop, 0, g.team, -g.units, -borrowed))
    events.sort(key=lambda e: (e[0], e[1]))
    used: dict[str, float] = defaultdict(float)
    unused = {t: max(0.0, gu) for t, gu in guaranteed.items()}
    total_unused = sum(unused.values())
    borrowed_now = 0.0
    integral = 0.0  # running integral of f = min(1, B / U) over time (seconds)
    mark: dict[str, float] = dict.fromkeys(unused, 0.0)  # integral when u last changed
    lent: dict[str, float] = dict.fromkeys(unused, 0.0)
    last_t = start
    for t, _order, team, d_used, d_borrowed in events:
        if t > last_t:
            f = min(1.0, borrowed_now / total_unused) if total_unused > 1e-12 else 0.0
            integral += f * (t - last_t)
            last_t = t
        borrowed_now = max(0.0, borrowed_now + d_borrowed)
        used[team] += d_used
        if team in unused:
            lent[team] += unused[team] * (integral - mark[team])
            mark[team] = integral
            new = max(0.0, guaranteed[team] - used[team])
            total_unused += new - unused[team]
            unused[team] = new
    if end > last_t:
        f = min(1.0, borrowed_now / total_unused) if total_unused > 1e-12 else 0.0
        integral += f * (end - last_t)
    for team in unused:
        lent[team] += unused[team] * (integral - mark[team])
    return {t: v / 3600.0 for t, v in lent.items()}


def _split_days(begin: float, stop: float, start: float, days: int) -> Iterable[tuple[int, float]]:
    """(day index, hours) pieces of ``[begin, stop)`` (already clipped to the month)."""
    t = begin
    while t < stop:
        day = int((t - start) // DAY_S)
        day_end = min(stop, start + (day + 1) * DAY_S)
        if 0 <= day < days:
            yield day, (day_end - t) / 3600.0
        t = day_end


# -- the figures ----------------------------------------------------------------------------


def compute(rows: MonthRows, thresholds: Thresholds | None = None) -> MonthFigures:
    """Every figure of the month described by ``rows``."""
    th = thresholds or Thresholds()
    start, month_end = rows.start, rows.end
    # a month in progress stops at `now`: nothing after it is counted (no open server or
    # waiting request runs on to the month's end, no bar on a day still to come)
    end = month_end if rows.now is None else min(month_end, max(start, rows.now))
    partial = end < month_end
    hours = (end - start) / 3600.0
    days = max(1, math.ceil((end - start) / DAY_S))
    usage = {u.grant_id: u for u in rows.usage}

    figs: dict[tuple[str, str], TeamPoolFigures] = {}

    def fig(team: str, pool: str) -> TeamPoolFigures:
        f = figs.get((team, pool))
        if f is None:
            f = figs[(team, pool)] = TeamPoolFigures(team, pool)
        return f

    for q in rows.quotas:
        f = fig(q.team, q.pool)
        f.guaranteed_units = q.guaranteed
        f.borrow_limit_units = q.borrow_limit
        f.budget_gpu_hours = q.budget_gpu_hours
        f.guaranteed_gpu_hours = q.guaranteed * hours

    pools = {p.name: p for p in rows.pools}
    node_pool = {n: p.name for p in rows.pools for n in p.nodes}
    grants_by_pool: dict[str, list[GrantRow]] = defaultdict(list)
    durations: dict[str, list[float]] = defaultdict(list)
    daily: dict[str, list[float]] = {}
    hist = [0.0] * HIST_BINS
    grants_by_id: dict[str, GrantRow] = {}

    for g in rows.grants:
        h = overlap_h(g.granted_at, g.released_at, start, end)
        ended_in_month = g.released_at is not None and start <= g.released_at < end
        if g.granted_at >= end:
            continue  # granted after the figures stop (a partial month's `now`)
        if h <= 0 and not ended_in_month:
            continue
        grants_by_id[g.id] = g
        grants_by_pool[g.pool].append(g)
        f = fig(g.team, g.pool)
        gh = g.units * h
        f.granted_gpu_hours += gh
        if g.granted_at >= start and g.granted_at < end:
            f.grants += 1
        if g.borrowed:
            f.borrowed_gpu_hours += gh
        if ended_in_month:
            assert g.released_at is not None
            durations[g.pool].append((g.released_at - g.granted_at) / 3600.0)
            kind = kind_of(g.end_kind, g.release_reason)  # the grant's end record
            if kind is EndKind.PREEMPTED:
                why = "reclaimed" if g.borrowed else "priority"
                f.preemptions[why] = f.preemptions.get(why, 0) + 1
            elif kind is EndKind.CULLED:
                f.culled += 1
        use = usage.get(g.id)
        if use is not None and use.gpus and g.units > 0:
            used_units, mem_share = _grant_use(g, use)
            f.measured_gpu_hours += gh
            f.used_gpu_hours += used_units * h
            rel = used_units / g.units
            if gh > 0:
                hist[min(HIST_BINS - 1, int(rel * HIST_BINS))] += gh
            if (
                mem_share is not None
                and rel < th.data_bound_util
                and mem_share >= th.data_bound_memory
            ):
                f.data_bound_sessions += 1
                f.data_bound_gpu_hours += gh
        if h > 0:
            begin = max(g.granted_at, start)
            stop = end if g.released_at is None else min(g.released_at, end)
            per_day = daily.setdefault(g.team, [0.0] * days)
            for day, piece in _split_days(begin, stop, start, days):
                per_day[day] += piece * g.units

    ref_duration = {
        p: (float(statistics.median(d)) if d else 1.0) for p, d in durations.items()
    }
    waits: dict[tuple[str, str], list[float]] = defaultdict(list)
    pool_waits: dict[str, list[float]] = defaultdict(list)
    day_waits: list[list[float]] = [[] for _ in range(days)]
    for r in rows.requests:
        if r.created_at >= end:
            continue  # made after the figures stop
        made_in_month = start <= r.created_at < end
        f = fig(r.team, r.pool)
        granted_at = r.granted_at if r.granted_at is not None and r.granted_at < end else None
        wait_end: float | None
        if granted_at is not None:
            wait_end = granted_at
        elif r.status in ("queued", "preempting") or r.granted_at is not None:
            wait_end = None  # still waiting (at the month's end, or at `now`)
        else:
            wait_end = r.updated_at if r.updated_at < end else None
        f.queued_gpu_hours += r.units * overlap_h(r.created_at, wait_end, start, end)
        if not made_in_month:
            continue
        f.requests += 1
        if r.status == "refused":
            f.refusals[r.code or "refused"] = f.refusals.get(r.code or "refused", 0) + 1
            f.refused_gpu_hours += r.units * ref_duration.get(r.pool, 1.0)
        if granted_at is not None:
            wait = max(0.0, granted_at - r.created_at)
            waits[(r.team, r.pool)].append(wait)
            pool_waits[r.pool].append(wait)
            day = int((r.created_at - start) // DAY_S)
            if 0 <= day < days:
                day_waits[day].append(wait)

    for (team, pool), f in figs.items():
        w = waits.get((team, pool), [])
        f.queue_wait_median_s = median(w)
        f.queue_wait_p95_s = p95(w)
        if f.measured_gpu_hours > 0:
            f.idle_share = 1.0 - f.used_gpu_hours / f.measured_gpu_hours
        if f.budget_gpu_hours:
            f.budget_used_share = f.granted_gpu_hours / f.budget_gpu_hours

    for pool_name, pool_grants in grants_by_pool.items():
        guaranteed = {
            f.team: f.guaranteed_units for f in figs.values() if f.pool == pool_name
        }
        for team, lent in _lent_hours(pool_grants, guaranteed, start, end).items():
            figs[(team, pool_name)].lent_gpu_hours = lent

    pool_figs: list[PoolFigures] = []
    pool_names = sorted(set(pools) | {p for _, p in figs})
    for name in pool_names:
        prow = pools.get(name)
        cap = prow.capacity if prow else 0.0
        pf = PoolFigures(name, cap, prow.gpus if prow else 0, cap * hours)
        for f in (f for f in figs.values() if f.pool == name):
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
        pf.demand_gpu_hours = pf.granted_gpu_hours + pf.queued_gpu_hours + pf.refused_gpu_hours
        pf.demand_share = _ratio(pf.demand_gpu_hours, pf.capacity_gpu_hours)
        pf.occupancy = _ratio(pf.granted_gpu_hours, pf.capacity_gpu_hours)
        pf.utilisation = _ratio(pf.used_gpu_hours, pf.measured_gpu_hours)
        pf.idle_share = None if pf.utilisation is None else 1.0 - pf.utilisation
        pf.queue_wait_median_s = median(pool_waits.get(name, []))
        pf.queue_wait_p95_s = p95(pool_waits.get(name, []))
        pool_figs.append(pf)

    power = [
        NodePower(pw.node, node_pool.get(pw.node, ""), pw.hours, pw.peak_w, pw.average_w)
        for pw in sorted(rows.power, key=lambda p: p.node)
        if pw.hours > 0
    ]
    note = "" if power else NO_POWER_NOTE

    series = Series(
        days=days,
        gpu_hours_per_team_day=dict(sorted(daily.items())),
        util_histogram_gpu_hours=hist,
        wait_median_per_day_s=[median(w) for w in day_waits],
        wait_p95_per_day_s=[p95(w) for w in day_waits],
    )
    teams = sorted(figs.values(), key=lambda f: (f.pool, f.team))
    month_hours = (month_end - start) / 3600.0
    projection = _projection(teams, month_hours / hours) if partial and hours > 0 else None
    return MonthFigures(
        month=f"{rows.year:04d}-{rows.month:02d}",
        start=start,
        end=end,
        hours=hours,
        teams=teams,
        pools=pool_figs,
        power=power,
        power_note=note,
        series=series,
        thresholds=th,
        policy_version=rows.policy_version,
        until=end,
        partial=partial,
        month_hours=month_hours,
        projection=projection,
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

