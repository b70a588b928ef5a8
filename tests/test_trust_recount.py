"""An independent recount of the monthly report and the admin page (issue 23).

A seeded generator drives the broker's real code paths (``Broker.submit``, ``release``,
``cancel``, the preemption runner at the deadline, the GPU idle culler with a hub whose
stop makes the spawner release, heartbeats through the broker's ``UseRecorder``) over
2026-10-28 .. 2026-12-03, so grants cross both boundaries of November. It uses fractions,
borrowing, preemptions (the victim's own release racing with the deadline half of the
time), requeued batch attempts, heartbeats with power and culling.

The generator keeps its OWN log of what it did and saw (when each request was made and
granted, each grant's units/borrowed/GPUs and when it ended and how, every heartbeat
sample). From that log alone, this file recomputes the figures by a separate, plain
implementation: minute-by-minute integration of who held what (every event falls on a
whole minute, so the minute sums are exact), plain means of the samples, and the power
rule. Nothing of ``core.ledger``, ``broker.ledger*`` or ``report.figures`` is called for
the expected side. Tolerance: 1e-6 GPU-hours (float sums) for report figures; the admin
page rounds GPU-hours to 3 decimals, so 6e-4 there.

Compared: GPU-hours granted/borrowed/guaranteed/lent/queued/measured/used per team and
pool, per-pool capacity, occupancy and utilisation, budget shares, preemption counts
(reclaimed/priority) and culls, request, grant and refusal counts, queue-wait median and
p95, per-day GPU-hours per team, node peak and average power; a partial report taken at
a moment inside November (stopping at that moment); and the admin page's per-team
in-use, borrowed and month GPU-hours at checkpoints (one just after Nov 1 00:00).
"""

from __future__ import annotations

import dataclasses
import math
import random
import statistics
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from brokerpolicies import explicit
from corefactory import policy as make_policy

from jupyter_gpushare.broker.api.admin_page import live_overview, recent_events
from jupyter_gpushare.broker.ops.culler import GPUCuller
from jupyter_gpushare.broker.ops.metrics import BrokerMetrics
from jupyter_gpushare.broker.service.broker import Broker
from jupyter_gpushare.broker.service.preempt import PreemptionRunner
from jupyter_gpushare.broker.store.db import make_engine
from jupyter_gpushare.core.culling import CullRule
from jupyter_gpushare.core.model import GPUAsk, Kind, PriorityClass, Request, SharingMode
from jupyter_gpushare.report import make_report
from jupyter_gpushare.report.source import load_month

SEED = 20261123
TOL = 1e-6
ADMIN_TOL = 6e-4
MIN = 60.0


def utc(*a: int) -> float:
    return datetime(*a, tzinfo=timezone.utc).timestamp()  # type: ignore[misc]


NOV, DEC = utc(2026, 11, 1), utc(2026, 12, 1)
BEGIN, STOP = utc(2026, 10, 28), utc(2026, 12, 3)
PARTIAL_AT = utc(2026, 11, 17, 9, 13)  # the partial report is taken at this moment

PRIORITIES = (
    PriorityClass("training", 1000, preemptible=False, grace_period_s=60),
    PriorityClass("interactive", 500, preemptible=False, grace_period_s=60),
    PriorityClass("research", 100, preemptible=True, grace_period_s=60,
                  checkpoint_required_after_s=10**7),
)
QUOTAS = {  # team -> pool -> (guaranteed, borrow limit)
    "a": {"train": (4, 2), "shared": (1, 1)},
    "b": {"train": (0, 4), "shared": (1, 2)},
    "c": {"train": (2, 2), "shared": (1, 1)},
}
BUDGETS = {"a": 2000.0, "b": 1500.0, "c": 300.0}


def the_policy() -> Any:
    pol = make_policy(QUOTAS, pools={"train": SharingMode.EXCLUSIVE,
                                     "shared": SharingMode.SHARED},
                      node_count=2, gpus=4, budgets=BUDGETS, priorities=PRIORITIES)
    # shared: one node of 4 cards is enough (and keeps fractions packed)
    pol = dataclasses.replace(pol, nodes=tuple(n for n in pol.nodes if n.name != "shared-n1"))
    return explicit(pol)


# -- the generator's own log -------------------------------------------------------------------


@dataclasses.dataclass
class Req:
    id: str
    team: str
    pool: str
    units: float
    created: float
    status: str = ""  # granted | queued | preempting | refused | cancelled
    code: str = ""
    granted: float | None = None
    ended: float | None = None  # cancelled at


@dataclasses.dataclass
class G:
    id: str
    rid: str
    user: str
    holder: str
    team: str
    pool: str
    node: str
    units: float
    borrowed: bool
    kind: Kind
    gpus: list[tuple[str, float]]  # (uuid, compute share)
    start: float
    end: float | None = None
    how: str = ""  # released | preempted | culled
    until: float = 0.0  # when its holder means to release it


@dataclasses.dataclass
class Log:
    reqs: dict[str, Req] = dataclasses.field(default_factory=dict)
    grants: dict[str, G] = dataclasses.field(default_factory=dict)
    samples: list[tuple[str, float, str, float]] = dataclasses.field(default_factory=list)
    # one entry per heartbeat that carried power: (node, ts, [(uuid, watts), ...])
    power: list[tuple[str, float, list[tuple[str, float]]]] = dataclasses.field(
        default_factory=list)
    being_preempted: set[str] = dataclasses.field(default_factory=set)
    checkpoints: list[tuple[float, dict[tuple[str, str], dict[str, float]]]] = (
        dataclasses.field(default_factory=list))


class _Hub:
    """The hub as the culler sees it: stopping a server makes its spawner release."""

    def __init__(self, sim: Sim) -> None:
        self.sim = sim

    async def stop_server(self, user: str, server: str) -> None:
        for g in list(self.sim.live()):
            if g.user == user and g.holder == server:
                self.sim.broker.release(g.id, "released by holder")

    async def get_user(self, user: str) -> dict[str, Any]:
        return {"servers": {}}


class Sim:
    def __init__(self, tmp: Path) -> None:
        self.t = BEGIN
        self.rng = random.Random(SEED)
        self.engine = make_engine(f"sqlite:///{tmp}/recount.sqlite")
        self.metrics = BrokerMetrics()
        self.broker = Broker(the_policy(), self.engine, clock=lambda: self.t,
                             observer=self.metrics)
        self.broker.load()
        self.metrics.broker = self.broker
        self.runner = PreemptionRunner(None, None)
        self.runner.broker = self.broker
        self.culler = GPUCuller(self.broker, _Hub(self))  # type: ignore[arg-type]
        self.log = Log()
        self.n = 0
        self.waiting: set[str] = set()
        self.partial: tuple[Any, Any] | None = None

    # the log ------------------------------------------------------------------------------

    def live(self) -> list[G]:
        return [g for g in self.log.grants.values() if g.end is None]

    def _note_grant(self, rid: str, gid: str) -> None:
        view = self.broker.get_grant(gid)
        assert view is not None
        r = self.log.reqs[rid]
        r.status, r.granted = "granted", self.t
        kind = Kind(view["kind"])
        hours = (self.rng.uniform(24, 150) if self.rng.random() < 0.15
                 else self.rng.expovariate(1 / 6))
        if DEC - 86400 <= self.t < DEC:
            # grants across the month's end whatever the draw (budgets run out late in the
            # month, and the broker's choices vary with set order between processes): those
            # made on its last day are held into December
            hours = max(hours, (DEC - self.t) / 3600 + 2)
        self.log.grants[gid] = G(
            gid, rid, view["user"], view["server"], view["team"], view["pool"], view["node"],
            float(view["units"]), bool(view["borrowed"]), kind,
            [(x["uuid"], x["compute_pct"] / 100.0) for x in view["gpus"]], self.t,
            until=self.t + round(hours * 60) * MIN,
        )

    def sync(self) -> None:
        """What changed in the broker at this instant, into the log."""
        live_ids = self.broker.state.grants
        by_request = {g.request.id: gid for gid, g in live_ids.items()}
        for g in self.live():
            if g.id not in live_ids:
                g.end = self.t
                # under a preemption notice when it ended: preempted, whoever stopped it
                g.how = "preempted" if g.id in self.log.being_preempted else (
                    g.how or "released")
        # the preemption notices out now (what GET /notices shows the victims)
        self.log.being_preempted = set(self.broker.state.preempting)
        for rid in list(self.waiting):
            if rid in self.broker.queue or rid in self.broker.pending:
                continue
            self.waiting.discard(rid)
            r = self.log.reqs[rid]
            if rid in by_request:
                self._note_grant(rid, by_request[rid])
            else:  # cancelled, or refused when decided again
                view = self.broker.get_request(rid)
                assert view is not None
                r.status, r.code, r.ended = view["status"], view["code"], self.t

    # actions ------------------------------------------------------------------------------

    def submit(self, team: str, pool: str, whole: int, frac: float, priority: str,
               kind: Kind, holder: str = "") -> str:
        self.n += 1
        rid = f"q{self.n}"
        user = f"{team}-u{self.rng.randrange(3)}"
        req = Request(id=rid, user=user, team=team, pool=pool,
                      gpu=GPUAsk(whole=whole, fraction_milli=round(frac * 1000)),
                      priority=priority, kind=kind, holder=holder or f"h{self.n}",
                      checkpointing=kind is Kind.BATCH)
        self.log.reqs[rid] = Req(rid, team, pool, whole + frac, self.t)
        ans = self.broker.submit(req)
        r = self.log.reqs[rid]
        r.status, r.code = ans["status"], ans["code"]
        if ans["status"] == "granted":
            self._note_grant(rid, ans["grant"]["id"])
        elif ans["status"] == "refused":
            r.ended = self.t
        else:
            self.waiting.add(rid)
        self.sync()
        return rid

    def random_submit(self) -> None:
        team = self.rng.choice("abc")
        if self.rng.random() < 0.5:
            frac = self.rng.choice([0.125, 0.25, 0.5])
            self.submit(team, "shared", 0, frac, "interactive", Kind.INTERACTIVE)
        else:
            whole = self.rng.choice([1, 1, 2])
            batch = self.rng.random() < 0.5
            self.submit(team, "train", whole, 0.0, "research" if batch else "training",
                        Kind.BATCH if batch else Kind.INTERACTIVE)

    async def deadlines(self) -> None:
        """Preemptions whose deadline passed: half the time the victim's holder stops it
        itself first (the race), then the runner carries it out; a preempted batch job
        asks again (its next attempt)."""
        for rid in list(self.broker.pending):
            pend = self.broker.pending[rid]
            if pend.deadline > self.t:
                continue
            victims = [v for v in pend.victims if v in self.broker.state.grants]
            if victims and self.rng.random() < 0.5:
                self.broker.release(victims[0], "released by holder")
            await self.runner.execute(rid)
            self.sync()
            for v in victims:
                g = self.log.grants[v]
                if g.kind is Kind.BATCH and g.end is not None:
                    self.submit(g.team, g.pool, int(g.units), 0.0, "research", Kind.BATCH,
                                holder=g.holder)  # the job's next attempt

    async def cull_one(self) -> None:
        idle = [g for g in self.live() if g.kind is Kind.INTERACTIVE
                and g.id not in self.log.being_preempted]
        if not idle:
            return
        g = self.rng.choice(idle)
        g.how = "culled"
        facts = self.culler.facts(g.id, self.t)
        await self.culler._act(g.id, facts, CullRule(window_s=60, warn_s=1))
        self.sync()

    def heartbeats(self) -> None:
        for g in self.live():
            if self.rng.random() < 0.4:
                continue
            gpus = []
            watts_of = []
            for uuid, _share in g.gpus:
                # 100 % of the card on a 1/8 share counts as at most its share
                util = self.rng.choice([0.0, 3.0, 40.0, 100.0, self.rng.uniform(0, 100)])
                item = {"uuid": uuid, "utilization_pct": util,
                        "memory_used_mib": self.rng.uniform(0, 1000)}
                if self.rng.random() < 0.8:
                    item["power_w"] = round(self.rng.uniform(60, 700), 1)
                    watts_of.append((uuid, item["power_w"]))
                gpus.append(item)
                self.log.samples.append((g.id, self.t, uuid, util))
            if watts_of:
                self.log.power.append((g.node, self.t, watts_of))
            with self.engine.begin() as conn:
                self.broker.usage.record(conn, g.id, g.node, self.t, gpus)

    def checkpoint(self) -> None:
        """What the admin page shows now (compared with the recount at the end)."""
        teams = {(t["team"], t["pool"]): t for t in live_overview(self.broker, None)["teams"]}
        self.log.checkpoints.append((self.t, teams))

    async def run(self) -> None:
        marks = [NOV + 5 * MIN, utc(2026, 11, 9, 13, 1), utc(2026, 11, 30, 23, 59), DEC + MIN]
        while self.t < STOP:
            step = self.rng.choice([1, 1, 2, 5, 10, 30, 60, 120]) * MIN
            if marks and self.t + step > marks[0] >= self.t + MIN:
                step = marks[0] - self.t
            if self.partial is None and self.t + step > PARTIAL_AT:
                step = PARTIAL_AT - self.t
            self.t += step
            await self.deadlines()
            for g in self.live():  # holders done with their grant
                # (read after each release: one release can start a preemption of another)
                if g.until <= self.t and g.end is None and g.id not in self.log.being_preempted:
                    self.broker.release(g.id, "released by holder")
                    self.sync()
            self.sync()
            roll = self.rng.random()
            if roll < 0.5:
                self.random_submit()
            elif roll < 0.55:
                queued = [r for r in self.log.reqs.values() if r.status == "queued"]
                if queued:
                    self.broker.cancel(self.rng.choice(queued).id)
                    self.sync()
            elif roll < 0.58:
                await self.cull_one()
            self.heartbeats()
            if marks and self.t == marks[0]:
                marks.pop(0)
                self.checkpoint()
            if self.partial is None and self.t == PARTIAL_AT:
                rows = load_month(self.engine, self.broker.policy, 2026, 11, now=self.t)
                self.partial = (make_report(rows)[0], _expected(self, PARTIAL_AT))
        self.broker.close()


# -- the recount (plain, minute by minute) -----------------------------------------------------


def minutes(a: float, b: float, lo: float, hi: float) -> range:
    """Indices of the minutes of [lo, hi) covered by [a, b) (all on whole minutes)."""
    first = max(a, lo)
    last = min(b, hi)
    return range(int((first - lo) // MIN), int((last - lo) // MIN)) if last > first else range(0)


@dataclasses.dataclass
class Expected:
    cut: float
    hours: float
    granted: dict[tuple[str, str], float]
    borrowed: dict[tuple[str, str], float]
    lent: dict[tuple[str, str], float]
    queued: dict[tuple[str, str], float]
    measured: dict[tuple[str, str], float]
    used: dict[tuple[str, str], float]
    preemptions: dict[tuple[str, str], dict[str, int]]
    culled: dict[tuple[str, str], int]
    requests: dict[tuple[str, str], int]
    grants: dict[tuple[str, str], int]
    refusals: dict[tuple[str, str], dict[str, int]]
    refused_hours: dict[tuple[str, str], float]
    waits: dict[tuple[str, str], list[float]]
    daily: dict[str, list[float]]
    peak: dict[str, float]
    average: dict[str, float]


def _expected(sim: Sim, cut: float) -> Expected:
    log = sim.log
    start = NOV
    n = int((cut - start) // MIN)
    hours = (cut - start) / 3600.0
    per_min: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0] * n)
    borrowed_min: dict[str, list[float]] = defaultdict(lambda: [0.0] * n)
    granted: dict[tuple[str, str], float] = defaultdict(float)
    borrowed: dict[tuple[str, str], float] = defaultdict(float)
    days = max(1, math.ceil((cut - start) / 86400))
    daily: dict[str, list[float]] = {}
    for g in log.grants.values():
        end = g.end if g.end is not None and g.end <= cut else cut
        for m in minutes(g.start, end, start, cut):
            per_min[(g.team, g.pool)][m] += g.units
            granted[(g.team, g.pool)] += g.units / 60
            if g.borrowed:
                borrowed[(g.team, g.pool)] += g.units / 60
                borrowed_min[g.pool][m] += g.units
            daily.setdefault(g.team, [0.0] * days)[int(m * MIN // 86400)] += g.units / 60
    lent: dict[tuple[str, str], float] = defaultdict(float)
    for pool in ("train", "shared"):
        teams = [t for t in QUOTAS if pool in QUOTAS[t]]
        for m in range(n):
            unused = {t: max(0.0, QUOTAS[t][pool][0] - per_min[(t, pool)][m]) for t in teams}
            total = sum(unused.values())
            f = min(1.0, borrowed_min[pool][m] / total) if total > 1e-12 else 0.0
            for t in teams:
                lent[(t, pool)] += unused[t] * f / 60
    # measured use: plain means of the samples of the month (up to the cut)
    util: dict[tuple[str, str], list[float]] = defaultdict(list)
    for gid, ts, uuid, u in log.samples:  # the month's samples, up to the cut
        if start <= ts < DEC and ts <= cut:
            util[(gid, uuid)].append(u)
    measured: dict[tuple[str, str], float] = defaultdict(float)
    used: dict[tuple[str, str], float] = defaultdict(float)
    for g in log.grants.values():
        if not any((g.id, uuid) in util for uuid, _ in g.gpus):
            continue
        end = g.end if g.end is not None and g.end <= cut else cut
        h = len(minutes(g.start, end, start, cut)) / 60
        measured[(g.team, g.pool)] += g.units * h
        use = 0.0
        for uuid, share in g.gpus:
            if (g.id, uuid) in util:
                use += min(share, statistics.fmean(util[(g.id, uuid)]) / 100)  # clipped
        used[(g.team, g.pool)] += use * h
    preemptions: dict[tuple[str, str], dict[str, int]] = defaultdict(dict)
    culled: dict[tuple[str, str], int] = defaultdict(int)
    durations: dict[str, list[float]] = defaultdict(list)
    grants_made: dict[tuple[str, str], int] = defaultdict(int)
    for g in log.grants.values():
        if start <= g.start < cut:
            grants_made[(g.team, g.pool)] += 1
        if g.end is None or not start <= g.end < cut:
            continue
        durations[g.pool].append((g.end - g.start) / 3600)
        if g.how == "preempted":
            why = "reclaimed" if g.borrowed else "priority"
            d = preemptions[(g.team, g.pool)]
            d[why] = d.get(why, 0) + 1
        elif g.how == "culled":
            culled[(g.team, g.pool)] += 1
    queued: dict[tuple[str, str], float] = defaultdict(float)
    requests: dict[tuple[str, str], int] = defaultdict(int)
    refusals: dict[tuple[str, str], dict[str, int]] = defaultdict(dict)
    refused_hours: dict[tuple[str, str], float] = defaultdict(float)
    waits: dict[tuple[str, str], list[float]] = defaultdict(list)
    for r in log.reqs.values():
        if r.created >= cut:
            continue
        key = (r.team, r.pool)
        granted_at = r.granted if r.granted is not None and r.granted < cut else None
        if granted_at is not None:
            wait_end = granted_at
        elif r.ended is not None and r.ended < cut:  # refused or cancelled
            wait_end = r.ended
        else:  # still waiting at the cut
            wait_end = cut
        queued[key] += r.units * len(minutes(r.created, wait_end, start, cut)) / 60
        if not start <= r.created < cut:
            continue
        requests[key] += 1
        if r.status == "refused" and r.ended is not None and r.ended < cut:
            refusals[key][r.code] = refusals[key].get(r.code, 0) + 1
            d = durations.get(r.pool)
            refused_hours[key] += r.units * (statistics.median(d) if d else 1.0)
        if granted_at is not None:
            waits[key].append(granted_at - r.created)
    # power: a node's total at each sample = the latest power of each of its GPUs reported
    # within 120 s; peak = the highest total, average = the mean of the hours' means
    latest: dict[str, dict[str, tuple[float, float]]] = defaultdict(dict)
    totals: dict[str, dict[float, list[float]]] = defaultdict(lambda: defaultdict(list))
    for node, ts, reported in log.power:
        for uuid, watts in reported:
            latest[node][uuid] = (ts, watts)
        total = sum(w for seen, w in latest[node].values() if abs(ts - seen) <= 120)
        hour = ts - ts % 3600
        if start <= hour < cut and ts <= cut:
            totals[node][hour].append(total)
    peak = {node: max(max(v) for v in hours_.values()) for node, hours_ in totals.items()}
    average = {node: statistics.fmean(statistics.fmean(v) for v in hours_.values())
               for node, hours_ in totals.items()}
    return Expected(cut, hours, granted, borrowed, lent, queued, measured, used, preemptions,
                    culled, requests, grants_made, refusals, refused_hours, waits, daily,
                    peak, average)


def nearest_rank_p95(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


def compare(fig: Any, exp: Expected) -> int:
    """Every figure of the report against the recount; returns how many were compared."""
    checked = 0
    assert fig.hours == pytest.approx(exp.hours, abs=TOL)
    for f in fig.teams:
        key = (f.team, f.pool)
        g = QUOTAS[f.team][f.pool][0]
        pairs = [
            (f.granted_gpu_hours, exp.granted.get(key, 0.0)),
            (f.borrowed_gpu_hours, exp.borrowed.get(key, 0.0)),
            (f.guaranteed_gpu_hours, g * exp.hours),
            (f.lent_gpu_hours, exp.lent.get(key, 0.0)),
            (f.queued_gpu_hours, exp.queued.get(key, 0.0)),
            (f.measured_gpu_hours, exp.measured.get(key, 0.0)),
            (f.used_gpu_hours, exp.used.get(key, 0.0)),
            (f.refused_gpu_hours, exp.refused_hours.get(key, 0.0)),
            (f.budget_used_share, exp.granted.get(key, 0.0) / BUDGETS[f.team]),
        ]
        for got, want in pairs:
            assert got == pytest.approx(want, abs=TOL), (key, pairs.index((got, want)), got, want)
        assert f.preemptions == exp.preemptions.get(key, {}), key
        assert f.culled == exp.culled.get(key, 0), key
        assert f.requests == exp.requests.get(key, 0), key
        assert f.grants == exp.grants.get(key, 0), key
        assert f.refusals == exp.refusals.get(key, {}), key
        w = exp.waits.get(key, [])
        assert f.queue_wait_median_s == (statistics.median(w) if w else None), key
        assert f.queue_wait_p95_s == nearest_rank_p95(w), key
        checked += 16
    capacity = {"train": 8.0, "shared": 4.0}
    for p in fig.pools:
        granted = sum(v for (t, pl), v in exp.granted.items() if pl == p.pool)
        measured = sum(v for (t, pl), v in exp.measured.items() if pl == p.pool)
        used = sum(v for (t, pl), v in exp.used.items() if pl == p.pool)
        assert p.capacity_gpu_hours == pytest.approx(capacity[p.pool] * exp.hours, abs=TOL)
        assert p.granted_gpu_hours == pytest.approx(granted, abs=TOL)
        assert p.occupancy == pytest.approx(granted / (capacity[p.pool] * exp.hours), abs=TOL)
        assert p.utilisation == pytest.approx(used / measured, abs=TOL)
        checked += 4
    for team, per_day in exp.daily.items():
        got = fig.series.gpu_hours_per_team_day[team]
        assert len(got) == len(per_day)
        assert got == pytest.approx(per_day, abs=TOL), team
        checked += 1
    assert {n.node: n.peak_w for n in fig.power} == pytest.approx(exp.peak, abs=TOL)
    assert {n.node: n.average_w for n in fig.power} == pytest.approx(exp.average, abs=TOL)
    return checked + 2


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Sim:
    import asyncio

    s = Sim(tmp_path_factory.mktemp("recount"))
    asyncio.run(s.run())
    return s


def test_the_generated_month_has_what_it_should(sim: Sim) -> None:
    """The scenario is not trivial: crossings, fractions, borrowing, preemption races,
    requeues, culls, queueing, refusals and heartbeats all happened in November."""
    g = list(sim.log.grants.values())
    assert any(x.start < NOV < (x.end or STOP) for x in g)
    assert any(x.start < DEC < (x.end or STOP) for x in g)
    assert any(x.units < 1 for x in g) and any(x.borrowed for x in g)
    assert sum(x.how == "preempted" and NOV <= (x.end or 0) < DEC for x in g) >= 5
    assert sum(x.how == "culled" and NOV <= (x.end or 0) < DEC for x in g) >= 3
    holders = [x.holder for x in g if x.kind is Kind.BATCH]
    assert len(holders) > len(set(holders))  # requeued attempts
    assert any(r.status == "refused" for r in sim.log.reqs.values())
    assert any(r.status == "cancelled" for r in sim.log.reqs.values())
    assert len(sim.log.samples) > 1000


def test_the_report_equals_the_recount(sim: Sim) -> None:
    rows = load_month(sim.engine, sim.broker.policy, 2026, 11, now=STOP)
    fig, _, _ = make_report(rows)
    assert not fig.partial
    assert compare(fig, _expected(sim, DEC)) > 100


def test_the_partial_report_equals_the_recount_to_its_now(sim: Sim) -> None:
    assert sim.partial is not None
    fig, exp = sim.partial
    assert fig.partial and fig.until == PARTIAL_AT
    compare(fig, exp)


def test_the_end_records_equal_what_happened(sim: Sim) -> None:
    """Every grant's stored end kind is what the generator did; the admin page's recent
    preemptions and the metrics count the same."""
    from sqlalchemy import select

    from jupyter_gpushare.broker.store.db import grants_table

    with sim.engine.connect() as conn:
        stored = dict(conn.execute(select(grants_table.c.id, grants_table.c.end_kind)).all())
    for g in sim.log.grants.values():
        assert stored[g.id] == (g.how or None if g.end is not None else None), g
    ended = [g for g in sim.log.grants.values() if g.end is not None]
    for kind in ("released", "preempted", "culled"):
        counted = sim.metrics.releases.labels(kind)._value.get()
        assert counted == sum(g.how == kind for g in ended), kind
    recent = recent_events(sim.engine, [])["preemptions"]
    want = sorted((g for g in ended if g.how == "preempted"), key=lambda g: -(g.end or 0))
    assert {p["grant_id"] for p in recent} == {g.id for g in want[:50]}


def test_the_admin_page_equals_the_recount(sim: Sim) -> None:
    assert len(sim.log.checkpoints) == 4
    for t, teams in sim.log.checkpoints:
        start = NOV if t < DEC else DEC
        for (team, pool), row in teams.items():
            live = [g for g in sim.log.grants.values()
                    if g.team == team and g.pool == pool and g.start <= t
                    and (g.end is None or g.end > t)]
            assert row["in_use"] == pytest.approx(sum(g.units for g in live), abs=TOL)
            assert row["borrowed"] == pytest.approx(
                sum(g.units for g in live if g.borrowed), abs=TOL)
            hours = sum(
                g.units * len(minutes(g.start, g.end if g.end is not None and g.end <= t
                                      else t, start, t)) / 60
                for g in sim.log.grants.values() if g.team == team and g.pool == pool
            )
            assert row["gpu_hours_month"] == pytest.approx(hours, abs=ADMIN_TOL), (t, team)
            assert row["gpu_hours_budget"] == BUDGETS[team]
