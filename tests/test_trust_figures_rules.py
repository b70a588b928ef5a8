"""Issue 23: tests that catch a plausible bug in the figures' rules.

* the recommendation rule (report/rule.py) exactly at each threshold and one unit either
  side (where ``>`` against ``>=``, ``round`` against ``floor``/``ceil`` differ);
* ledger month boundaries (UTC): a grant from Jan 31 23:30 to Feb 1 00:30 is 0.5 h in each
  month, in the pure ledger, the broker's running month ledger and the report;
* a share's measured use is clipped to the share (1/8 reporting 100 % of the card);
* the culler's multi-GPU activity: a 2-GPU grant with one busy GPU is not idle.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from brokerpolicies import small
from corefactory import request

from jupyter_gpushare.broker.ops.culler import GPUCuller
from jupyter_gpushare.broker.service.broker import Broker
from jupyter_gpushare.broker.service.ledger_month import MonthLedger
from jupyter_gpushare.broker.service.usage import UseRecorder
from jupyter_gpushare.broker.store.db import make_engine, migrate
from jupyter_gpushare.core.culling import CullRule, Verdict, verdict
from jupyter_gpushare.core.ledger import Interval, gpu_hours, month_bounds
from jupyter_gpushare.report.figures import PoolFigures, TeamPoolFigures, compute
from jupyter_gpushare.report.rows import (
    GPUUse,
    GrantRow,
    MonthRows,
    PoolRow,
    QuotaRow,
    SliceRow,
    UsageRow,
)
from jupyter_gpushare.report.rule import RuleConfig, recommend_pool

H = 720.0
CFG = RuleConfig()  # high_occupancy 0.8, min_unmet_share 0.05, min_utilisation 0.5,
#                     min_move_units 0.5, move_step_units 0.25
EPS = 1e-6


def pool(occupancy: float, unmet_share: float, utilisation: float | None,
         capacity: float = 10.0) -> PoolFigures:
    cap_h = capacity * H
    p = PoolFigures("p", capacity, int(capacity), cap_h)
    p.granted_gpu_hours = occupancy * cap_h
    p.occupancy = occupancy
    p.queued_gpu_hours = unmet_share * cap_h
    p.utilisation = utilisation
    p.measured_gpu_hours = p.granted_gpu_hours
    p.used_gpu_hours = (utilisation or 0.0) * p.measured_gpu_hours
    return p


# -- the recommendation rule at its thresholds ----------------------------------------------


@pytest.mark.parametrize(("occupancy", "want"), [
    (0.8 - EPS, "neither"), (0.8, "buy"), (0.8 + EPS, "buy"),
])
def test_shortage_at_the_occupancy_threshold(occupancy: float, want: str) -> None:
    assert recommend_pool(pool(occupancy, 0.1, 0.9), [], H, CFG).action == want


@pytest.mark.parametrize(("unmet", "want"), [
    (0.05 - EPS, "neither"), (0.05, "buy"), (0.05 + EPS, "buy"),
])
def test_shortage_at_the_unmet_threshold(unmet: float, want: str) -> None:
    assert recommend_pool(pool(0.9, unmet, 0.9), [], H, CFG).action == want


@pytest.mark.parametrize(("utilisation", "want"), [
    (0.5 - EPS, "neither"), (0.5, "buy"), (0.5 + EPS, "buy"), (None, "buy"),
])
def test_buying_at_the_utilisation_threshold(utilisation: float | None, want: str) -> None:
    assert recommend_pool(pool(0.9, 0.1, utilisation), [], H, CFG).action == want


@pytest.mark.parametrize(("gpus_unmet", "want"), [
    (2.0 - 0.001, 2), (2.0, 2), (2.0 + 0.001, 3),
])
def test_buy_count_is_the_ceiling_of_unmet_over_hours(gpus_unmet: float, want: int) -> None:
    """N = ceil(unmet / H): exactly 2 GPU-months unmet buys 2, a little more buys 3
    (round() would buy 2 for 2.001 and floor() 1 for 1.999)."""
    p = pool(0.9, gpus_unmet / 10.0, 0.9)
    rec = recommend_pool(p, [], H, CFG)
    assert (rec.action, rec.gpus) == ("buy", want)


def _teams(need_units: float, spare_units: float) -> list[TeamPoolFigures]:
    a = TeamPoolFigures("a", "p", guaranteed_units=1.0)
    a.guaranteed_gpu_hours = 1.0 * H
    a.granted_gpu_hours = (1.0 + need_units) * H
    a.borrowed_gpu_hours = need_units * H
    b = TeamPoolFigures("b", "p", guaranteed_units=4.0)
    b.guaranteed_gpu_hours = 4.0 * H
    b.granted_gpu_hours = (4.0 - spare_units) * H
    return [a, b]


@pytest.mark.parametrize(("need", "want_action", "want_units"), [
    (0.5 - EPS, "neither", 0.0),  # floors to 0.25 < min_move_units
    (0.5, "move", 0.5),  # exactly the minimum
    (0.5 + EPS, "move", 0.5),
    (0.75 - EPS, "move", 0.5),  # floor to the step, not round (round would give 0.75)
    (0.75, "move", 0.75),
    (0.75 + EPS, "move", 0.75),
])
def test_move_rounds_down_to_the_step_and_needs_the_minimum(
    need: float, want_action: str, want_units: float
) -> None:
    rec = recommend_pool(pool(0.5, 0.0, 0.9), _teams(need, 3.0), H, CFG)
    assert (rec.action, rec.units) == (want_action, want_units)
    if want_action == "move":
        assert (rec.from_team, rec.to_team) == ("b", "a")


@pytest.mark.parametrize(("spare", "want_action", "want_units"), [
    (0.5 - EPS, "neither", 0.0),  # the spare floors to 0.25, below the minimum
    (0.5, "move", 0.5),
    (0.5 + EPS, "move", 0.5),
])
def test_move_is_bounded_by_the_spare(spare: float, want_action: str, want_units: float) -> None:
    rec = recommend_pool(pool(0.5, 0.0, 0.9), _teams(2.0, spare), H, CFG)
    assert (rec.action, rec.units) == (want_action, want_units)


# -- ledger month boundaries (UTC) ----------------------------------------------------------

FEB = month_bounds(2027, 2)[0]
JAN = month_bounds(2027, 1)


def test_a_grant_across_midnight_of_a_month_counts_half_in_each() -> None:
    begin, end = FEB - 1800, FEB + 1800  # Jan 31 23:30 to Feb 1 00:30 UTC
    iv = [Interval("g", "t", "p", "u", 1000, begin, end)]
    assert gpu_hours(iv, *JAN, now=end + 10)[("t", "p")] == pytest.approx(0.5)
    assert gpu_hours(iv, *month_bounds(2027, 2), now=end + 10)[("t", "p")] == (
        pytest.approx(0.5))
    # the broker's running ledger of February (a grant from January, still live, then gone)
    from corefactory import policy

    grant = _grant(policy({"t": {"train": (1, 0)}}), begin)
    feb = MonthLedger(month=(2027, 2), start=FEB)
    feb.add(grant)
    assert feb.hours(("t", "train"), FEB + 900) == pytest.approx(0.25)
    feb.remove(grant, end)
    assert feb.hours(("t", "train"), FEB + 7200) == pytest.approx(0.5)
    # the report of each month
    for year, month in ((2027, 1), (2027, 2)):
        start, stop = month_bounds(year, month)
        rows = MonthRows(
            year, month, start, stop, (PoolRow("p", 1.0, 1, ("n",)),),
            (QuotaRow("t", "p", 1.0, 0.0),),
            grants=(GrantRow("g", "r", "u", "t", "p", "n", 1.0, False, begin, end),),
        )
        fig = compute(rows)
        assert fig.teams[0].granted_gpu_hours == pytest.approx(0.5), (year, month)
        assert fig.teams[0].grants == (1 if month == 1 else 0)


def _grant(pol: object, granted_at: float) -> object:
    import dataclasses

    from corefactory import request as ask

    from jupyter_gpushare.core.model import GPUSlice, Grant, Placement

    req = dataclasses.replace(ask("t", "train", whole=1), user="u")
    return Grant("g", req, Placement("train-n0", (GPUSlice("GPU-train-n0-0", 81920, 1000),)),
                 1000, False, 500, False, granted_at)


# -- a share's measured use is clipped to the share -----------------------------------------


def test_an_eighth_share_reporting_the_whole_card_counts_as_its_share() -> None:
    start, stop = month_bounds(2026, 11)
    g = GrantRow("g", "r", "u", "t", "p", "n", 0.125, False, start, start + 3600 * 8,
                 slices=(SliceRow("GPU-0", 10240, 0.125),))
    rows = MonthRows(2026, 11, start, stop, (PoolRow("p", 1.0, 1, ("n",)),),
                     (QuotaRow("t", "p", 1.0, 0.0),), grants=(g,),
                     usage=(UsageRow("g", {"GPU-0": GPUUse(10, 100.0, 100.0)}),))
    f = compute(rows).teams[0]
    assert f.measured_gpu_hours == pytest.approx(1.0)  # 0.125 x 8 h
    assert f.used_gpu_hours == pytest.approx(1.0)  # not 8 (the whole card for 8 h)
    assert f.idle_share == pytest.approx(0.0)


# -- the culler: any busy GPU of a multi-GPU grant is activity ------------------------------


@pytest.mark.parametrize("order", [("busy", "idle"), ("idle", "busy")])
def test_a_two_gpu_grant_with_one_busy_gpu_is_not_idle(tmp_path: Path,
                                                       order: tuple[str, str]) -> None:
    t0 = 1_800_000_000.0
    clock = [t0]
    engine = make_engine(f"sqlite:///{tmp_path}/c.sqlite")
    migrate(engine)
    broker = Broker(small(), engine, clock=lambda: clock[0])
    broker.load()
    gid = broker.submit(request("a", "train", whole=2, user="alice"))["grant"]["id"]
    uuids = [s.gpu_uuid for s in broker.state.grants[gid].placement.slices]
    assert len(uuids) == 2
    culler = GPUCuller(broker, None, windows={"train": 3600.0}, warn_s=600.0)
    util = {"busy": 90.0, "idle": 0.0}
    for k in range(0, 7200, 60):  # two hours of heartbeats, one GPU busy throughout
        clock[0] = t0 + k
        gpus = [{"uuid": u, "utilization_pct": util[o], "memory_used_mib": 1000.0}
                for u, o in zip(uuids, order, strict=True)]
        with engine.begin() as conn:
            broker.usage.record(conn, gid, "train-n0", clock[0], gpus)
    facts = culler.facts(gid, clock[0])
    assert facts.last_gpu_activity == clock[0]
    assert verdict(facts, CullRule(window_s=3600, warn_s=600)) is Verdict.NONE
    # and the same grant with both GPUs idle is warned (the test can fail)
    rec = UseRecorder()
    with engine.begin() as conn:
        rec.record(conn, "other", "train-n0", t0, [
            {"uuid": u, "utilization_pct": 0.0, "memory_used_mib": 0.0} for u in uuids])
    assert "other" not in rec.last_active
    broker.close()
    engine.dispose()
