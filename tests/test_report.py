"""The monthly report on a synthetic month whose every figure is worked out by hand below.

The rows go into a real broker database (SQLite through SQLAlchemy), are read back by the
report's adapter, and the figures are checked in all four formats (json, csv, md, html)
against the hand-computed values. November 2026 has 30 days: H = 720 hours.
"""

from __future__ import annotations

import csv
import io
import json
from html.parser import HTMLParser
from typing import Any

import pytest
from reportkit import write_rows

from jupyter_gpushare.broker.store.db import make_engine
from jupyter_gpushare.core.ledger import month_bounds
from jupyter_gpushare.core.model import (
    GPU,
    Node,
    Policy,
    Pool,
    PoolQuota,
    PriorityClass,
    SharingMode,
    Team,
)
from jupyter_gpushare.report import make_report
from jupyter_gpushare.report.document import POOL_COLUMNS, TEAM_COLUMNS, num, rnd
from jupyter_gpushare.report.render import render
from jupyter_gpushare.report.rows import GrantRow, RequestRow, SliceRow
from jupyter_gpushare.report.source import load_month

S, E = month_bounds(2026, 11)
HOUR = 3600.0


def h(x: float) -> float:
    return S + x * HOUR


def month_policy() -> Policy:
    def gpu(u: str) -> GPU:
        return GPU(u, "H200", 80000)

    return Policy(
        nodes=(
            Node("t0", "train", (gpu("GPU-a"), gpu("GPU-b")), 64000, 512000),
            Node("l0", "lab", (gpu("GPU-c"),), 64000, 512000),
        ),
        pools=(Pool("train", SharingMode.EXCLUSIVE), Pool("lab", SharingMode.SHARED)),
        priority_classes=(PriorityClass("interactive", 500, preemptible=False),),
        teams=(
            Team("vision", ("vision",), (
                ("train", PoolQuota(1000, 1000, gpu_hours_per_month=1000.0)),
                ("lab", PoolQuota(500, 500)),
            )),
            Team("nlp", ("nlp",), (("train", PoolQuota(1000, 0)), ("lab", PoolQuota(500, 0)))),
        ),
    )


def whole(u: str) -> tuple[SliceRow, ...]:
    return (SliceRow(u, 80000, 1.0),)


GRANTS = [
    # vision holds GPU-a for 100 h at 50 % (samples 40 and 60 %, memory 30 and 50 GB)
    GrantRow("g1", "r1", "ann", "vision", "train", "t0", 1.0, False, h(0), h(100),
             "released by holder", whole("GPU-a")),
    # vision borrows GPU-b 10 h..30 h at 10 % while holding 60 of 80 GB: data-bound,
    # then the owner reclaims it
    GrantRow("g2", "r2", "ann", "vision", "train", "t0", 1.0, True, h(10), h(30),
             "preempted: team nlp needs its guarantee", whole("GPU-b")),
    # nlp on GPU-b 30 h..50 h, no heartbeat, culled as idle
    GrantRow("g3", "r3", "bob", "nlp", "train", "t0", 1.0, False, h(30), h(50),
             "culled: no GPU activity for 2h", whole("GPU-b")),
    # nlp from October (-10 h) to 5 h: 5 h in the month, one sample at 80 %
    GrantRow("g4", "r4", "bob", "nlp", "train", "t0", 1.0, False, h(-10), h(5),
             "released by holder", whole("GPU-b")),
    # nlp holds a quarter of GPU-c from 700 h to beyond the month, card at 20 %
    GrantRow("g5", "r5", "bob", "nlp", "lab", "l0", 0.25, False, h(700), None, "",
             (SliceRow("GPU-c", 20000, 0.25),)),
    # vision holds half of GPU-c 500..510 h at 5 % with 1 GB of 40 GB: idle, not data-bound
    GrantRow("g6", "r10", "ann", "vision", "lab", "l0", 0.5, False, h(500), h(510),
             "released by holder", (SliceRow("GPU-c", 40000, 0.5),)),
]
REQUESTS = [
    RequestRow("r1", "ann", "vision", "train", 1.0, "released", "guaranteed", h(0), h(100)),
    RequestRow("r2", "ann", "vision", "train", 1.0, "released", "borrowed", h(9), h(30)),
    RequestRow("r3", "bob", "nlp", "train", 1.0, "released", "guaranteed", h(29.5), h(50)),
    RequestRow("r4", "bob", "nlp", "train", 1.0, "released", "guaranteed", h(-10), h(5)),
    RequestRow("r5", "bob", "nlp", "lab", 0.25, "granted", "guaranteed", h(700), h(700)),
    RequestRow("r6", "ann", "vision", "train", 1.0, "refused", "quota", h(200), h(200)),
    RequestRow("r7", "ann", "vision", "train", 2.0, "refused", "user_cap", h(300), h(300)),
    RequestRow("r8", "bob", "nlp", "train", 1.0, "queued", "no_capacity", h(710), h(710)),
    RequestRow("r9", "ann", "vision", "lab", 0.5, "cancelled", "cancelled", h(400), h(402)),
    RequestRow("r10", "ann", "vision", "lab", 0.5, "released", "guaranteed", h(500), h(510)),
    # waiting for preemption victims since October: 1/8 unit for all 720 h = 90 GPU-hours
    RequestRow("r11", "bob", "nlp", "train", 0.125, "preempting", "preempting", h(-1), h(-1)),
]
HEARTBEATS: list[tuple[str, float, list[dict[str, Any]]]] = [
    ("g1", S + 60, [{"uuid": "GPU-a", "utilization_pct": 40, "memory_used_mib": 30000,
                     "power_w": 300}]),
    ("g1", S + 120, [{"uuid": "GPU-a", "utilization_pct": 60, "memory_used_mib": 50000,
                      "power_w": 500}]),
    ("g4", S + 90, [{"uuid": "GPU-b", "utilization_pct": 80, "memory_used_mib": 1000,
                     "power_w": 100}]),
    ("g2", h(10) + 10, [{"uuid": "GPU-b", "utilization_pct": 10, "memory_used_mib": 60000,
                         "power_w": 200}]),
    ("g5", h(700) + 5, [{"uuid": "GPU-c", "utilization_pct": 20, "memory_used_mib": 15000}]),
    ("g6", h(500) + 1, [{"uuid": "GPU-c", "utilization_pct": 5, "memory_used_mib": 1000}]),
    ("g5", E + 5, [{"uuid": "GPU-c", "utilization_pct": 99, "memory_used_mib": 1}]),  # December
]

# ---- the figures by hand --------------------------------------------------------------------
# train durations of grants ended in the month: 100, 20, 20, 15 h -> median 20 h, so a refused
# request of u units counts u x 20 GPU-hours of demand.
# lent: borrowed units exist only during g2 (10..30 h); then vision uses 2 (nothing unused) and
# nlp 0 (g4 ended at 5 h, g3 starts at 30 h): nlp lends min(1, B/U) x 1 = 1 unit for 20 h.
TEAMS: dict[tuple[str, str], dict[str, Any]] = {
    ("vision", "train"): dict(
        guaranteed_units=1.0, guaranteed_gpu_hours=720.0,
        granted_gpu_hours=100.0 + 20.0, borrowed_gpu_hours=20.0, lent_gpu_hours=0.0,
        measured_gpu_hours=120.0,
        used_gpu_hours=100 * 0.5 + 20 * 0.1,  # 52
        idle_share=1 - 52 / 120,
        queued_gpu_hours=1.0,  # r2 waited 9 h..10 h
        refused_gpu_hours=1 * 20 + 2 * 20,
        requests=4, grants=2,
        queue_wait_median_s=(0 + 3600) / 2, queue_wait_p95_s=3600.0,
        refusals={"quota": 1, "user_cap": 1}, preemptions={"reclaimed": 1}, culled=0,
        data_bound_sessions=1, data_bound_gpu_hours=20.0,
        budget_gpu_hours=1000.0, budget_used_share=120 / 1000,
    ),
    ("nlp", "train"): dict(
        guaranteed_units=1.0, guaranteed_gpu_hours=720.0,
        granted_gpu_hours=20.0 + 5.0, borrowed_gpu_hours=0.0, lent_gpu_hours=20.0,
        measured_gpu_hours=5.0, used_gpu_hours=5 * 0.8, idle_share=1 - 4 / 5,
        queued_gpu_hours=0.5 + 10.0 + 90.0,  # r3 29.5..30 h, r8 710..720 h, r11 all month
        refused_gpu_hours=0.0, requests=2, grants=1,
        queue_wait_median_s=1800.0, queue_wait_p95_s=1800.0,
        refusals={}, preemptions={}, culled=1,
        data_bound_sessions=0, data_bound_gpu_hours=0.0,
        budget_gpu_hours=None, budget_used_share=None,
    ),
    ("vision", "lab"): dict(
        guaranteed_units=0.5, guaranteed_gpu_hours=360.0, granted_gpu_hours=0.5 * 10,
        borrowed_gpu_hours=0.0, lent_gpu_hours=0.0, measured_gpu_hours=5.0,
        used_gpu_hours=10 * 0.05, idle_share=1 - 0.5 / 5,
        queued_gpu_hours=0.5 * 2,  # r9 waited 400..402 h, then was cancelled
        refused_gpu_hours=0.0, requests=2, grants=1,
        queue_wait_median_s=0.0, queue_wait_p95_s=0.0,
        refusals={}, preemptions={}, culled=0, data_bound_sessions=0,
        data_bound_gpu_hours=0.0, budget_gpu_hours=None, budget_used_share=None,
    ),
    ("nlp", "lab"): dict(
        guaranteed_units=0.5, guaranteed_gpu_hours=360.0,
        granted_gpu_hours=0.25 * 20, borrowed_gpu_hours=0.0, lent_gpu_hours=0.0,
        measured_gpu_hours=5.0,
        used_gpu_hours=20 * min(0.25, 0.20),  # the card at 20 %, inside the quarter share
        idle_share=1 - 4 / 5,
        queued_gpu_hours=0.0, refused_gpu_hours=0.0, requests=1, grants=1,
        queue_wait_median_s=0.0, queue_wait_p95_s=0.0,
        refusals={}, preemptions={}, culled=0, data_bound_sessions=0,
        data_bound_gpu_hours=0.0, budget_gpu_hours=None, budget_used_share=None,
    ),
}
POOLS: dict[str, dict[str, Any]] = {
    "train": dict(
        gpus=2, capacity_units=2.0, capacity_gpu_hours=1440.0, guaranteed_gpu_hours=1440.0,
        granted_gpu_hours=145.0, borrowed_gpu_hours=20.0, queued_gpu_hours=101.5,
        refused_gpu_hours=60.0, demand_gpu_hours=145 + 101.5 + 60,
        demand_share=306.5 / 1440, occupancy=145 / 1440,
        measured_gpu_hours=125.0, used_gpu_hours=56.0, utilisation=56 / 125,
        idle_share=1 - 56 / 125,
        queue_wait_median_s=1800.0, queue_wait_p95_s=3600.0,  # waits 0, 1800, 3600
        refusals={"quota": 1, "user_cap": 1}, preemptions={"reclaimed": 1}, culled=1,
        data_bound_sessions=1,
    ),
    "lab": dict(
        gpus=1, capacity_units=1.0, capacity_gpu_hours=720.0, guaranteed_gpu_hours=720.0,
        granted_gpu_hours=10.0, borrowed_gpu_hours=0.0, queued_gpu_hours=1.0,
        refused_gpu_hours=0.0, demand_gpu_hours=11.0, demand_share=11 / 720,
        occupancy=10 / 720, measured_gpu_hours=10.0, used_gpu_hours=4.5, utilisation=0.45,
        idle_share=0.55, queue_wait_median_s=0.0, queue_wait_p95_s=0.0,
        refusals={}, preemptions={}, culled=0, data_bound_sessions=0,
    ),
}
# power of node t0, the sum of each GPU's latest power (within 2 min): at S+60 s GPU-a 300 W;
# at S+90 s GPU-a 300 + GPU-b 100 = 400 W; at S+120 s 500 + 100 = 600 W -> hour 0: mean
# 1300 / 3, max 600. At 10 h + 10 s only GPU-b is fresh: 200 W. Peak 600; average of the
# hourly means (1300 / 3 + 200) / 2.
AVG_T0 = (1300 / 3 + 200) / 2
POWER = {"t0": dict(pool="train", hours=2, peak_w=600.0, average_w=AVG_T0,
                    peak_to_average=600 / AVG_T0)}


@pytest.fixture(scope="module")
def report_doc(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    db = tmp_path_factory.mktemp("report") / "gpushare.sqlite"
    engine = make_engine(f"sqlite:///{db}")
    write_rows(engine, GRANTS, REQUESTS, HEARTBEATS)
    rows = load_month(engine, month_policy(), 2026, 11, policy_version="v-test")
    engine.dispose()
    _, _, doc = make_report(rows)
    return doc


def test_json_matches_the_hand_figures(report_doc: dict[str, Any]) -> None:
    doc = json.loads(render(report_doc, "json"))
    assert doc["month"] == "2026-11" and doc["hours"] == 720.0
    assert doc["policy_version"] == "v-test"
    teams = {(t["team"], t["pool"]): t for t in doc["teams"]}
    assert set(teams) == set(TEAMS)
    for key, want in TEAMS.items():
        for name, value in want.items():
            assert teams[key][name] == rnd(value), (key, name)
    pools = {p["pool"]: p for p in doc["pools"]}
    for pool, want in POOLS.items():
        for name, value in want.items():
            assert pools[pool][name] == rnd(value), (pool, name)
    power = {n["node"]: n for n in doc["power"]}
    assert set(power) == set(POWER)
    for node, want in POWER.items():
        for name, value in want.items():
            assert power[node][name] == rnd(value), (node, name)
    assert doc["power_note"] == ""
    assert [r["action"] for r in doc["recommendations"]] == ["neither", "neither"]


def _flat_expect(want: dict[str, Any]) -> dict[str, str]:
    out = {}
    for name, value in want.items():
        if isinstance(value, dict):
            out.update({f"{name}.{k}": num(v) for k, v in value.items()})
        else:
            out[name] = num(value)
    return out


def test_csv_matches_the_hand_figures(report_doc: dict[str, Any]) -> None:
    rows = list(csv.DictReader(io.StringIO(render(report_doc, "csv"))))
    cells = {(r["section"], r["pool"], r["team"], r["node"], r["metric"]): r["value"]
             for r in rows}
    for (team, pool), want in TEAMS.items():
        got = {m: v for (s, p, t, _n, m), v in cells.items()
               if s == "team" and p == pool and t == team and m != "borrow_limit_units"}
        assert got == _flat_expect(want), (team, pool)
    for pool, want in POOLS.items():
        got = {m: v for (s, p, _t, _n, m), v in cells.items() if s == "pool" and p == pool}
        assert got == _flat_expect(want), pool
    for node, want in POWER.items():
        got = {m: v for (s, _p, _t, n, m), v in cells.items() if s == "power" and n == node}
        assert got == _flat_expect(want), node
    assert cells[("month", "", "", "", "hours")] == "720"
    assert cells[("recommendation", "train", "", "", "action")] == "neither"


def _cell_text(value: Any) -> str:
    return num(value)


def _check_tables(tables: dict[str, list[list[str]]]) -> None:
    """``tables``: title -> rows (first row the header) as the md and html outputs show."""
    labels = dict(TEAM_COLUMNS)
    for pool in POOLS:
        rows = tables[f"Teams in pool {pool}"]
        header = rows[0]
        by_label = {r[0]: r[1:] for r in rows[1:]}
        for (team, tpool), want in TEAMS.items():
            if tpool != pool:
                continue
            col = header.index(team) - 1
            for name, value in want.items():
                assert by_label[labels[name]][col] == _cell_text(value), (team, pool, name)
    plabels = dict(POOL_COLUMNS)
    rows = tables["Pools: demand against capacity"]
    header = rows[0]
    by_label = {r[0]: r[1:] for r in rows[1:]}
    for pool, want in POOLS.items():
        col = header.index(pool) - 1
        for name, value in want.items():
            assert by_label[plabels[name]][col] == _cell_text(value), (pool, name)
    rows = tables["Power per node"]
    assert rows[1] == ["t0", "train", "2", "600", num(AVG_T0), num(600 / AVG_T0)]


def test_markdown_matches_the_hand_figures(report_doc: dict[str, Any]) -> None:
    text = render(report_doc, "md")
    tables: dict[str, list[list[str]]] = {}
    title = ""
    for line in text.splitlines():
        if line.startswith("## "):
            title = line[3:]
        elif line.startswith("|") and not line.startswith("|---"):
            cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
            tables.setdefault(title, []).append([c.replace("\\|", "|") for c in cells])
    _check_tables(tables)
    assert "**train: neither**" in text


class _Tables(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[str, list[list[str]]] = {}
        self.title = ""
        self.in_h2 = False
        self.cell: list[str] | None = None
        self.row: list[str] | None = None
        self.external: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name in ("src", "href") and value:
                self.external.append(value)
        if tag == "h2":
            self.in_h2, self.title = True, ""
        elif tag == "tr":
            self.row = []
        elif tag in ("td", "th") and self.row is not None:
            self.cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "h2":
            self.in_h2 = False
        elif tag in ("td", "th") and self.cell is not None and self.row is not None:
            self.row.append("".join(self.cell))
            self.cell = None
        elif tag == "tr" and self.row is not None:
            self.tables.setdefault(self.title, []).append(self.row)
            self.row = None

    def handle_data(self, data: str) -> None:
        if self.in_h2:
            self.title += data
        elif self.cell is not None:
            self.cell.append(data)


def test_html_matches_the_hand_figures_and_is_self_contained(
    report_doc: dict[str, Any],
) -> None:
    text = render(report_doc, "html")
    parser = _Tables()
    parser.feed(text)
    _check_tables(parser.tables)
    assert parser.external == []  # no links, scripts or images fetched from anywhere
    assert text.count("<svg") == 3  # GPU-hours per team per day, utilisation, queue wait
    assert 'data-pool="train" data-action="neither"' in text


def test_series_of_the_plots(report_doc: dict[str, Any]) -> None:
    s = report_doc["series"]
    assert s["days"] == 30
    vision = s["gpu_hours_per_team_day"]["vision"]
    # g1 0..100 h: days 1-4 full (24 each) and 4 h on day 5; g2 10..30 h: 14 h day 1, 6 h day 2
    assert vision[:6] == [24 + 14, 24 + 6, 24, 24, 4, 0]
    assert vision[20:22] == [0.5 * 4, 0.5 * 6]  # g6 500..510 h: 4 h on day 21, 6 h on day 22
    assert sum(vision) == 125
    # measured GPU-hours by use of the share: g2 10 % (20 h) -> bin 1; g1 50 % (100 h) -> bin 5;
    # g4 80 % (5 h) and g5 80 % of its quarter (5 h) -> bin 8; g6 10 % of its half (5 h) -> 1
    assert s["util_histogram_gpu_hours"] == [0, 25, 0, 0, 0, 100, 0, 0, 10, 0]
    assert s["wait_median_per_day_s"][0] == 1800  # r1 0 s and r2 3600 s on day 1
    assert s["wait_median_per_day_s"][1] == 1800  # r3 on day 2 (29.5 h)
    assert s["wait_p95_per_day_s"][:3] == [3600, 1800, None]  # nearest rank; none on day 3


def test_no_power_in_heartbeats_is_said(tmp_path: Any) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'db.sqlite'}")
    beats = [(g, ts, [{k: v for k, v in x.items() if k != "power_w"} for x in gpus])
             for g, ts, gpus in HEARTBEATS]
    write_rows(engine, GRANTS, REQUESTS, beats)
    rows = load_month(engine, month_policy(), 2026, 11)
    engine.dispose()
    _, _, doc = make_report(rows)
    assert doc["power"] == []
    assert "no power samples" in doc["power_note"]
    assert doc["power_note"] in render(doc, "md")
    assert "no power samples" in render(doc, "html")


def test_p95_is_the_nearest_rank() -> None:
    from jupyter_gpushare.report.figures import median, p95

    values = [float(v) for v in range(1, 21)]  # 20 values: rank ceil(0.95 x 20) = 19
    assert p95(values) == 19.0 and median(values) == 10.5
    assert p95([]) is None and median([]) is None


def test_cli_report_every_format(tmp_path: Any) -> None:
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parent.parent
    db = tmp_path / "gpushare.sqlite"
    engine = make_engine(f"sqlite:///{db}")
    write_rows(engine, GRANTS, REQUESTS, HEARTBEATS)
    engine.dispose()
    policy = repo / "hub_config" / "gpushare.yaml"

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", "import sys; from jupyter_gpushare.cli import main; "
             "sys.exit(main())", "report", *args],
            capture_output=True, text=True, timeout=120, cwd=tmp_path,
        )

    for fmt in ("json", "csv", "md", "html"):
        out = tmp_path / f"r.{fmt}"
        done = run("--month", "2026-11", "--format", fmt, "--db", f"sqlite:///{db}",
                   "--policy", str(policy), "-o", str(out))
        assert done.returncode == 0, done.stderr
        assert "2026-11" in out.read_text()
    doc = json.loads((tmp_path / "r.json").read_text())
    teams = {(t["team"], t["pool"]): t for t in doc["teams"]}
    assert teams[("vision", "train")]["granted_gpu_hours"] == 120.0
    bad = run("--month", "2026-13", "--policy", str(policy))
    assert bad.returncode == 2 and "--month: expected YYYY-MM" in bad.stderr
    missing = run("--month", "2026-11", "--db", f"sqlite:///{tmp_path / 'nope.sqlite'}",
                  "--policy", str(policy))
    assert missing.returncode == 2 and "--db: no database file" in missing.stderr
