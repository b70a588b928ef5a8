"""Issue 23, findings 15-17 and 14 (report side): the figures an admin buys GPUs with.

* 15: one end record per grant (``core.grant_end``): every path that ends a grant writes
  it, and the admin page, the report, the metrics and the ledger read it;
* 16: a month in progress is reported up to the report's ``now`` and labelled partial;
* 17: numbers keep the zeros of their integer part (admin page and report);
* 14: the report escapes what it writes (Markdown/HTML, CSV formulas).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from brokerpolicies import small
from corefactory import request as ask
from sqlalchemy import select, text

from jupyter_gpushare.broker.api.admin_page import recent_events
from jupyter_gpushare.broker.ops.culler import GPUCuller
from jupyter_gpushare.broker.ops.metrics import BrokerMetrics
from jupyter_gpushare.broker.service.broker import Broker
from jupyter_gpushare.broker.service.preempt import PreemptionRunner
from jupyter_gpushare.broker.store.db import (
    MIGRATIONS,
    grants_table,
    make_engine,
    migrate,
    requests_table,
    schema_table,
)
from jupyter_gpushare.core.culling import CullRule
from jupyter_gpushare.core.grant_end import EndFacts, EndKind, GrantEnd, classify, resolve
from jupyter_gpushare.core.ledger import month_bounds
from jupyter_gpushare.core.model import Kind
from jupyter_gpushare.report import make_report
from jupyter_gpushare.report.document import num
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
from jupyter_gpushare.report.source import load_month

REPO = Path(__file__).resolve().parent.parent
ADMIN_JS = REPO / "jupyter_gpushare/broker/api/static/admin.js"
T0 = 1_790_000_000.0  # 2026-09-21, mid-month


# -- an in-process broker with a clock -------------------------------------------------------


class Clock:
    def __init__(self, t: float = T0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture(params=[True, False], ids=["fast-sql", "sqlalchemy"])
def broker(tmp_path: Path, request: pytest.FixtureRequest) -> Any:
    clock = Clock()
    engine = make_engine(f"sqlite:///{tmp_path}/b.sqlite")
    metrics = BrokerMetrics()
    b = Broker(small(), engine, clock=clock, raw_sql=request.param, observer=metrics)
    b.load()
    metrics.broker = b
    b.test_clock = clock  # type: ignore[attr-defined]
    b.test_metrics = metrics  # type: ignore[attr-defined]
    yield b
    b.close()
    engine.dispose()


def _row(b: Broker, gid: str) -> Any:
    with b.engine.connect() as conn:
        return conn.execute(select(grants_table).where(grants_table.c.id == gid)).one()


def _borrow_all_then_preempt(b: Broker) -> tuple[list[str], str, list[str]]:
    """Team b borrows the 4 train GPUs; team a asks for 1 inside its guarantee."""
    held = []
    for i in range(4):
        ans = b.submit(ask("b", "train", whole=1, user=f"bob{i}", priority="research",
                           kind=Kind.BATCH, checkpointing=True))
        assert ans["status"] == "granted", ans
        held.append(ans["grant"]["id"])
    ans = b.submit(ask("a", "train", whole=1, user="alice", priority="training"))
    assert ans["status"] == "preempting", ans
    return held, ans["request_id"], list(ans["victims"])


def _releases(b: Broker, kind: str) -> float:
    return float(b.test_metrics.releases.labels(kind)._value.get())  # type: ignore[attr-defined]


# -- 15: the end record ----------------------------------------------------------------------


def test_holder_release_while_being_preempted_is_a_preemption(broker: Broker) -> None:
    """The victim's own stop (its spawner's DELETE, 'released by holder') racing with the
    deadline still counts as preempted, by the waiting request and its team."""
    _, rid, victims = _borrow_all_then_preempt(broker)
    broker.test_clock.t += 0.5  # type: ignore[attr-defined]
    assert broker.release(victims[0], "released by holder")
    row = _row(broker, victims[0])
    assert row.end_kind == "preempted"
    assert (row.ended_by_request, row.ended_by_team) == (rid, "a")
    assert row.release_reason.startswith("preempted")
    assert _releases(broker, "preempted") == 1 and _releases(broker, "released") == 0
    # the admin page and the report read the same record
    events = recent_events(broker.engine, [])
    assert [(p["grant_id"], p["by_team"]) for p in events["preemptions"]] == [(victims[0], "a")]
    now = broker.test_clock.t + 1  # type: ignore[attr-defined]
    rows = load_month(broker.engine, broker.policy, 2026, 9, now=now)
    figures, _, doc = make_report(rows)
    team_b = next(t for t in doc["teams"] if (t["team"], t["pool"]) == ("b", "train"))
    assert team_b["preemptions"] == {"reclaimed": 1}


async def test_preemption_at_the_deadline_is_recorded_as_preempted(broker: Broker) -> None:
    held, rid, victims = _borrow_all_then_preempt(broker)
    runner = PreemptionRunner(None, None)
    runner.broker = broker
    broker.test_clock.t += 2  # type: ignore[attr-defined]
    await runner.execute(rid)
    for gid in victims:
        row = _row(broker, gid)
        assert (row.end_kind, row.ended_by_request, row.ended_by_team) == ("preempted", rid, "a")
    untouched = [g for g in held if g not in victims]
    assert all(_row(broker, g).released_at is None for g in untouched)
    assert _releases(broker, "preempted") == len(victims)
    events = recent_events(broker.engine, [])
    assert {p["grant_id"] for p in events["preemptions"]} == set(victims)


def test_a_plain_release_and_a_cancelled_preemption_stay_released(broker: Broker) -> None:
    held, rid, victims = _borrow_all_then_preempt(broker)
    broker.cancel(rid)  # the waiter gave up: the victims are no longer being preempted
    broker.release(victims[0], "released by holder")
    assert _row(broker, victims[0]).end_kind == "released"
    assert _row(broker, victims[0]).ended_by_request is None
    assert recent_events(broker.engine, [])["preemptions"] == []


class _Hub:
    """A hub whose server stop makes the spawner release the grant (as JupyterHub does)."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.stopped: list[tuple[str, str]] = []

    async def stop_server(self, user: str, server: str) -> None:
        self.stopped.append((user, server))
        for gid, g in list(self.broker.state.grants.items()):
            if g.user == user and g.request.holder == server:
                self.broker.release(gid, "released by holder")

    async def get_user(self, user: str) -> dict[str, Any]:
        return {"servers": {}}


async def test_a_cull_is_recorded_as_culled_even_when_the_spawner_releases_first(
    broker: Broker,
) -> None:
    ans = broker.submit(ask("a", "shared", fraction=0.25, user="carol"))
    gid = ans["grant"]["id"]
    culler = GPUCuller(broker, _Hub(broker))  # type: ignore[arg-type]
    facts = culler.facts(gid, broker.test_clock.t)  # type: ignore[attr-defined]
    assert await culler._act(gid, facts, CullRule(window_s=60, warn_s=1)) is not None
    row = _row(broker, gid)
    assert row.end_kind == "culled" and row.release_reason.startswith("culled")
    assert _releases(broker, "culled") == 1
    figures, _, _ = make_report(load_month(broker.engine, broker.policy, 2026, 9,
                                           now=broker.test_clock.t + 1))  # type: ignore[attr-defined]
    assert sum(f.culled for f in figures.teams) == 1


def test_reconcile_and_node_loss_write_their_kinds(broker: Broker) -> None:
    g1 = broker.submit(ask("a", "shared", fraction=0.25, user="u1"))["grant"]["id"]
    g2 = broker.submit(ask("a", "train", whole=1, user="u2"))["grant"]["id"]
    broker.release(g1, "reconciled: server gone",
                   end=GrantEnd(EndKind.RECONCILED, "reconciled: server gone"))
    assert _row(broker, g1).end_kind == "reconciled"
    pol = broker.policy
    without = dataclasses.replace(pol, nodes=tuple(n for n in pol.nodes if n.name != "train-n0"))
    broker.replace_policy(without)
    assert _row(broker, g2).end_kind == "node_lost"
    assert _releases(broker, "node_lost") == 1


def test_the_end_rule() -> None:
    """core.grant_end.resolve at its edges (pure)."""
    base = EndFacts(now=1000.0, granted_at=0.0)
    assert resolve("released by holder", base).kind is EndKind.RELEASED
    # expiry at the profile's lifetime (within the slack), not a second before the slack
    assert resolve("released by holder", dataclasses.replace(
        base, max_lifetime_s=1000.0)).kind is EndKind.EXPIRED
    assert resolve("released by holder", dataclasses.replace(
        base, max_lifetime_s=1005.0)).kind is EndKind.EXPIRED
    assert resolve("released by holder", dataclasses.replace(
        base, max_lifetime_s=1006.0)).kind is EndKind.RELEASED
    # a preemption in progress wins over a holder's release and over the lifetime
    pre = dataclasses.replace(base, max_lifetime_s=10.0, preempting_for="r9",
                              preempting_team="t", preempting_why="preempted: x")
    assert resolve("released by holder", pre) == GrantEnd(EndKind.PREEMPTED, "preempted: x",
                                                          "r9", "t")
    # an explicit end the broker determined stands (node lost while being preempted)
    lost = GrantEnd(EndKind.NODE_LOST, "node gone")
    assert resolve("x", pre, lost) is lost
    assert resolve("released", dataclasses.replace(base, culling_why="culled: y")).kind is (
        EndKind.CULLED)
    # legacy reasons
    assert classify("preempted: for r1") is EndKind.PREEMPTED
    assert classify("culled: no GPU activity") is EndKind.CULLED
    assert classify("reconciled: server gone") is EndKind.RECONCILED
    assert classify("released: job's node n1 failed") is EndKind.NODE_LOST
    assert classify("released: the new policy has no room for it (x)") is EndKind.POLICY
    assert classify(None) is EndKind.RELEASED


def test_old_rows_are_migrated_to_end_records(tmp_path: Path) -> None:
    """A schema-5 database: closed rows get the kind their reason says and, when preempted,
    the request (and its team) their preemption mark named."""
    engine = make_engine(f"sqlite:///{tmp_path}/old.sqlite")
    with engine.begin() as conn:
        schema_table.create(conn)
        for _version, _, func in MIGRATIONS[:5]:
            func(conn)
        conn.execute(text("DROP INDEX ix_gpushare_grants_end"))
        for col in ("end_kind", "ended_by_request", "ended_by_team"):
            conn.execute(text(f"ALTER TABLE gpushare_grants DROP COLUMN {col}"))
        conn.execute(schema_table.insert().values(id=1, version=5))
    g = dict(username="u", server="", team="b", pool="train", profile="", kind="batch",
             node="train-n0", slices=[], units_milli=1000, borrowed=True, preemptible=True,
             priority="research", priority_value=100, grace_period_s=1, spec={},
             granted_at=T0, preempt_for=None)
    with engine.begin() as conn:
        conn.execute(requests_table.insert().values(
            id="rA", username="alice", server="", team="a", pool="train", kind="interactive",
            profile="", status="granted", reason="", code="", spec={}, created_at=T0,
            updated_at=T0))
        conn.execute(grants_table.insert(), [  # (only the columns given)
            dict(g, id="g1", request_id="q1", released_at=T0 + 10,
                 release_reason="preempted: team a reclaims", preempt_for="rA"),
            dict(g, id="g2", request_id="q2", released_at=T0 + 10,
                 release_reason="culled: idle 2 h"),
            dict(g, id="g3", request_id="q3", released_at=T0 + 10,
                 release_reason="released by holder"),
            dict(g, id="g4", request_id="q4", released_at=None, release_reason=None),
        ])
    assert migrate(engine) == [6, 7]  # 7: jobs idempotency, nothing to do with grants
    with engine.connect() as conn:
        got = {r.id: (r.end_kind, r.ended_by_request, r.ended_by_team)
               for r in conn.execute(select(grants_table))}
    assert got == {"g1": ("preempted", "rA", "a"), "g2": ("culled", None, None),
                   "g3": ("released", None, None), "g4": (None, None, None)}
    engine.dispose()


# -- 16: a month in progress -----------------------------------------------------------------

S, E = month_bounds(2026, 11)
H = 720.0


def _month(now: float | None) -> MonthRows:
    """One pool of 4 GPUs; team a (guarantee 2, budget 2000 GPU-h) holds 2 GPUs from the
    month's start on (still open), team b waits for 1 from the start (still queued)."""
    grants = tuple(
        GrantRow(f"g{i}", f"r{i}", "alice", "a", "p", "n0", 1.0, False, S, None, "",
                 (SliceRow(f"GPU-{i}", 80000, 1.0),))
        for i in range(2)
    )
    requests = tuple(
        RequestRow(f"r{i}", "alice", "a", "p", 1.0, "granted", "guaranteed", S, S, S)
        for i in range(2)
    ) + (RequestRow("rq", "bob", "b", "p", 1.0, "queued", "no_capacity", S, S),)
    return MonthRows(
        year=2026, month=11, start=S, end=E,
        pools=(PoolRow("p", 4.0, 4, ("n0",)),),
        quotas=(QuotaRow("a", "p", 2.0, 2.0, 2000.0), QuotaRow("b", "p", 2.0, 2.0, 1500.0)),
        grants=grants, requests=requests,
        usage=tuple(UsageRow(g.id, {g.slices[0].gpu_uuid: GPUUse(3, 50.0, 1000.0)})
                    for g in grants),
        now=now,
    )


def test_a_month_in_progress_stops_at_now_and_says_so() -> None:
    now = S + 20 * 60  # 20 minutes into the month
    figures, recs, doc = make_report(_month(now))
    a = next(f for f in figures.teams if f.team == "a")
    b = next(f for f in figures.teams if f.team == "b")
    third = 20 / 60
    assert figures.partial and figures.hours == pytest.approx(third)
    assert a.granted_gpu_hours == pytest.approx(2 * third)  # not 2 x 720
    assert b.queued_gpu_hours == pytest.approx(third)  # not 720
    assert a.guaranteed_gpu_hours == pytest.approx(2 * third)
    assert figures.pools[0].capacity_gpu_hours == pytest.approx(4 * third)
    assert a.budget_used_share == pytest.approx(2 * third / 2000)  # of the budget, so far
    assert figures.series.days == 1  # no bar on a day still to come
    assert len(figures.series.gpu_hours_per_team_day["a"]) == 1
    # the recommendation is withheld this early; the projection stands apart, labelled
    assert [r.action for r in recs] == ["withheld"]
    assert "in progress" in recs[0].text
    assert doc["projection"]["granted_gpu_hours"]["a/p"] == pytest.approx(2 * H)
    assert "not a measurement" in doc["projection"]["label"]
    label = "partial: 2026-11-01T00:00:00Z to 2026-11-01T00:20:00Z"
    assert doc["period"] == label and doc["partial"] is True
    for fmt in ("md", "html", "csv", "json"):
        assert label in render(doc, fmt), fmt
    md = render(doc, "md")
    assert "budget used so far" in md and "## Projection (not a measurement)" in md
    assert "1440" not in md.split("## Projection")[0]  # the projection only in its section


def test_a_partial_month_past_the_threshold_is_provisional_and_a_finished_one_is_not() -> None:
    _, recs, _ = make_report(_month(S + 0.5 * H * 3600))
    assert recs[0].provisional and recs[0].text.startswith("Provisional")
    assert recs[0].action != "withheld"
    figures, recs, doc = make_report(_month(E + 5))
    assert not figures.partial and not recs[0].provisional and doc["projection"] is None
    assert doc["period"] == "2026-11-01T00:00:00Z to 2026-12-01T00:00:00Z"
    a = next(f for f in figures.teams if f.team == "a")
    assert a.granted_gpu_hours == pytest.approx(2 * H)
    _, recs, _ = make_report(_month(None))  # no now: the whole month (rows already cut)
    assert not recs[0].provisional


def test_the_withholding_threshold_exactly_and_either_side() -> None:
    """min_elapsed_share 0.25: one second below withholds, exactly at it does not."""
    at = S + 0.25 * H * 3600
    assert make_report(_month(at - 1))[1][0].action == "withheld"
    assert make_report(_month(at))[1][0].action != "withheld"
    assert make_report(_month(at + 1))[1][0].action != "withheld"


def test_the_cli_reports_a_month_in_progress_up_to_now(tmp_path: Path) -> None:
    db = tmp_path / "g.sqlite"
    engine = make_engine(f"sqlite:///{db}")
    migrate(engine)
    b = Broker(small(), engine, clock=lambda: S + 600)
    b.load()
    b.submit(ask("a", "train", whole=2, user="alice"))
    engine.dispose()
    policy = tmp_path / "p.yaml"
    policy.write_text((REPO / "hub_config" / "gpushare.yaml").read_text())
    done = subprocess.run(
        [str(REPO / ".venv/bin/python"), "-c",
         "import sys; from jupyter_gpushare.cli import main; sys.exit(main())", "report",
         "--month", "2026-11", "--format", "json", "--db", f"sqlite:///{db}", "--policy",
         str(policy), "--now", "2026-11-01T00:20:00Z"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["partial"] and doc["until"] == "2026-11-01T00:20:00Z"
    team = next(t for t in doc["teams"] if t["team"] == "a")
    assert team["granted_gpu_hours"] == pytest.approx(2 * 10 / 60, abs=1e-3)


# -- 17: numbers -----------------------------------------------------------------------------

NUMBERS = [(2000.0, "2000"), (1500.0, "1500"), (10.0, "10"), (0.5, "0.5"), (0.0, "0"),
           (2000, "2000"), (1500, "1500"), (-0.00001, "0"), (1234.50001, "1234.5")]


@pytest.mark.parametrize(("value", "want"), NUMBERS)
def test_report_number_text(value: float, want: str) -> None:
    assert num(value) == want


def _admin_n() -> str:
    js = ADMIN_JS.read_text()
    m = re.search(r"// BEGIN n\n(.*?)// END n", js, re.S)
    assert m, "admin.js lost its number formatter block"
    return m.group(1)


def test_admin_page_number_text() -> None:
    """The admin page's own formatter (admin.js, run in node) at the budget's decimals."""
    cases = [(2000, 3), (1500, 3), (10, 3), (0.5, 3), (0, 3), (2000, 0), (1500, 0), (10, 0),
             (2000, 1), (0.5, 1), (1500.25, 1), (-0.0001, 2)]
    script = _admin_n() + f"console.log(JSON.stringify({json.dumps(cases)}.map(" \
        "([x, d]) => n(x, d))));"
    out = subprocess.run(["node", "-e", script], capture_output=True, text=True, timeout=30,
                         check=True).stdout
    assert json.loads(out) == ["2000", "1500", "10", "0.5", "0", "2000", "1500", "10",
                               "2000", "0.5", "1500.3", "0"]
    js = ADMIN_JS.read_text()
    assert "n(t.gpu_hours_budget, 3)" in js  # the budget keeps its fraction (0.5 stays 0.5)


def test_report_shows_budgets_whole() -> None:
    _, _, doc = make_report(_month(None))
    md = render(doc, "md")
    row = next(line for line in md.splitlines() if line.startswith("| budget GPU-h"))
    assert row.split(" | ")[1:] == ["2000", "1500 |"]
    rows = list(csv.reader(io.StringIO(render(doc, "csv"))))
    assert ["team", "p", "a", "", "budget_gpu_hours", "2000"] in rows
    assert ["team", "p", "b", "", "budget_gpu_hours", "1500"] in rows


# -- 14: escaping ----------------------------------------------------------------------------

HOSTILE = "<img src=x onerror=alert(1)>"


def _hostile_doc() -> dict[str, Any]:
    rows = _month(None)
    names = {"a": HOSTILE, "b": "=HYPERLINK(\"http://x\")|x\nnew"}
    rows = dataclasses.replace(
        rows,
        quotas=tuple(dataclasses.replace(q, team=names[q.team]) for q in rows.quotas),
        grants=tuple(dataclasses.replace(g, team=names[g.team]) for g in rows.grants),
        requests=tuple(dataclasses.replace(r, team=names[r.team]) for r in rows.requests),
    )
    return make_report(rows)[2]


def test_markdown_and_html_escape_team_names() -> None:
    doc = _hostile_doc()
    md = render(doc, "md")
    assert "<img" not in md and "&lt;img src=x onerror=alert(1)&gt;" in md
    table = [line for line in md.splitlines() if line.startswith("| figure") and "img" in line]
    assert table and all(line.count(" | ") == 2 for line in table)  # "|" escaped, no newline
    assert "\\|x new" in md
    html = render(doc, "html")
    assert "<img" not in html


@pytest.mark.parametrize("lead", ["=", "+", "-", "@", "\t", "\r"])
def test_csv_cells_never_start_a_formula(lead: str) -> None:
    rows = _month(None)
    name = lead + "cmd|' /C calc'!A0"
    rows = dataclasses.replace(
        rows,
        quotas=tuple(dataclasses.replace(q, team=name if q.team == "a" else q.team)
                     for q in rows.quotas),
    )
    out = list(csv.reader(io.StringIO(render(make_report(rows)[2], "csv"))))
    cells = [c for r in out for c in r]
    assert "'" + name.replace("\r", "\n") in cells
    assert not any(c.startswith(lead) for c in cells if c and not _is_number(c))


def _is_number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


def test_a_release_at_the_profiles_lifetime_is_an_expiry(tmp_path: Path) -> None:
    """A server stopped at its profile's ``max_lifetime`` (2 h for debug-eighth) ends as
    ``expired``; one stopped earlier as ``released``."""
    from jupyter_gpushare.core.model import GPUAsk, Request
    from jupyter_gpushare.policy import load_policy

    pol = load_policy(str(REPO / "hub_config" / "gpushare.yaml"))
    clock = Clock(S)
    engine = make_engine(f"sqlite:///{tmp_path}/e.sqlite")
    b = Broker(pol, engine, clock=clock)
    b.load()
    ids = []
    for user in ("ann", "ben"):
        req = Request(id=f"r-{user}", user=user, team="vision", pool="debug",
                      gpu=GPUAsk(fraction_milli=125), priority="interactive",
                      kind=Kind.INTERACTIVE, holder="", profile="debug-eighth")
        ans = b.submit(req)
        assert ans["status"] == "granted", ans
        ids.append(ans["grant"]["id"])
    clock.t = S + 3600
    b.release(ids[0], "released by holder")
    clock.t = S + 2 * 3600
    b.release(ids[1], "released by holder")
    assert [_row(b, g).end_kind for g in ids] == ["released", "expired"]
    assert _row(b, ids[1]).release_reason.startswith("expired: max lifetime 7200 s")
    b.close()
    engine.dispose()


RENDER_JS = r"""
const fs = require("fs");
const overview = JSON.parse(fs.readFileSync(process.argv[1], "utf8"));
const root = {dataset: {pollMs: "3600000"}, innerHTML: "", querySelector: () => null,
              addEventListener: () => {}};
let start = null;
global.document = {getElementById: () => root};
global.window = {addEventListener: (ev, fn) => { start = fn; }};
global.gpushare = {api: async () => overview};
global.setTimeout = () => {};
eval(fs.readFileSync(process.argv[2], "utf8"));
start().then(() => process.stdout.write(root.innerHTML));
"""


def test_the_admin_page_draws_budgets_whole_and_the_preemption(tmp_path: Path) -> None:
    """The page's own script (admin.js, in node with a stub DOM) draws the overview of a
    real broker: vision's budget 2000 and nlp's 1500 GPU-h (hub_config/gpushare.yaml) as
    such, and a victim's own stop during its grace period under "Recent preemptions"."""
    from jupyter_gpushare.broker.api.admin_page import live_overview
    from jupyter_gpushare.core.model import GPUAsk, Request
    from jupyter_gpushare.policy import load_policy

    pol = load_policy(str(REPO / "hub_config" / "gpushare.yaml"))
    clock = Clock(S)
    engine = make_engine(f"sqlite:///{tmp_path}/a.sqlite")
    b = Broker(pol, engine, clock=clock)
    b.load()
    # nlp (6) and research (2) fill the 8 train GPUs, beyond their guarantees: borrowed
    for i, team in enumerate(["nlp"] * 6 + ["research"] * 2):
        req = Request(id=f"n{i}", user=f"nick{i}", team=team, pool="train",
                      gpu=GPUAsk(whole=1), priority="research", kind=Kind.BATCH,
                      holder=f"job{i}", checkpointing=True)
        assert b.submit(req)["status"] == "granted"
    ans = b.submit(Request(id="v1", user="vera", team="vision", pool="train",
                           gpu=GPUAsk(whole=1), priority="training", kind=Kind.INTERACTIVE,
                           holder="srv"))
    assert ans["status"] == "preempting", ans
    victim = ans["victims"][0]
    clock.t += 5
    b.release(victim, "released by holder")  # its holder stops it before the deadline
    data = live_overview(b, None)
    data.update({k: v for k, v in recent_events(engine, []).items() if k != "reasons"})
    data["policy_version"] = "test"
    path = tmp_path / "overview.json"
    path.write_text(json.dumps(data))
    html = subprocess.run(
        ["node", "-e", RENDER_JS, str(path), str(ADMIN_JS)],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout
    budgets = dict(re.findall(
        r'<tr data-team="([^"]+)" data-pool="train">.*?<td class="num">([^<]*)</td></tr>', html))
    assert budgets["vision"] == "2000" and budgets["nlp"] == "1500", budgets
    section = html.split("Recent preemptions")[1].split("Recent refusals")[0]
    assert "none" not in section and "vision" in section and "nick" in section
    b.close()
    engine.dispose()
