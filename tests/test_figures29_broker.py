"""benchmarks/broker_spread.py (issue 29, figures that reproduce): the broker benchmark's
median (min-max) per arm over --reps, and the now/base ratio of each rep's pair."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import broker_spread as bs  # noqa: E402


def run(arm: str, rep: int, throughput: float, cpu_ms: float) -> dict[str, Any]:
    return {
        "arm": ("sqlite", arm),
        "rep": rep,
        "throughput": throughput,
        "cpu_ms": cpu_ms,
        "rate": 500.0,
        "p99": 10.0,
    }


# the order --reps 2 runs them in: base, now, then now, base
RESULTS = {
    "sqlite base 1": run("base", 1, 1000.0, 0.8),
    "sqlite now 1": run("now", 1, 1500.0, 0.6),
    "sqlite now 2": run("now", 2, 1800.0, 0.5),
    "sqlite base 2": run("base", 2, 600.0, 1.0),
}


def test_median_range_is_median_then_min_and_max() -> None:
    assert bs.median_range([9.0, 1.0, 2.0]) == "2.00 (1.00-9.00)"
    assert bs.median_range([1.0, 4.0], "{:.1f}") == "2.5 (1.0-4.0)"
    with pytest.raises(ValueError, match="--reps"):
        bs.median_range([])


def test_each_rep_is_divided_by_its_own_baseline() -> None:
    # not the ratio of the medians (1650 / 800 = 2.06): 1.5 and 3.0
    assert bs.pair_ratios(RESULTS, "sqlite", "now", "throughput") == [1.5, 3.0]
    assert bs.pair_ratios(RESULTS, "sqlite", "now", "cpu_ms") == pytest.approx([0.75, 0.5])
    lines = bs.ratio_lines(RESULTS)
    assert lines[0].startswith("sqlite now/base, each rep's pair: admissions/s 2.25 (1.50-3.00)")
    assert "CPU per admission ms 0.62 (0.50-0.75)" in lines[0]


def test_a_rep_without_its_baseline_is_named() -> None:
    lone = {k: v for k, v in RESULTS.items() if k != "sqlite base 2"}
    with pytest.raises(ValueError, match="sqlite now rep 2 has no base run"):
        bs.pair_ratios(lone, "sqlite", "now", "throughput")


def test_an_arm_line_per_arm_run_more_than_once() -> None:
    lines = bs.arm_lines(RESULTS)
    assert lines[0] == (
        "sqlite base: median (min-max) of 2 runs: admissions/s 800 (600-1000), "
        "CPU per admission ms 0.900 (0.800-1.000), achieved/s 500 (500-500), "
        "p99 ms 10.00 (10.00-10.00)"
    )
    assert bs.arm_lines({"sqlite now": run("now", 1, 1.0, 1.0)}) == []


def test_a_commit_mode_arm_is_paired_with_the_same_mode_of_the_baseline() -> None:
    modes = {
        "sqlite base/inline 1": run("base/inline", 1, 1000.0, 0.8),
        "sqlite base/loop 1": run("base/loop", 1, 2000.0, 0.4),
        "sqlite now/inline 1": run("now/inline", 1, 1100.0, 0.8),
        "sqlite now/loop 1": run("now/loop", 1, 3000.0, 0.4),
    }
    assert bs.pair_ratios(modes, "sqlite", "now/loop", "throughput") == [1.5]
    assert bs.pair_ratios(modes, "sqlite", "now/inline", "throughput") == [1.1]
