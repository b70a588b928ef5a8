"""The recommendation rule: buy GPUs for a pool, move guarantee between teams, or neither.

Per pool, with ``H`` the hours of the month, *unmet* the queued plus refused GPU-hours,
*occupancy* granted / capacity GPU-hours and *utilisation* used / measured GPU-hours:

1. **Shortage.** If occupancy >= ``high_occupancy`` and unmet >= ``min_unmet_share`` x
   capacity, the pool is short:

   - if utilisation is known and below ``min_utilisation``, the cards are taken but barely
     computing (data loading, idle notebooks): recommend **neither**, and say so; buying
     would add more idle cards;
   - otherwise **buy N GPUs** with ``N = ceil(unmet / H)``: the number of cards that would
     have been busy on average with the demand that was not served.

2. **Redistribution.** Otherwise, for each team ``need = (granted + unmet - guaranteed) / H``
   GPU units (counted only for teams that borrowed or had unmet demand) and
   ``spare = (guaranteed - granted) / H``. Take the team A with the largest need and the
   other team B with the largest spare; ``X = min(need_A, spare_B)`` rounded down to
   ``move_step_units``. If ``X >= min_move_units``: **move X units of guarantee from B to A**.

3. Otherwise **neither**.

Ties go to the team name that sorts first. The defaults are in :class:`RuleConfig`.

**A month in progress** (the report's ``now`` before the month's end) is judged on its
elapsed hours only (``H`` is then the hours elapsed). Below ``min_elapsed_share`` of the
month (default 0.25, about a week) no recommendation is made: the action is **withheld**
and the text says when one will be. From there on the rule runs as above, but the
recommendation is marked ``provisional`` and its text starts with "Provisional".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .figures import MonthFigures, PoolFigures, TeamPoolFigures


@dataclass(frozen=True)
class RuleConfig:
    """Thresholds of the recommendation rule."""

    high_occupancy: float = 0.8
    min_unmet_share: float = 0.05
    min_utilisation: float = 0.5
    min_move_units: float = 0.5
    move_step_units: float = 0.25
    min_elapsed_share: float = 0.25  # a partial month below this share: withheld


@dataclass
class Recommendation:
    """What the rule says for one pool, with the figures behind it."""

    pool: str
    action: str  # buy | move | neither | withheld (a month in progress, too early)
    text: str
    gpus: int = 0
    units: float = 0.0
    from_team: str = ""
    to_team: str = ""
    figures: dict[str, float | None] = field(default_factory=dict)
    provisional: bool = False  # made on a month in progress


def _pct(x: float | None) -> str:
    return "unknown" if x is None else f"{100 * x:.1f} %"


def _hours(x: float) -> str:
    """GPU-hours for reading: thousands separated, whole hours from 100 on, else one decimal."""
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:,.1f}"


def _team_need(f: TeamPoolFigures, hours: float) -> float:
    if f.unmet_gpu_hours <= 0 and f.borrowed_gpu_hours <= 0:
        return 0.0
    return max(0.0, f.granted_gpu_hours + f.unmet_gpu_hours - f.guaranteed_gpu_hours) / hours


def _team_spare(f: TeamPoolFigures, hours: float) -> float:
    return max(0.0, f.guaranteed_gpu_hours - f.granted_gpu_hours) / hours


def recommend_pool(
    pool: PoolFigures, teams: list[TeamPoolFigures], hours: float, cfg: RuleConfig
) -> Recommendation:
    """The rule (module docstring) for one pool."""
    unmet = pool.unmet_gpu_hours
    figures: dict[str, float | None] = {
        "capacity_gpu_hours": pool.capacity_gpu_hours,
        "granted_gpu_hours": pool.granted_gpu_hours,
        "unmet_gpu_hours": unmet,
        "demand_gpu_hours": pool.demand_gpu_hours,
        "occupancy": pool.occupancy,
        "utilisation": pool.utilisation,
    }
    occupancy = pool.occupancy or 0.0
    short = (
        pool.capacity_gpu_hours > 0
        and occupancy >= cfg.high_occupancy
        and unmet >= cfg.min_unmet_share * pool.capacity_gpu_hours
    )
    if short:
        if pool.utilisation is not None and pool.utilisation < cfg.min_utilisation:
            return Recommendation(
                pool.pool,
                "neither",
                f"Pool {pool.pool} is short ({_pct(occupancy)} of its GPU-hours granted, "
                f"{_hours(unmet)} GPU-hours of demand unmet) but its cards computed only "
                f"{_pct(pool.utilisation)} of the time they were held: the work is "
                "data-bound or idle. Fix input pipelines and idle sessions before buying.",
                figures=figures,
            )
        gpus = math.ceil(unmet / hours - 1e-9)
        return Recommendation(
            pool.pool,
            "buy",
            f"Buy {gpus} GPU(s) for pool {pool.pool}: {_pct(occupancy)} of its "
            f"{_hours(pool.capacity_gpu_hours)} GPU-hours were granted, "
            f"{_hours(unmet)} GPU-hours of "
            f"demand waited or were refused, and the cards computed "
            f"{_pct(pool.utilisation)} of the time they were held.",
            gpus=gpus,
            figures=figures,
        )
    needs = sorted(
        ((_team_need(f, hours), f.team) for f in teams), key=lambda x: (-x[0], x[1])
    )
    if needs and needs[0][0] > 0:
        need, to_team = needs[0]
        spares = sorted(
            ((_team_spare(f, hours), f.team) for f in teams if f.team != to_team),
            key=lambda x: (-x[0], x[1]),
        )
        if spares:
            spare, from_team = spares[0]
            step = cfg.move_step_units
            units = math.floor(min(need, spare) / step + 1e-9) * step
            figures.update({"need_units": need, "spare_units": spare})
            if units >= cfg.min_move_units:
                return Recommendation(
                    pool.pool,
                    "move",
                    f"Move {units:g} GPU unit(s) of guarantee in pool {pool.pool} from team "
                    f"{from_team} to team {to_team}: {to_team} needed {need:.2f} units above "
                    f"its guarantee on average while {from_team} left {spare:.2f} units of "
                    "its guarantee unused.",
                    units=units,
                    from_team=from_team,
                    to_team=to_team,
                    figures=figures,
                )
    return Recommendation(
        pool.pool,
        "neither",
        f"Neither buy nor move in pool {pool.pool}: {_pct(pool.occupancy)} of its GPU-hours "
        f"were granted, {_hours(unmet)} GPU-hours of demand were unmet, and no team's guarantee "
        "is both needed elsewhere and unused.",
        figures=figures,
    )


def recommend(month: MonthFigures, cfg: RuleConfig | None = None) -> list[Recommendation]:
    """One recommendation per pool of ``month``."""
    cfg = cfg or RuleConfig()
    if not month.partial:
        return [
            recommend_pool(p, [f for f in month.teams if f.pool == p.pool], month.hours, cfg)
            for p in month.pools
        ]
    share = month.elapsed_share
    if share < cfg.min_elapsed_share or month.hours <= 0:
        return [
            Recommendation(
                p.pool,
                "withheld",
                f"No recommendation for pool {p.pool} yet: the month is in progress and only "
                f"{_pct(share)} of it has elapsed; one is given (marked provisional) from "
                f"{_pct(cfg.min_elapsed_share)} of the month on.",
                figures={"elapsed_share": share},
                provisional=True,
            )
            for p in month.pools
        ]
    out = []
    for p in month.pools:
        rec = recommend_pool(p, [f for f in month.teams if f.pool == p.pool], month.hours, cfg)
        rec.provisional = True
        rec.text = (
            f"Provisional (month in progress, {_pct(share)} elapsed; figures to now): "
            + rec.text
        )
        rec.figures["elapsed_share"] = share
        out.append(rec)
    return out
