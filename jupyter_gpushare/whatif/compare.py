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


def team_pool_figures(result: ReplayResult, start: float, end: float) -> dict[tuple[str, str],
                                                                             dict[str, Any]]:
    """Per (team, pool): demands, waits, refusals, lost and granted GPU-hours, preemptions."""
    groups: dict[tuple[str, str], list[DemandOutcome]] = defaultdict(list)
    for o in result.outcomes:
        if _in_window(o, start, end):
            groups[(o.team, o.pool)].append(o)
    hours: dict[tuple[str, str], float] = defaultdict(float)
    for g in result.grants:
        for team, h in gpu_hours([g], start, end, "team").items():
            hours[(team, g.pool)] += h
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
        }
    return out


def pool_figures(policy: Policy, grants: Sequence[GrantRecord], start: float,
                 end: float) -> dict[str, dict[str, float]]:
    """Per pool: capacity, granted and unallocated GPU-hours in the window."""
    span_h = (end - start) / 3600.0
    granted = gpu_hours(grants, start, end, "pool")
    out = {}
    for pool in policy.pools:
        units = sum(g.units_milli for n in policy.nodes_in(pool.name) for g in n.gpus) / 1000
        cap = units * span_h
        got = granted.get(pool.name, 0.0)
        out[pool.name] = {"gpus": units, "capacity_gpu_hours": round(cap, 3),
                          "gpu_hours": round(got, 3),
                          "unallocated_gpu_hours": round(max(0.0, cap - got), 3)}
    return out


def side_by_side(current: ReplayResult, proposal: ReplayResult, start: float, end: float,
                 *, cards_added: int = 0, labels: tuple[str, str] = ("current", "proposal"),
                 meta: dict[str, Any] | None = None) -> dict[str, Any]:
    """The document the renderers print: both replays per team and pool, and per pool."""
    a = team_pool_figures(current, start, end)
    b = team_pool_figures(proposal, start, end)
    pa = pool_figures(current.policy, current.grants, start, end)
    pb = pool_figures(proposal.policy, proposal.grants, start, end)
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
