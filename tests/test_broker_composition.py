"""The broker is composed of collaborators, each owning its state (issue 24).

Each collaborator of :class:`~jupyter_gpushare.broker.service.broker.Broker` is built and
used here on its own (a real SQLite database, grants decided by the real core), with no
broker around it; and no class of ``broker/service/`` inherits from more than one class of
the project, nor is the broker built on a chain of base classes (no mixins).
"""

from __future__ import annotations

import ast
import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from brokerpolicies import small
from corefactory import request

from jupyter_gpushare.broker.errors import BrokerError
from jupyter_gpushare.broker.service.broker import Broker
from jupyter_gpushare.broker.service.consistency import ConsistencyChecks
from jupyter_gpushare.broker.service.heartbeats import Heartbeats
from jupyter_gpushare.broker.service.holders import Holders
from jupyter_gpushare.broker.service.ledger import Ledger
from jupyter_gpushare.broker.service.limits import BrokerLimits
from jupyter_gpushare.broker.service.views import Views
from jupyter_gpushare.broker.service.waiting import Pending, WaitQueue
from jupyter_gpushare.broker.service.writes import Writes
from jupyter_gpushare.broker.store.db import grants_table, make_engine, migrate
from jupyter_gpushare.broker.store.serial import gpu_index, grant_row
from jupyter_gpushare.core.admission import AdmissionFacts, Outcome, decide
from jupyter_gpushare.core.ledger import month_bounds
from jupyter_gpushare.core.model import Grant, Policy, Request
from jupyter_gpushare.core.state import ClusterState

SERVICE = Path(__file__).parents[1] / "jupyter_gpushare" / "broker" / "service"
JULY = month_bounds(2026, 7)[0]  # 2026-07-01 00:00 UTC


def granted(state: ClusterState, gid: str, now: float, **ask: Any) -> Grant:
    """A grant the core makes for ``ask`` (applied to ``state``)."""
    decision = decide(state, request(**ask), gid, AdmissionFacts(now=now))
    assert decision.outcome is Outcome.GRANTED and decision.grant is not None, decision
    state.apply(decision.grant)
    return decision.grant


@pytest.fixture
def engine(tmp_path: Path) -> Any:
    eng = make_engine(f"sqlite:///{tmp_path}/parts.sqlite")
    migrate(eng)
    yield eng
    eng.dispose()


# -- each collaborator alone ---------------------------------------------------------------


def test_holders_index_grants_and_waiting_requests_per_holder() -> None:
    holders = Holders()
    mine = request("a", "shared", fraction=0.25, user="alice")
    holders.hold(mine, "g-1")
    holders.hold(mine, "r-2")
    key = (mine.kind.value, "alice", mine.holder)
    assert holders.held_by(*key) == {"g-1", "r-2"}
    assert holders.held_by(mine.kind.value, "bob", mine.holder) == set()
    holders.unhold(mine, "g-1")
    holders.unhold(mine, "r-2")
    assert holders.held_by(*key) == set() and len(holders) == 0  # no empty sets kept


def test_ledger_counts_live_hours_and_starts_a_new_month_from_the_database(engine: Any) -> None:
    state = ClusterState(small())
    ledger = Ledger(engine, clock=lambda: JULY + 7200)
    ledger.reset(JULY, state.grants.values())
    grant = granted(state, "g-1", JULY, team="a", pool="train", whole=2)
    ledger.add(grant)
    assert ledger.month_at(JULY + 3600, state.grants).hours(("a", "train"), JULY + 3600) == 2.0
    ledger.remove(grant, JULY + 3600)
    state.release("g-1")
    with engine.begin() as conn:
        conn.execute(grants_table.insert(), grant_row(grant))
        conn.execute(
            grants_table.update()
            .where(grants_table.c.id == "g-1")
            .values(released_at=JULY + 3600, release_reason="released by holder")
        )
    assert ledger.month.hours(("a", "train"), JULY + 7200) == 2.0  # closed: no more hours
    august = month_bounds(2026, 8)[0]
    assert ledger.month_at(august + 60, state.grants).hours(("a", "train"), august + 60) == 0.0
    assert ledger.month.month == (2026, 8)  # a new month, rebuilt from the closed interval
    assert ledger.gpu_hours_between(JULY, august) == {("a", "train"): 2.0}


def test_heartbeats_check_store_and_forget_a_grants_heartbeats(engine: Any) -> None:
    pol = small()
    state = ClusterState(pol)
    clock = [JULY + 60]
    beats = Heartbeats(engine, lambda: clock[0], BrokerLimits(heartbeat_min_interval_s=10))
    grant = granted(state, "g-1", JULY, team="a", pool="shared", fraction=0.25)
    uuid = grant.placement.slices[0].gpu_uuid
    cards = gpu_index(pol)
    beats.accept(state.grants, cards, "g-1", None, [{"uuid": uuid, "utilization_pct": 30.0}], True)
    assert beats.last["g-1"]["gpus"] == [{"uuid": uuid, "utilization_pct": 30.0}]
    assert beats.measured_view("a", "shared")["heartbeats"] == 1  # type: ignore[index]
    with pytest.raises(BrokerError) as too_soon:
        beats.accept(state.grants, cards, "g-1", None, [], True)
    assert too_soon.value.status == 429
    with pytest.raises(BrokerError) as unknown:
        beats.accept(state.grants, cards, "g-2", None, [], True)
    assert unknown.value.status == 404
    beats.forget("g-1")
    assert "g-1" not in beats.last and "g-1" not in beats.accepted_at
    again = Heartbeats(engine, lambda: clock[0], BrokerLimits())
    again.load_measured()  # the month's measured use outlives the grant and the process
    assert again.measured_view("a", "shared")["heartbeats"] == 1  # type: ignore[index]


def test_writes_without_group_commits_are_durable_at_once(engine: Any) -> None:
    writes = Writes(engine)
    assert writes.fast is not None and writes.commits is None
    told: list[int] = []
    writes.after_durable(lambda: told.append(1))
    assert told == [1]  # nothing queued: the outside world is told at once
    assert writes.unsettled_answer("alice", "k") is None
    with pytest.raises(ValueError, match="unknown commit mode 'later'"):
        writes.start(None, "later", lambda: None)  # type: ignore[arg-type]
    writes.close()
    assert Writes(engine, raw_sql=False).fast is None


def test_consistency_checks_read_the_database_alone(engine: Any) -> None:
    state = ClusterState(small())
    grant = granted(state, "g-1", JULY, team="a", pool="train", whole=1)
    checks = ConsistencyChecks(engine)
    assert checks.db_live_grants() == [] and checks.requests_by_status() == {}
    with engine.begin() as conn:
        conn.execute(grants_table.insert(), grant_row(grant))
    assert [g.id for g in checks.db_live_grants()] == ["g-1"]
    assert checks.grants_without_request() == 1  # its request row was never written


@dataclass
class Source:
    """What :class:`Views` reads, built from the real parts without a broker."""

    policy: Policy
    engine: Any
    state: ClusterState = field(init=False)
    gpus: dict[str, Any] = field(init=False)
    policy_version: str = "v1"
    clock: Any = field(default=lambda: JULY + 600)
    queue: WaitQueue = field(init=False)
    pending: dict[str, Pending] = field(default_factory=dict)
    preempt_info: dict[str, tuple[str, float]] = field(default_factory=dict)
    policy_notices: dict[str, dict[str, Any]] = field(default_factory=dict)
    cull_notices: dict[str, dict[str, Any]] = field(default_factory=dict)
    ledger: Ledger = field(init=False)
    heartbeats: Heartbeats = field(init=False)
    writes: Writes = field(init=False)

    def __post_init__(self) -> None:
        self.state = ClusterState(self.policy)
        self.gpus = gpu_index(self.policy)
        self.queue = WaitQueue(lambda name: 0)
        self.ledger = Ledger(self.engine, self.clock)
        self.heartbeats = Heartbeats(self.engine, self.clock, BrokerLimits())
        self.writes = Writes(self.engine, raw_sql=False)

    def facts(self, now: float, request: Request, retry: bool = False) -> AdmissionFacts:
        return AdmissionFacts(now=now, retry=retry)


def test_views_answer_from_what_they_are_handed(engine: Any) -> None:
    src = Source(small(), engine)
    views = Views(src)
    grant = granted(src.state, "g-1", JULY, team="a", pool="shared", fraction=0.25, user="alice")
    src.ledger.reset(JULY, src.state.grants.values())
    src.preempt_info["g-1"] = ("for a guaranteed request", JULY + 900)
    [view] = views.list_grants(user="alice")
    assert view["id"] == "g-1" and view["units"] == 0.25
    assert view["preemption"]["reason"] == "for a guaranteed request"
    [notice] = views.notices(user="alice")
    assert notice["kind"] == "preemption" and notice["deadline_ts"] == JULY + 900
    usage = views.team_usage("a")["pools"]["shared"]
    assert usage["in_use"] == 0.25 and usage["gpu_hours_month"] == pytest.approx(0.25 / 6, abs=1e-6)
    assert views.get_grant("g-404") is None  # read from the database: not there
    assert grant.id in src.state.grants  # the views changed nothing


# -- no mixins -----------------------------------------------------------------------------


def service_classes() -> dict[str, list[str]]:
    """Each class defined in broker/service/ -> the names of its base classes."""
    found: dict[str, list[str]] = {}
    for path in sorted(SERVICE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                found[f"{path.stem}.{node.name}"] = [ast.unparse(b) for b in node.bases]
    return found


def project_bases(classes: dict[str, list[str]]) -> dict[str, list[str]]:
    """The bases of each class that are classes of the service itself (not a library's:
    ``Configurable``, ``Protocol``, ...)."""
    own = {name.split(".", 1)[1] for name in classes}
    return {
        name: [b for b in bases if b.rsplit(".", 1)[-1] in own] for name, bases in classes.items()
    }


def test_no_class_in_the_service_is_built_of_mixins() -> None:
    classes = service_classes()
    assert "broker.Broker" in classes and "lifecycle.LifecycleMixin" not in classes
    bases = project_bases(classes)
    assert not [n for n in classes if n.endswith("Mixin")], "mixins are back in service/"
    many = {n: b for n, b in bases.items() if len(b) > 1}
    assert not many, f"classes with more than one project base class: {many}"
    assert bases["broker.Broker"] == [], "the Broker holds its parts; it inherits none"
    chained = {n: b for n, b in bases.items() if b and bases.get(_qualified(classes, b[0]))}
    assert not chained, f"chains of project base classes: {chained}"


def _qualified(classes: dict[str, list[str]], base: str) -> str:
    short = base.rsplit(".", 1)[-1]
    return next((n for n in classes if n.split(".", 1)[1] == short), "")


def test_the_broker_holds_each_part_and_reads_through_it(tmp_path: Path) -> None:
    b = Broker(small(), make_engine(f"sqlite:///{tmp_path}/b.sqlite"), clock=lambda: JULY)
    b.load()
    with contextlib.closing(b):
        parts = {
            "writes": Writes, "ledger": Ledger, "heartbeats": Heartbeats, "views": Views,
            "checks": ConsistencyChecks, "holders": Holders, "queue": WaitQueue,
        }  # fmt: skip
        for name, kind in parts.items():
            assert isinstance(getattr(b, name), kind), name
        ask = request("a", "shared", fraction=0.25, user="alice")
        b.submit(ask)
        [gid] = b.state.grants
        # attributes callers read are their owner's, not copies
        assert b.usage is b.heartbeats.usage and b.fast is b.writes.fast
        assert b.last_heartbeat is b.heartbeats.last
        assert b.ledger.month.hours(("a", "shared"), JULY + 3600) == 0.25
        assert b.held_by("interactive", "alice", ask.holder) == {gid}
        assert b.holders.get(("interactive", "alice", ask.holder)) == {gid}
        assert [g.id for g in b.db_live_grants()] == [gid]
        assert b.release(gid) and not b.holders.index
