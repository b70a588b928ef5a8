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
from .rows import GrantRow, MonthRows

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

    ref_duration = {p: (float(statistics.median(d)) if d else 1.0) for p, d in durations.items()}
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
        guaranteed = {f.team: f.guaranteed_units for f in figs.values() if f.pool == pool_name}
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
