"""The report as a page (issue 26 item 19), without a browser: figures rounded for reading,
plots that show one day of data, a team's cut of the document, and every figure the page
shows recomputed from the rows it was made from.

The browser half (the page on a real hub, the downloads, the authorisation) is in
tests/test_pages_hub.py.
"""

from __future__ import annotations

import random
import re

import pytest

from jupyter_gpushare.core.ledger import month_bounds
from jupyter_gpushare.report import make_report, page_plots, reading
from jupyter_gpushare.report import page as report_page
from jupyter_gpushare.report.rows import GrantRow, MonthRows, PoolRow, QuotaRow, RequestRow

YEAR, MONTH = 2026, 11
START, END = month_bounds(YEAR, MONTH)
TEAMS = ("vision", "nlp", "research")


def month_rows(seed: int, now: float | None = None, grants: int = 300) -> MonthRows:
    rng = random.Random(seed)
    rows, reqs = [], []
    for i in range(grants):
        team = rng.choice(TEAMS)
        pool = rng.choice(("train", "shared"))
        created = rng.uniform(START - 86400, END - 600)
        granted = created + (rng.expovariate(1 / 300) if rng.random() < 0.4 else 0.0)
        released = granted + rng.expovariate(1 / 7200)
        units = float(rng.choice((1, 2, 4))) if pool == "train" else rng.choice((0.125, 0.5))
        rows.append(
            GrantRow(
                f"g{i}",
                f"r{i}",
                f"u{i % 17}",
                team,
                pool,
                "n0",
                units,
                rng.random() < 0.2,
                granted,
                released,
                "released by holder",
            )
        )
        reqs.append(
            RequestRow(
                f"r{i}",
                f"u{i % 17}",
                team,
                pool,
                units,
                "released",
                "guaranteed",
                created,
                released,
                granted,
            )
        )
    quotas = tuple(
        QuotaRow(t, p, g, 2.0, 500.0) for t in TEAMS for p, g in (("train", 4.0), ("shared", 1.5))
    )
    return MonthRows(
        YEAR,
        MONTH,
        START,
        END,
        (PoolRow("train", 16, 16, ("n0",)), PoolRow("shared", 8, 8, ("n1",))),
        quotas,
        tuple(rows),
        tuple(reqs),
        now=now,
    )


def granted_by_rows(rows: MonthRows, team: str, pool: str | None, until: float) -> float:
    """GPU-hours granted to ``team`` (in ``pool``, or all), straight from the grant rows."""
    total = 0.0
    for g in rows.grants:
        if g.team != team or (pool is not None and g.pool != pool):
            continue
        lo, hi = max(g.granted_at, rows.start), min(g.released_at or until, until)
        if hi > lo:
            total += g.units * (hi - lo) / 3600
    return total


def test_figures_are_rounded_for_reading_with_their_units() -> None:
    assert reading.gpu_hours(2821.7553) == "2,822 GPU-h"
    assert reading.gpu_hours(0.4076) == "0.41 GPU-h"
    assert reading.gpu_hours(0.0009) == "< 0.01 GPU-h"
    assert reading.gpu_hours(0.0) == "0 GPU-h"
    assert reading.percent(0.0526) == "5.3 %"
    assert reading.percent(1.4109) == "141 %"
    assert reading.duration(303.3313) == "5 min"
    assert reading.duration(42) == "42 s"
    assert reading.units(1.0) == "1 GPU" and reading.units(2.75) == "2.75 GPUs"
    assert reading.amount(None) == reading.NONE


@pytest.mark.parametrize("seed", [1, 7, 23])
def test_every_figure_on_the_page_is_the_rows_figure(seed: int) -> None:
    rows = month_rows(seed)
    _, _, doc = make_report(rows)
    html = report_page.body(doc, {})
    # granted GPU-hours per team and pool: the page's exact value against the rows' sum
    for pool in ("train", "shared"):
        table = re.search(rf'<table class="figures teams pool-{pool}">(.*?)</table>', html)
        assert table is not None
        row = re.search(r'<tr data-key="granted_gpu_hours">(.*?)</tr>', table.group(1))
        assert row is not None
        values = [float(v) for v in re.findall(r'data-value="([^"]+)"', row.group(1))]
        texts = re.findall(r"<td[^>]*>([^<]*)</td>", row.group(1))
        assert texts and all(t.endswith(" GPU-h") for t in texts), texts  # the unit is named
        names = re.findall(r'<th class="num">([^<]+)</th>', table.group(1))
        assert len(values) == len(names) == len(TEAMS)
        for team, shown in zip(names, values, strict=True):
            assert shown == pytest.approx(granted_by_rows(rows, team, pool, END), abs=1e-3)
    # the daily bars of each team add up to the team's GPU-hours in the month
    for team in TEAMS:
        bars = re.findall(
            rf'<rect class="bar" data-team="{team}" data-day="\d+" '
            r'data-gpu-hours="([^"]+)"',
            html,
        )
        assert sum(map(float, bars)) == pytest.approx(
            granted_by_rows(rows, team, None, END), abs=0.01 * len(bars) + 1e-3
        )
    # borrowed bars: the rows' borrowed grants
    for team in TEAMS:
        m = re.search(rf'<rect class="borrowed" data-team="{team}" data-gpu-hours="([^"]+)"', html)
        assert m is not None
        want = sum(
            g.units * (min(g.released_at or END, END) - max(g.granted_at, START)) / 3600
            for g in rows.grants
            if g.team == team
            and g.borrowed
            and min(g.released_at or END, END) > max(g.granted_at, START)
        )
        assert float(m.group(1)) == pytest.approx(want, abs=1e-3)
    # nothing shown with more than two decimals, and no exponent notation
    shown = re.sub(r"<[^>]+>", " ", html)
    assert not re.search(r"\d\.\d{3,}", shown), re.findall(r"\S*\d\.\d{3,}\S*", shown)[:5]
    assert not re.search(r"\de[+-]\d", shown)


def test_a_month_in_progress_is_labelled_partial() -> None:
    now = START + 5.5 * 86400
    _, _, doc = make_report(month_rows(3, now=now))
    assert report_page.title(doc).endswith("(partial: month in progress)")
    html = report_page.body(doc, {"csv": "x.csv"})
    assert 'data-partial="yes"' in html and "Partial month" in html
    assert "The last day is in progress." in html
    _, _, ended = make_report(month_rows(3))
    assert "partial" not in report_page.title(ended)
    assert 'data-partial="no"' in report_page.body(ended, {})


def test_the_queue_wait_chart_shows_one_day_of_data() -> None:
    svg = page_plots.queue_wait([None, 120.0, None], [None, 600.0, None], 3)
    dots = re.findall(r'<circle class="wait" data-series="(\w+)" data-day="(\d+)"', svg)
    assert sorted(dots) == [("median", "2"), ("p95", "2")]
    # ticks are round numbers in minutes, never exponents
    assert "e+" not in svg and ">10<" in svg


def test_axis_ticks_are_round() -> None:
    assert page_plots.nice_max(3527.5) == 4000
    assert page_plots.nice_max(2281) == 4000 and page_plots.nice_max(5.0) == 8
    assert page_plots.nice_max(120) == 200
    assert page_plots.nice_max(0) == 1


def test_a_team_admin_sees_only_the_team() -> None:
    _, _, doc = make_report(month_rows(5))
    cut = report_page.for_team(doc, "nlp")
    assert {t["team"] for t in cut["teams"]} == {"nlp"}
    assert cut["pools"] == [] and cut["power"] == []
    assert list(cut["series"]["gpu_hours_per_team_day"]) == ["nlp"]
    assert all("nlp" in (r["from_team"], r["to_team"]) for r in cut["recommendations"])
    html = report_page.body(cut, {})
    assert "vision" not in html and "research" not in html
    assert doc["teams"] != cut["teams"]  # the document itself is not changed
