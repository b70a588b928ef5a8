"""The broker's behaviour through its REST API, in-process (static tokens, no hub).

Each test runs on SQLite and on a real PostgreSQL server (started by the tests; skipped,
saying why, where the binaries are absent).
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from brokerkit import BASE, call, start_broker, static_tokens
from brokerpolicies import small
from pgserver import postgres  # noqa: F401  (fixture)
from sqlalchemy import select
from test_core_invariants import check_state
from tornado.httpclient import AsyncHTTPClient, HTTPRequest

from jupyter_gpushare.broker.service.broker import Broker
from jupyter_gpushare.broker.store.db import SCHEMA_VERSION, grants_table, make_engine, schema_table
from jupyter_gpushare.core.state import ClusterState

USERS = {"alice": ["a"], "bob": ["b"], "carol": ["a"]}
_counter = iter(range(10**6))


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Any) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/gpushare.sqlite"
    pg = request.getfixturevalue("postgres")
    return str(pg.new_database(f"t{next(_counter)}"))


@pytest.fixture
async def broker(db_url: str) -> Any:
    app = await start_broker(small(), db_url, static_tokens(USERS))
    yield app
    await app.stop_async()


async def wait_for(predicate: Any, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not await predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


def assert_consistent(app: Any) -> None:
    """The in-memory state equals a state rebuilt from the database, and both hold invariants."""
    b: Broker = app.broker
    db_grants = b.db_live_grants()
    assert sorted(g.id for g in db_grants) == sorted(b.state.grants)
    rebuilt = ClusterState(b.policy, db_grants)
    check_state(rebuilt)
    check_state(b.state)
    assert dict(rebuilt.usage) == {k: v for k, v in b.state.usage.items() if v}


async def test_grant_release_and_validation(broker: Any) -> None:
    status, ans = await call(
        broker,
        "POST",
        "/requests",
        "tok-alice",
        {"pool": "shared", "gpu": {"fraction": 0.25}, "server": "s1"},
    )
    assert status == 201 and ans["status"] == "granted" and ans["grant"]["units"] == 0.25
    assert 0 < ans["grant"]["gpus"][0]["memory_mib"] <= 20480
    status, err = await call(broker, "POST", "/requests", "tok-alice", {"pool": "nope"})
    assert status == 400 and err["field"] == "pool"
    status, err = await call(
        broker, "POST", "/requests", "tok-alice", {"pool": "shared", "gpu": {"fraction": "half"}}
    )
    assert status == 400 and err["field"] == "gpu.fraction"
    status, err = await call(
        broker, "POST", "/requests", "tok-alice", {"pool": "shared", "kind": "x"}
    )
    assert status == 400 and err["field"] == "kind"
    status, err = await call(broker, "POST", "/requests", "tok-alice", [1, 2])
    assert status == 400 and err["field"] == "body"
    # the debug pool refuses at once with a reason (no queue): team a has 0.25 there
    status, ans2 = await call(
        broker,
        "POST",
        "/requests",
        "tok-alice",
        {"pool": "debug", "gpu": {"fraction": 0.5}, "kind": "batch"},
    )
    assert status == 409 and ans2["status"] == "refused" and ans2["reason"]
    gid = ans["grant"]["id"]
    assert (await call(broker, "DELETE", f"/grants/{gid}", "tok-alice"))[1]["released"] is True
    assert (await call(broker, "DELETE", f"/grants/{gid}", "tok-alice"))[1]["released"] is False
    assert_consistent(broker)


async def test_idempotency_key_returns_the_same_request(broker: Any) -> None:
    body = {"pool": "train", "gpu": {"count": 1}, "idempotency_key": "k1"}
    first = (await call(broker, "POST", "/requests", "tok-alice", body))[1]
    second = (await call(broker, "POST", "/requests", "tok-alice", body))[1]
    assert first["request_id"] == second["request_id"]
    assert len(broker.broker.state.grants) == 1


async def test_queue_then_grant_on_release(broker: Any) -> None:
    grants = []
    for _ in range(4):
        status, ans = await call(
            broker,
            "POST",
            "/requests",
            "tok-alice",
            {"pool": "train", "gpu": {"count": 1}, "kind": "batch", "priority": "training"},
        )
        assert ans["status"] == "granted"
        grants.append(ans["grant"]["id"])
    status, queued = await call(
        broker,
        "POST",
        "/requests",
        "tok-carol",
        {"pool": "train", "gpu": {"count": 1}, "kind": "batch", "priority": "training"},
    )
    assert status == 201 and queued["status"] == "queued" and queued["position"] == 1
    status, q2 = await call(
        broker,
        "POST",
        "/requests",
        "tok-carol",
        {"pool": "train", "gpu": {"count": 1}, "kind": "batch", "priority": "training"},
    )
    assert q2["position"] == 2
    status, usage = await call(broker, "GET", "/teams/a/usage", "tok-carol")
    assert usage["pools"]["train"]["queued"] == 2 and usage["pools"]["train"]["in_use"] == 4.0
    status, q = await call(broker, "GET", "/admin/queue", "tok-admin")
    assert [x["request_id"] for x in q["queue"]] == [queued["request_id"], q2["request_id"]]
    await call(broker, "DELETE", f"/grants/{grants[0]}", "tok-alice")
    status, now = await call(broker, "GET", f"/requests/{queued['request_id']}", "tok-carol")
    assert now["status"] == "granted" and now["grant"]["user"] == "carol"
    status, later = await call(broker, "GET", f"/requests/{q2['request_id']}", "tok-carol")
    assert later["status"] == "queued" and later["position"] == 1
    status, cancelled = await call(broker, "DELETE", f"/requests/{q2['request_id']}", "tok-carol")
    assert cancelled["status"] == "cancelled"
    assert_consistent(broker)


async def test_preemption_notice_deadline_and_grant(broker: Any) -> None:
    # bob's team has no guarantee in train: all 4 of his GPUs are borrowed (preemptible)
    bob = []
    for i in range(4):
        status, ans = await call(
            broker,
            "POST",
            "/requests",
            "tok-bob",
            {"pool": "train", "gpu": {"count": 1}, "server": f"s{i}"},
        )
        assert ans["status"] == "granted" and ans["grant"]["borrowed"] is True, ans
        bob.append(ans["grant"]["id"])
    # bob's stream of notices
    events: list[dict[str, Any]] = []

    def on_chunk(chunk: bytes) -> None:
        for block in chunk.decode().split("\n\n"):
            for line in block.splitlines():
                if line.startswith("data: "):
                    events.append(json.loads(line[6:]))

    url = f"http://127.0.0.1:{broker.port}{BASE}/notices/stream"
    stream = AsyncHTTPClient().fetch(
        HTTPRequest(
            url,
            headers={"Authorization": "token tok-bob"},
            streaming_callback=on_chunk,
            request_timeout=60,
        ),
        raise_error=False,
    )
    await asyncio.sleep(0.2)
    status, ans = await call(
        broker, "POST", "/requests", "tok-alice", {"pool": "train", "gpu": {"count": 1}}
    )
    assert status == 201 and ans["status"] == "preempting", ans
    assert len(ans["victims"]) == 1 and ans["victims"][0] in bob
    assert ans["expected_wait_s"] is not None and ans["expected_wait_s"] <= 1.0
    victim = ans["victims"][0]
    status, notices = await call(broker, "GET", "/notices", "tok-bob")
    assert [n["grant_id"] for n in notices["notices"]] == [victim]
    assert notices["notices"][0]["deadline"] and notices["notices"][0]["reason"]
    assert (await call(broker, "GET", "/notices", "tok-alice"))[1]["notices"] == []
    status, g = await call(broker, "GET", f"/grants/{victim}", "tok-bob")
    assert g["preemption"]["deadline"]

    async def granted() -> bool:
        status, now = await call(broker, "GET", f"/requests/{ans['request_id']}", "tok-alice")
        return bool(now["status"] == "granted")

    await wait_for(granted)
    status, g = await call(broker, "GET", f"/grants/{victim}", "tok-bob")
    assert g["released_at"] and g["release_reason"].startswith("preempted")
    await wait_for(lambda: asyncio.sleep(0, result=bool(events)))
    assert events[0]["grant_id"] == victim and events[0]["kind"] == "preemption"
    status, metrics = await call(broker, "GET", "/metrics", "tok-metrics")
    assert 'gpushare_preemptions_total{reason="preempting"} 1.0' in metrics
    stream.cancel()
    assert_consistent(broker)


async def test_restart_rebuilds_the_same_state(db_url: str) -> None:
    tokens = static_tokens(USERS)
    app = await start_broker(small(), db_url, tokens)
    ids = []
    for user, body in [
        ("alice", {"pool": "shared", "gpu": {"fraction": 0.5}}),
        ("bob", {"pool": "train", "gpu": {"count": 2}}),
        (
            "carol",
            {
                "pool": "train",
                "gpu": {"count": 2},
                "kind": "batch",
                "priority": "research",
                "checkpointing": True,
            },
        ),
    ]:
        status, ans = await call(app, "POST", "/requests", f"tok-{user}", body)
        assert ans["status"] == "granted", ans
        ids.append(ans["grant"]["id"])
    await call(app, "POST", "/admin/nodes/shared-n0/drain", "tok-admin")
    before = {g.id: g for g in app.broker.state.grants.values()}
    await app.stop_async()
    app2 = await start_broker(small(), db_url, tokens)
    try:
        assert {g.id: g for g in app2.broker.state.grants.values()} == before
        assert app2.broker.state.nodes["shared-n0"].cordoned
        status, ans = await call(
            app2,
            "POST",
            "/requests",
            "tok-alice",
            {"pool": "shared", "gpu": {"fraction": 0.25}, "server": "two"},
        )
        assert ans["status"] == "refused"  # the only shared node is drained
        assert_consistent(app2)
        with app2.engine.connect() as conn:
            assert conn.execute(select(schema_table.c.version)).scalar() == SCHEMA_VERSION
    finally:
        await app2.stop_async()


def test_gpu_hours_from_intervals(tmp_path: Any) -> None:
    """GPU-hours of the month and of any period come from the grant intervals."""
    from corefactory import request

    clock = [1_700_000_000.0]
    engine = make_engine(f"sqlite:///{tmp_path}/l.sqlite")
    b = Broker(small(), engine, clock=lambda: clock[0])
    b.load()
    start = clock[0]
    b.submit(request("a", "train", whole=2, user="alice"))
    gid = next(iter(b.state.grants))
    clock[0] += 3600
    assert b.team_usage("a")["pools"]["train"]["gpu_hours_month"] == pytest.approx(2.0)
    b.release(gid)
    clock[0] += 3600
    assert b.team_usage("a")["pools"]["train"]["gpu_hours_month"] == pytest.approx(2.0)
    hours = b.gpu_hours_between(start, start + 1800)
    assert hours[("a", "train")] == pytest.approx(1.0)
    with engine.connect() as conn:
        row = conn.execute(select(grants_table).where(grants_table.c.id == gid)).one()
        assert row.released_at - row.granted_at == pytest.approx(3600)
    # a restarted broker computes the same month figure from the database
    b2 = Broker(small(), engine, clock=lambda: clock[0])
    b2.load()
    assert b2.team_usage("a")["pools"]["train"]["gpu_hours_month"] == pytest.approx(2.0)


async def test_profiles_view_leaves_out_a_profile_whose_priority_the_team_may_not_use(
    tmp_path: Any,
) -> None:
    """The spawn form's availability comes from ``/policy/profiles``: a team whose
    ``priorities`` exclude a profile's own class must not be offered that profile there,
    as the broker refuses it (core.rules) and ``Policy.offers`` leaves it out."""
    from pathlib import Path

    from jupyter_gpushare.policy import parse_policy

    text = (Path(__file__).parents[1] / "hub_config" / "gpushare.yaml").read_text()
    text = text.replace(
        "  research:\n    groups: [research]\n",
        "  research:\n    groups: [research]\n    priorities: [interactive, research]\n",
    )
    policy = parse_policy(text)
    assert not policy.offers(policy.profile("train-1gpu"), "research")
    app = await start_broker(policy, f"sqlite:///{tmp_path}/b.sqlite",
                             static_tokens({"rita": ["vision", "research"]}))
    try:  # rita is in both teams: train-1gpu is offered to her under vision only
        view = app.broker.profiles_view(("vision", "research"))
        by_slug = {p["slug"]: p for p in view}
        assert set(by_slug["train-1gpu"]["availability"]) == {"vision"}
        assert set(by_slug["inference-quarter"]["availability"]) == {"vision", "research"}
    finally:
        await app.stop_async()
