"""Figures of :func:`jupyter_gpushare.report.figures.compute` that the report's hand-made
month does not pin down, computed from plain rows: a node's power only over hours that had
samples, and each pool's sums of its teams' figures."""

from __future__ import annotations

import pytest

from jupyter_gpushare.report.figures import NO_POWER_NOTE, compute
from jupyter_gpushare.report.rows import (
    GPUUse,
    GrantRow,
    MonthRows,
    PoolRow,
    PowerRow,
    QuotaRow,
    SliceRow,
    UsageRow,
)

START = 1_730_419_200.0  # 2024-11-01 00:00 UTC
END = START + 30 * 86400
HOUR = 3600.0


def _month(**rows: object) -> MonthRows:
    base: dict[str, object] = dict(
        year=2024,
        month=11,
        start=START,
        end=END,
        pools=(PoolRow("train", 2.0, 2, ("t0", "t1")),),
        quotas=(QuotaRow("vision", "train", 1.0, 1.0), QuotaRow("nlp", "train", 1.0, 1.0)),
    )
    return MonthRows(**{**base, **rows})  # type: ignore[arg-type]


def test_a_node_without_power_samples_has_no_power_figures() -> None:
    power = (PowerRow("t1", 0, 0.0, 0.0), PowerRow("t0", 5, 250.0, 400.0))
    figs = compute(_month(power=power))
    assert [(p.node, p.pool, p.hours, p.peak_w, p.average_w) for p in figs.power] == [
        ("t0", "train", 5, 400.0, 250.0)
    ]
    assert figs.power_note == ""
    none = compute(_month(power=(PowerRow("t0", 0, 0.0, 0.0),)))
    assert none.power == [] and none.power_note == NO_POWER_NOTE


def _data_bound_grant(gid: str, team: str, hours: float) -> tuple[GrantRow, UsageRow]:
    """A whole GPU held ``hours`` at 10 % use while holding 60 GiB of its 80: data-bound."""
    grant = GrantRow(
        gid, "r" + gid, "u", team, "train", "t0", 1.0, False,
        START, START + hours * HOUR, slices=(SliceRow("gpu-" + gid, 81920, 1.0),),
    )  # fmt: skip
    return grant, UsageRow(gid, {"gpu-" + gid: GPUUse(10, 10.0, 61440.0)})


def test_a_pool_sums_the_data_bound_figures_of_its_teams() -> None:
    g1, u1 = _data_bound_grant("g1", "vision", 10)
    g2, u2 = _data_bound_grant("g2", "nlp", 4)
    figs = compute(_month(grants=(g1, g2), usage=(u1, u2)))
    teams = {f.team: f for f in figs.teams}
    assert teams["vision"].data_bound_gpu_hours == 10.0
    assert teams["nlp"].data_bound_gpu_hours == 4.0
    (pool,) = figs.pools
    assert pool.data_bound_sessions == 2
    assert pool.data_bound_gpu_hours == 14.0
    assert pool.measured_gpu_hours == 14.0
    assert pool.used_gpu_hours == pytest.approx(1.4)
