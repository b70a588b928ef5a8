"""GPU-hours from grant intervals."""

from __future__ import annotations

import pytest

from jupyter_gpushare.core.ledger import (
    Interval,
    capacity_hours,
    gpu_hours,
    month_bounds,
    month_of,
)


def test_month_bounds_cross_the_year() -> None:
    start, end = month_bounds(2026, 12)
    assert end - start == 31 * 86400
    assert month_of(start) == (2026, 12) and month_of(end) == (2027, 1)


def test_interval_is_clipped_to_the_period_and_weighted_by_units() -> None:
    start, end = month_bounds(2026, 11)
    intervals = [
        Interval("g1", "vision", "train", "ann", 2000, start - 3600, start + 7200),  # 2 h in
        Interval("g2", "vision", "train", "bob", 250, start + 0, start + 4 * 3600),  # 0.25 x 4 h
        Interval("g3", "nlp", "train", "cy", 1000, end - 1800, None),  # live, 0.5 h in period
        Interval("g4", "nlp", "train", "cy", 1000, end + 10, end + 20),  # outside
    ]
    hours = gpu_hours(intervals, start, end, now=end + 3600)
    assert hours[("vision", "train")] == pytest.approx(2 * 2 + 0.25 * 4)
    assert hours[("nlp", "train")] == pytest.approx(0.5)
    by_user = gpu_hours(intervals, start, end, now=end, key=lambda i: i.user)
    assert by_user == pytest.approx({"ann": 4.0, "bob": 1.0, "cy": 0.5})


def test_live_interval_counts_up_to_now() -> None:
    start, end = month_bounds(2026, 11)
    live = [Interval("g", "t", "p", "u", 1000, start, None)]
    assert gpu_hours(live, start, end, now=start + 1800)[("t", "p")] == pytest.approx(0.5)
    assert capacity_hours(4000, start, end, now=start + 3600) == pytest.approx(4.0)
