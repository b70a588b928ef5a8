"""The report's advice checked by a replay: what "buy N GPUs" or "move X units of guarantee"
would have done to the month's demand (pure; the report calls it with its recommendation).

:func:`check_advice` replays the demand under today's policy and under the policy the
advice leads to, and compares the pool's **unserved GPU-hours**: lost (refused, given up,
stopped) plus waited (queue wait x size). The advice is *supported* when

* buy: the pool's unserved GPU-hours fall by at least :data:`MIN_GAIN` (10 %);
* move: the receiving team's unserved GPU-hours fall, and the giving team's rise by less
  than that fall.

Otherwise the verdict says the replay does not support the advice, with the figures.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from sqlalchemy import Engine

from ..core.model import UNIT, Policy, Request, to_milli
from .demand import Demand
from .inventory import Addition, add_cards
from .replay import ReplayResult, replay

MIN_GAIN = 0.10


class Advice(Protocol):
    """What the report's ``Recommendation`` carries (read only)."""

    pool: str
    action: str
    gpus: int
    units: float
    from_team: str
    to_team: str


@dataclass(frozen=True)
class Verdict:
    """What the replay says of one piece of advice."""

    supported: bool | None  # None: nothing to check (neither, withheld)
    text: str
    figures: dict[str, float]


def unserved_gpu_hours(result: ReplayResult, start: float, end: float, pool: str,
                       team: str | None = None) -> float:
    """Lost plus waited GPU-hours of the demand arriving in the window (one pool, or one
    team in it)."""
    total = 0.0
    for o in result.outcomes:
        if o.pool != pool or not start <= o.arrival < end or (team and o.team != team):
            continue
        if o.status != "served":
            total += o.lost_gpu_hours
        if o.wait_s:
            total += o.units_milli * o.wait_s / UNIT / 3600.0
    return total


def _model_of(policy: Policy, pool: str) -> str:
    models = Counter(g.model for n in policy.nodes_in(pool) for g in n.gpus)
    if not models:
        raise ValueError(f"pool {pool} has no GPUs to copy")
    return models.most_common(1)[0][0]


def _moved(policy: Policy, advice: Advice) -> Policy:
    step = to_milli(advice.units)
    teams = []
    for team in policy.teams:
        delta = step if team.name == advice.to_team else -step if team.name == advice.from_team \
            else 0
        if delta:
            quotas = tuple(
                (p, dataclasses.replace(q, guaranteed_milli=max(0, q.guaranteed_milli + delta)))
                if p == advice.pool else (p, q) for p, q in team.quotas)
            team = dataclasses.replace(team, quotas=quotas)
        teams.append(team)
    return dataclasses.replace(policy, teams=tuple(teams), _index={})


def check_advice(advice: Advice, policy: Policy, demands: Sequence[Demand], start: float,
                 end: float, warm: Sequence[Request] = ()) -> Verdict:
    """Replay the month with and without the advice (see the module's docstring)."""
    if advice.action not in ("buy", "move"):
        return Verdict(None, "Nothing to check by a replay.", {})
    if advice.action == "buy":
        changed = add_cards(policy, [Addition(advice.pool, _model_of(policy, advice.pool),
                                              advice.gpus)])
    else:
        changed = _moved(policy, advice)
    before = replay(policy, demands, warm=warm)
    after = replay(changed, demands, warm=warm)
    pool = advice.pool
    figures: dict[str, Any] = {
        "unserved_before": round(unserved_gpu_hours(before, start, end, pool), 2),
        "unserved_after": round(unserved_gpu_hours(after, start, end, pool), 2),
    }
    if advice.action == "buy":
        a, b = figures["unserved_before"], figures["unserved_after"]
        ok = a > 0 and (a - b) >= MIN_GAIN * a
        text = (f"Replayed with {advice.gpus} more GPU(s) in pool {pool}, the month's unserved "
                f"GPU-hours (lost plus waited) go from {a:.1f} to {b:.1f}: "
                + ("the replay supports buying." if ok else
                   f"less than a {MIN_GAIN:.0%} cut, so the replay does not support buying."))
        return Verdict(ok, text, figures)
    gain = {t: (unserved_gpu_hours(before, start, end, pool, t),
                unserved_gpu_hours(after, start, end, pool, t))
            for t in (advice.to_team, advice.from_team)}
    (to_a, to_b), (from_a, from_b) = gain[advice.to_team], gain[advice.from_team]
    figures.update({"to_team_before": round(to_a, 2), "to_team_after": round(to_b, 2),
                    "from_team_before": round(from_a, 2), "from_team_after": round(from_b, 2)})
    ok = to_b < to_a and (from_b - from_a) < (to_a - to_b)
    text = (f"Replayed with {advice.units:g} unit(s) of guarantee moved from {advice.from_team} "
            f"to {advice.to_team} in pool {pool}: {advice.to_team}'s unserved GPU-hours go from "
            f"{to_a:.1f} to {to_b:.1f}, {advice.from_team}'s from {from_a:.1f} to {from_b:.1f}: "
            + ("the replay supports the move." if ok else "the replay does not support the move."))
    return Verdict(ok, text, figures)


def check_report_advice(engine: Engine, policy: Policy, year: int, month: int,
                        recommendations: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """What a replay of the recorded month says of each of the report's pieces of advice:
    one ``{"supported", "text", "figures"}`` per recommendation, in order (``supported``
    None where there is nothing to check). ``engine`` is only read (the command passes a
    read-only one)."""
    from types import SimpleNamespace

    from .records import read_month

    if not any(r.get("action") in ("buy", "move") for r in recommendations):
        return [_unchecked() for _ in recommendations]
    recorded = read_month(engine, year, month)
    out = []
    for r in recommendations:
        if r.get("action") not in ("buy", "move"):
            out.append(_unchecked())
            continue
        advice = SimpleNamespace(pool=r["pool"], action=r["action"], gpus=int(r.get("gpus") or 0),
                                 units=float(r.get("units") or 0.0),
                                 from_team=r.get("from_team") or "", to_team=r.get("to_team") or "")
        verdict = check_advice(advice, policy, recorded.demands, recorded.start, recorded.end,
                               recorded.warm)
        out.append({"supported": verdict.supported, "text": verdict.text,
                    "figures": verdict.figures})
    return out


def _unchecked() -> dict[str, Any]:
    return {"supported": None, "text": "Nothing to check by a replay.", "figures": {}}
