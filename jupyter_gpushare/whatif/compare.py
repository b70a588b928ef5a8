"""Figures of a replay per team and pool, and two replays side by side (pure)."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from ..core.model import Policy
from .fidelity import gpu_hours
from .replay import DemandOutcome, GrantRecord, ReplayResult

DEMAND_MODEL = (
    "A granted server or job holds its GPUs as long as it did in the record; one that waits "
    "starts later and holds as long; an interactive request refused is asked again at the "
    "recorded retry offsets, else its work is lost demand; a preempted job is requeued after "
    "the recorded delay and resumes from its checkpoint (or restarts without one); a "
    "preempted server's remaining session is lost; a request the record shows cancelled "
    "gives up after the wait it had."
)


def percentile(values: Sequence[float], p: float) -> float | None:
    """Nearest-rank percentile (``p`` in 0..100); ``None`` for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[rank - 1]


def _in_window(o: DemandOutcome, start: float, end: float) -> bool:
    return start <= o.arrival < end


def measured_hours(result: ReplayResult, start: float, end: float) -> dict[tuple[str, str],
                                                                          tuple[float, float]]:
    """Per (team, pool): GPU-hours granted to measured demands, and their measured use
    (granted GPU-hours in the replay x the demand's recorded mean utilisation)."""
    util = {o.demand_id: o.utilization for o in result.outcomes}
    out: dict[tuple[str, str], tuple[float, float]] = {}
    for g in result.grants:
        u = util.get(g.demand_id)
        if u is None:
            continue
        h = sum(gpu_hours([g], start, end, "team").values())
        granted, used = out.get((g.team, g.pool), (0.0, 0.0))
        out[(g.team, g.pool)] = (granted + h, used + h * u)
    return out


def _wanted_until(o: DemandOutcome, last_release: float | None, end: float) -> float:
    """Until when a demand wanted its GPUs: its last release, or its first grant (else its
    arrival) plus its work, whichever is later; a demand never served wants to the end."""
    if o.status == "waiting":
        return end
    began = o.first_granted_at if o.first_granted_at is not None else o.arrival
    return max(last_release if last_release is not None else began, began + o.work_s)


def _covered_seconds(events: list[tuple[float, int, int]], cap: int, start: float,
                     end: float) -> tuple[float, float]:
    """Sweep ``(time, wanted delta, granted delta)`` events: the integrals over
    ``[start, end)`` of min(wanted, cap) and of min(granted, cap, wanted), in milli-seconds."""
    asked = met = 0.0
    wanted = granted = 0
    prev = start
    for t, dw, dg in sorted(events):
        t = min(max(t, start), end)
        if t > prev:
            asked += min(wanted, cap) * (t - prev)
            met += min(granted, cap, wanted) * (t - prev)
            prev = t
        wanted += dw
        granted += dg
    if end > prev:
        asked += min(wanted, cap) * (end - prev)
        met += min(granted, cap, wanted) * (end - prev)
    return asked, met


def guarantee_seconds(result: ReplayResult, start: float,
                      end: float) -> dict[tuple[str, str], tuple[float, float]]:
    """Per (team, pool) with a guarantee: the integrals of min(wanted, guarantee) (asked
    within the guarantee) and of min(granted, guarantee) (met), by an event sweep (pure)."""
    last: dict[str, float] = {}
    events: dict[tuple[str, str], list[tuple[float, int, int]]] = defaultdict(list)
    for g in result.grants:
        released = g.released_at if g.released_at is not None else end
        last[g.demand_id] = max(last.get(g.demand_id, released), released)
        events[(g.team, g.pool)] += [(g.granted_at, 0, g.units_milli),
                                     (released, 0, -g.units_milli)]
    for o in result.outcomes:
        until = _wanted_until(o, last.get(o.demand_id), end)
        if until > o.arrival:
            events[(o.team, o.pool)] += [(o.arrival, o.units_milli, 0),
                                         (until, -o.units_milli, 0)]
    out: dict[tuple[str, str], tuple[float, float]] = {}
    for (team, pool), evs in events.items():
        t = result.policy.team(team)
        quota = t.quota(pool) if t is not None else None
        if quota is not None and quota.guaranteed_milli > 0:
            out[(team, pool)] = _covered_seconds(evs, quota.guaranteed_milli, start, end)
    return out


def _ratio(asked: float, met: float) -> float | None:
    return round(met / asked, 4) if asked > 0 else None


def guarantee_met(result: ReplayResult, start: float, end: float) -> dict[tuple[str, str],
                                                                         float | None]:
    """Per (team, pool) with a guarantee: of the GPU-hours it asked for within its guarantee,
    the share granted at that moment; ``None`` when it asked for none."""
    return {k: _ratio(a, m) for k, (a, m) in guarantee_seconds(result, start, end).items()}


def pool_guarantee_met(result: ReplayResult, start: float, end: float) -> dict[str,
                                                                              float | None]:
    """Per pool: the same share, all its teams' guarantees together."""
    sums: dict[str, tuple[float, float]] = {}
    for (_, pool), (a, m) in guarantee_seconds(result, start, end).items():
        sa, sm = sums.get(pool, (0.0, 0.0))
        sums[pool] = (sa + a, sm + m)
    return {p: _ratio(a, m) for p, (a, m) in sums.items()}


def team_pool_figures(result: ReplayResult, start: float, end: float) -> dict[tuple[str, str],
                                                                             dict[str, Any]]:
    """Per (team, pool): demands, waits, refusals, lost, granted, measured and idle
    GPU-hours, preemptions, and the share of the guarantee met on demand."""
    groups: dict[tuple[str, str], list[DemandOutcome]] = defaultdict(list)
    for o in result.outcomes:
        if _in_window(o, start, end):
            groups[(o.team, o.pool)].append(o)
    hours: dict[tuple[str, str], float] = defaultdict(float)
    for g in result.grants:
        for team, h in gpu_hours([g], start, end, "team").items():
            hours[(team, g.pool)] += h
    measured = measured_hours(result, start, end)
    met = guarantee_met(result, start, end)
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for key in sorted(set(groups) | set(hours)):
        items = groups.get(key, [])
        waits = [o.wait_s for o in items if o.wait_s is not None]
        out[key] = {
            "demands": len(items),
            "wait_p50_s": percentile(waits, 50),
            "wait_p95_s": percentile(waits, 95),
            "refused": sum(1 for o in items if o.status == "refused"),
            "gave_up": sum(1 for o in items if o.status == "gave_up"),
            "never_served": sum(1 for o in items if o.status == "waiting"),
            "lost_gpu_hours": round(sum(o.lost_gpu_hours for o in items
                                        if o.status != "served"), 3),
            "preemptions": sum(o.preemptions for o in items),
            "gpu_hours": round(hours.get(key, 0.0), 3),
            **_use_figures(measured.get(key)),
            "unmeasured_demands": sum(1 for o in items if o.utilization is None),
            "guarantee_met_share": met.get(key),
        }
    return out


def _use_figures(measured: tuple[float, float] | None) -> dict[str, float | None]:
    """Measured GPU-hours and idle (granted minus measured, where measured is known)."""
    if measured is None:
        return {"measured_gpu_hours": None, "idle_gpu_hours": None}
    granted, used = measured
    return {"measured_gpu_hours": round(used, 3), "idle_gpu_hours": round(granted - used, 3)}


def pool_figures(policy: Policy, grants: Sequence[GrantRecord], start: float,
                 end: float, outcomes: Sequence[DemandOutcome] = ()) -> dict[str, dict[str, Any]]:
    """Per pool: capacity, granted, unallocated, measured and idle GPU-hours in the window
    (idle: granted minus measured where measured is known, plus unallocated)."""
    span_h = (end - start) / 3600.0
    granted = gpu_hours(grants, start, end, "pool")
    util = {o.demand_id: o.utilization for o in outcomes}
    used: dict[str, float] = defaultdict(float)
    unused: dict[str, float] = defaultdict(float)
    for g in grants:
        u = util.get(g.demand_id)
        if u is not None:
            h = sum(gpu_hours([g], start, end, "pool").values())
            used[g.pool] += h * u
            unused[g.pool] += h * (1 - u)
    out: dict[str, dict[str, Any]] = {}
    for pool in policy.pools:
        units = sum(g.units_milli for n in policy.nodes_in(pool.name) for g in n.gpus) / 1000
        cap = units * span_h
        got = granted.get(pool.name, 0.0)
        out[pool.name] = {"gpus": units, "capacity_gpu_hours": round(cap, 3),
                          "gpu_hours": round(got, 3),
                          "unallocated_gpu_hours": round(max(0.0, cap - got), 3),
                          "measured_gpu_hours": (round(used[pool.name], 3)
                                                 if pool.name in used else None),
                          "idle_gpu_hours": round(unused.get(pool.name, 0.0)
                                                  + max(0.0, cap - got), 3),
                          "unmeasured_demands": sum(1 for o in outcomes if o.pool == pool.name
                                                    and start <= o.arrival < end
                                                    and o.utilization is None)}
    return out


def side_by_side(current: ReplayResult, proposal: ReplayResult, start: float, end: float,
                 *, cards_added: int = 0, labels: tuple[str, str] = ("current", "proposal"),
                 meta: dict[str, Any] | None = None) -> dict[str, Any]:
    """The document the renderers print: both replays per team and pool, and per pool."""
    a = team_pool_figures(current, start, end)
    b = team_pool_figures(proposal, start, end)
    pa = pool_figures(current.policy, current.grants, start, end, current.outcomes)
    pb = pool_figures(proposal.policy, proposal.grants, start, end, proposal.outcomes)
    for figures, result in ((pa, current), (pb, proposal)):
        met = pool_guarantee_met(result, start, end)
        for pool, row in figures.items():
            row["guarantee_met_share"] = met.get(pool)
    teams = [{"team": t, "pool": p, labels[0]: a.get((t, p)), labels[1]: b.get((t, p))}
             for t, p in sorted(set(a) | set(b))]
    pools = [{"pool": p, labels[0]: pa.get(p), labels[1]: pb.get(p)}
             for p in sorted(set(pa) | set(pb))]
    total_a = sum(v["gpu_hours"] for v in pa.values())
    total_b = sum(v["gpu_hours"] for v in pb.values())
    doc: dict[str, Any] = {
        "labels": list(labels),
        "window": {"start": start, "end": end},
        "demand_model": DEMAND_MODEL,
        "teams": teams,
        "pools": pools,
        "totals": {
            labels[0]: {"gpu_hours": round(total_a, 3), "decisions": current.decisions},
            labels[1]: {"gpu_hours": round(total_b, 3), "decisions": proposal.decisions},
        },
        "cards_added": cards_added,
        "gpu_hours_gained_per_card": (round((total_b - total_a) / cards_added, 3)
                                      if cards_added else None),
    }
    if meta:
        doc.update(meta)
    return doc
