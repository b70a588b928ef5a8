"""The recommendation rule on three hand-made months (and the data-bound exception).

Each month: one pool ``p`` of whole GPUs, teams ``a`` and ``b``, grants held the whole of
November 2026 (H = 720 h), heartbeats at a fixed utilisation.
"""

from __future__ import annotations

import math
import re

from jupyter_gpushare.core.ledger import month_bounds
from jupyter_gpushare.report import make_report
from jupyter_gpushare.report.render import render
from jupyter_gpushare.report.rows import (
    GPUUse,
    GrantRow,
    MonthRows,
    PoolRow,
    QuotaRow,
    RequestRow,
    SliceRow,
    UsageRow,
)

S, E = month_bounds(2026, 11)
H = 720.0


def month(
    capacity: int,
    guarantees: dict[str, float],
    held: dict[str, float],
    util_pct: float,
    queued: dict[str, float] | None = None,
    borrowed: dict[str, float] | None = None,
) -> MonthRows:
    """``held[team]`` whole GPUs all month (``borrowed[team]`` of them borrowed) at
    ``util_pct``; ``queued[team]`` units waiting all month."""
    grants, usage, requests = [], [], []
    gpu = 0
    for team, units in held.items():
        nb = (borrowed or {}).get(team, 0)
        for i in range(int(units)):
            gid = f"{team}-{i}"
            uuid = f"GPU-{gpu}"
            gpu += 1
            grants.append(GrantRow(gid, f"r-{gid}", f"{team}-user", team, "p", "n0", 1.0,
                                   i < nb, S, None, "", (SliceRow(uuid, 80000, 1.0),)))
            usage.append(UsageRow(gid, {uuid: GPUUse(10, util_pct, 40000.0)}))
            requests.append(RequestRow(f"r-{gid}", f"{team}-user", team, "p", 1.0, "granted",
                                       "guaranteed", S, S, S))
    for team, units in (queued or {}).items():
        requests.append(RequestRow(f"q-{team}", f"{team}-user", team, "p", units, "queued",
                                   "no_capacity", S, S))
    return MonthRows(
        year=2026, month=11, start=S, end=E,
        pools=(PoolRow("p", float(capacity), capacity, ("n0",)),),
        quotas=tuple(QuotaRow(t, "p", g, 4.0) for t, g in guarantees.items()),
        grants=tuple(grants), requests=tuple(requests), usage=tuple(usage),
    )


def test_needs_more_gpus() -> None:
    # 2 GPUs held all month at 90 %, team a waited with 1.5 more units the whole month:
    # occupancy 1440 / 1440 = 1 >= 0.8, unmet 1.5 x 720 = 1080 >= 5 % of 1440, utilisation
    # 0.9 >= 0.5: buy ceil(1080 / 720) = 2 GPUs.
    rows = month(2, {"a": 1, "b": 1}, {"a": 1, "b": 1}, 90.0, queued={"a": 1.5})
    _, recs, doc = make_report(rows)
    (rec,) = recs
    assert rec.action == "buy" and rec.gpus == math.ceil(1080 / 720) == 2
    assert rec.figures["unmet_gpu_hours"] == 1080.0
    assert rec.figures["occupancy"] == 1.0
    assert rec.figures["utilisation"] == 0.9
    assert "Buy 2 GPU(s) for pool p" in rec.text
    assert 'data-pool="p" data-action="buy"' in render(doc, "html")
    assert "recommendation,p,,,gpus,2" in render(doc, "csv")


def test_short_but_data_bound_buys_nothing() -> None:
    # the same month at 20 % utilisation: the cards are taken but barely compute
    rows = month(2, {"a": 1, "b": 1}, {"a": 1, "b": 1}, 20.0, queued={"a": 1.5})
    (rec,) = make_report(rows)[1]
    assert rec.action == "neither" and rec.gpus == 0
    assert "data-bound" in rec.text and "20.0 %" in rec.text


def test_needs_redistribution() -> None:
    # 4 GPUs; a (guarantee 1) holds 2 all month, 1 of them borrowed; b (guarantee 3) holds 1.
    # occupancy 3 x 720 / 2880 = 0.75 < 0.8: not short. need_a = (1440 - 720) / 720 = 1,
    # spare_b = (2160 - 720) / 720 = 2: move floor(min(1, 2) / 0.25) x 0.25 = 1 unit b -> a.
    rows = month(4, {"a": 1, "b": 3}, {"a": 2, "b": 1}, 90.0, borrowed={"a": 1})
    (rec,) = make_report(rows)[1]
    assert rec.action == "move"
    assert (rec.units, rec.from_team, rec.to_team) == (1.0, "b", "a")
    assert rec.figures["need_units"] == 1.0 and rec.figures["spare_units"] == 2.0
    assert "Move 1 GPU unit(s) of guarantee in pool p from team b to team a" in rec.text


def test_needs_neither() -> None:
    # 4 GPUs, each team holds 1 of its guarantee of 2; nobody waits or borrows.
    rows = month(4, {"a": 2, "b": 2}, {"a": 1, "b": 1}, 90.0)
    (rec,) = make_report(rows)[1]
    assert rec.action == "neither" and rec.gpus == 0 and rec.units == 0
    assert rec.figures["occupancy"] == 0.5


def test_small_need_is_not_worth_a_move() -> None:
    # a waited all month for 0.25 unit: need 0.25 < min_move_units 0.5
    rows = month(4, {"a": 1, "b": 3}, {"a": 1, "b": 1}, 90.0, queued={"a": 0.25})
    (rec,) = make_report(rows)[1]
    assert rec.action == "neither"


def test_the_recommendations_hours_are_written_for_reading() -> None:
    # 20 GPUs held all month, 5.5 more units waited all month: 14,400 GPU-hours granted and
    # 3,960 unmet, written with a thousands separator and no decimals (not "14400.0")
    rows = month(20, {"a": 10, "b": 10}, {"a": 10, "b": 10}, 90.0, queued={"a": 5.5})
    _, recs, _ = make_report(rows)
    (rec,) = recs
    assert rec.figures["unmet_gpu_hours"] == 5.5 * H
    assert "14,400 GPU-hours were granted, 3,960 GPU-hours of demand" in rec.text
    assert not re.search(r"\d\.\d\d", rec.text.replace("100.0 %", "")), rec.text
