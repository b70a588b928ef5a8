"""benchmarks/report.py (issue 29, figures that reproduce): its baseline scans the rows the
report reads, no more and no fewer, and its spreads and paired ratios are computed right."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCH))

import report as bench  # noqa: E402

from jupyter_gpushare.broker.store.db import grants_table, make_engine  # noqa: E402
from jupyter_gpushare.report.source import load_month  # noqa: E402


def test_spread_is_min_median_max_in_any_order() -> None:
    assert bench.spread([3.0, 1.0, 2.0]) == bench.Spread(1.0, 2.0, 3.0)
    assert bench.spread([4.0, 1.0]) == bench.Spread(1.0, 2.5, 4.0)
    assert bench.spread([0.5]) == bench.Spread(0.5, 0.5, 0.5)
    assert bench.spread([2.0, 9.0, 1.0]).text() == "2.00 (1.00-9.00)"


def test_spread_of_no_runs_is_an_error_naming_repeat() -> None:
    with pytest.raises(ValueError, match="--repeat"):
        bench.spread([])


def test_paired_ratios_divide_each_run_by_its_own_baseline() -> None:
    # not the ratio of the medians (6/3 = 2.0 for all): each pair on its own
    assert bench.paired_ratios([4.0, 6.0, 9.0], [2.0, 4.0, 3.0]) == [2.0, 1.5, 3.0]
    with pytest.raises(ValueError, match="2 runs against 1 baselines"):
        bench.paired_ratios([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="zero"):
        bench.paired_ratios([1.0], [0.0])


def test_the_scan_reads_the_rows_the_report_reads(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'month.sqlite'}")
    policy = bench.cluster(16, 4)
    bench.generate(engine, policy, grants=1500, users=20, beats=2, seed=7)
    rows = load_month(engine, policy, bench.YEAR, bench.MONTH, now=bench.NOW)
    with engine.connect() as conn:
        every_grant = len(conn.execute(grants_table.select()).all())
    # the database holds grants outside the month (before it), which neither may read
    assert every_grant > len(rows.grants) > 0
    counts = bench.fair_scan(engine, bench.YEAR, bench.MONTH, bench.NOW)
    assert counts == {
        "grants": len(rows.grants),
        "requests": len(rows.requests),
        "use": sum(len(u.gpus) for u in rows.usage),
        "power": len(rows.power),
    }
    engine.dispose()
