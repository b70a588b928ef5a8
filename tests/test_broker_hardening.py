"""Hardening of the broker's REST API (issue 8): bad input never a 500, nothing unbounded.

In-process broker with static tokens (no hub); the items that need a hub and real servers
are in ``test_broker_hub.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import pytest
from brokerkit import BASE, call, start_broker, static_tokens
from brokerpolicies import small
from corefactory import request
from sqlalchemy import func, select
from tornado.httpclient import AsyncHTTPClient, HTTPRequest

from jupyter_gpushare.broker.service import lifecycle
from jupyter_gpushare.broker.service.broker import Broker
from jupyter_gpushare.broker.service.limits import BrokerLimits
from jupyter_gpushare.broker.store.db import heartbeats_table, make_engine
from jupyter_gpushare.core.model import Kind

USERS = {"alice": ["a"], "bob": ["b"], "carol": ["a"]}


@pytest.fixture
async def broker(tmp_path: Any) -> Any:
    app = await start_broker(small(), f"sqlite:///{tmp_path}/b.sqlite", static_tokens(USERS))
    yield app
    await app.stop_async()


async def raw(app: Any, method: str, path: str, token: str, body: bytes) -> tuple[int, Any]:
    resp = await AsyncHTTPClient().fetch(
        HTTPRequest(
            f"http://127.0.0.1:{app.port}{BASE}{path}",
            method=method,
            headers={"Authorization": f"token {token}", "Content-Type": "application/json"},
            body=body,
        ),
        raise_error=False,
    )
    return resp.code, json.loads(resp.body) if resp.body else None


# -- item 6: a request for no GPU ---------------------------------------------------------


@pytest.mark.parametrize(
    ("gpu", "field"),
    [({"count": 0}, "gpu.count"), ({"fraction": 0}, "gpu.fraction"), (None, "gpu"), ({}, "gpu")],
)
async def test_zero_gpu_request_is_refused_naming_the_field(
    broker: Any, gpu: Any, field: str
) -> None:
    body: dict[str, Any] = {"pool": "shared", "server": "z"}
    if gpu is not None:
        body["gpu"] = gpu
    status, err = await call(broker, "POST", "/requests", "tok-alice", body)
    assert status == 400 and err["field"] == field, err
    assert broker.broker.state.grants == {}


# -- item 7: numbers, depth, idempotency --------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        b'{"pool": "train", "gpu": {"count": 1' + b"0" * 400 + b"}}",
        b'{"pool": "shared", "gpu": {"fraction": 0.25}, "cpu_milli": 9' + b"9" * 399 + b"}",
        b'{"pool": "train", "gpu": {"count": 1}, "max_runtime_s": -' + b"7" * 400 + b"}",
        b'{"pool": "shared", "gpu": {"fraction": 1e400}}',
    ],
)
async def test_huge_numbers_are_a_400(broker: Any, body: bytes) -> None:
    status, err = await raw(broker, "POST", "/requests", "tok-alice", body)
    assert status == 400 and err["field"], err
    assert broker.broker.state.grants == {}


async def test_deep_json_and_big_bodies_are_4xx(broker: Any) -> None:
    deep = b"[" * 100_000 + b"]" * 100_000
    for path in ("/requests", "/heartbeats"):
        status, err = await raw(broker, "POST", path, "tok-alice", deep)
        assert status == 400 and err["field"] == "body", err
    status, err = await raw(broker, "POST", "/requests", "tok-alice", b" " * 300_000 + b"{}")
    assert status == 413


async def test_concurrent_idempotency_key_gives_one_answer(broker: Any) -> None:
    body = {"pool": "train", "gpu": {"count": 1}, "idempotency_key": "same", "server": "k"}
    answers = await asyncio.gather(
        *(call(broker, "POST", "/requests", "tok-alice", body) for _ in range(20))
    )
    assert {status for status, _ in answers} == {201}
    assert len({ans["request_id"] for _, ans in answers}) == 1
    assert len(broker.broker.state.grants) == 1


# -- item 10: long strings, internal events ---------------------------------------------


async def test_megabyte_profile_name_is_bounded_and_not_echoed(broker: Any) -> None:
    for size, expected in ((1_000_000, 413), (100_000, 400)):
        name = "p" * size
        for body in ({"profile": name}, {"pool": name}, {"pool": "shared", "priority": name}):
            status, err = await call(broker, "POST", "/requests", "tok-alice", body)
            assert status == expected, err
            assert len(json.dumps(err)) < 500, len(json.dumps(err))


async def test_notice_stream_never_sees_internal_wake(broker: Any) -> None:
    seen: list[bytes] = []
    url = f"http://127.0.0.1:{broker.port}{BASE}/notices/stream"
    watching = AsyncHTTPClient(force_instance=True)
    watcher = watching.fetch(
        HTTPRequest(
            url,
            headers={"Authorization": "token tok-admin"},
            streaming_callback=seen.append,
            request_timeout=3,
        ),
        raise_error=False,
    )
    leaving = AsyncHTTPClient(force_instance=True)
    with contextlib.suppress(Exception):  # the client gives up and hangs up
        await leaving.fetch(
            HTTPRequest(url, headers={"Authorization": "token tok-bob"}, request_timeout=0.5),
            raise_error=False,
        )
    leaving.close()
    await asyncio.sleep(0.5)
    assert b"connected" in b"".join(seen)
    assert b"_wake" not in b"".join(seen)
    with contextlib.suppress(Exception):
        await watcher
    watching.close()


# -- item 4: one grant per server -------------------------------------------------------


async def test_one_grant_per_server(broker: Any) -> None:
    ask = {"pool": "shared", "gpu": {"fraction": 0.25}}
    status, first = await call(broker, "POST", "/requests", "tok-alice-srv", ask)
    assert status == 201 and first["status"] == "granted"
    # the server's own token and its user's token get a 409, nothing is granted
    for token in ("tok-alice-srv", "tok-alice"):
        status, err = await call(broker, "POST", "/requests", token, {**ask, "server": ""})
        assert status == 409 and err["field"] == "server", err
        assert first["grant"]["id"] in err["error"]
    assert len(broker.broker.state.grants) == 1
    # another server of the same user is another holder
    status, other = await call(broker, "POST", "/requests", "tok-alice", {**ask, "server": "b"})
    assert status == 201 and other["status"] == "granted"
    # the spawner starts the server anew: the left-over grant is released first
    status, again = await call(
        broker, "POST", "/requests", "tok-spawner", {**ask, "user": "alice", "groups": ["a"]}
    )
    assert status == 201 and again["status"] == "granted"
    live = [g for g in broker.broker.state.grants.values() if g.request.holder == ""]
    assert [g.id for g in live] == [again["grant"]["id"]]
    status, old = await call(broker, "GET", f"/grants/{first['grant']['id']}", "tok-alice")
    assert old["released_at"] and "superseded" in old["release_reason"]


# -- item 9: heartbeats -----------------------------------------------------------------


async def test_heartbeats_are_checked_rate_limited_and_measured(broker: Any) -> None:
    status, ans = await call(
        broker, "POST", "/requests", "tok-alice", {"pool": "shared", "gpu": {"fraction": 0.25}}
    )
    grant = ans["grant"]
    uuid = grant["gpus"][0]["uuid"]
    card = broker.broker.gpus[uuid].memory_mib

    async def beat(**kw: Any) -> tuple[int, Any]:
        body = {
            "grant_id": grant["id"],
            "gpus": [{"uuid": uuid, "memory_used_mib": 100, "utilization_pct": 40}],
            **kw,
        }
        return await call(broker, "POST", "/heartbeats", "tok-alice", body)

    bad = [
        ({"gpus": [{"uuid": "GPU-not-mine", "memory_used_mib": 1}]}, "gpus[0].uuid"),
        ({"gpus": [{"uuid": uuid, "memory_used_mib": card + 1}]}, "gpus[0].memory_used_mib"),
        ({"gpus": [{"uuid": uuid, "memory_used_mib": 99_999_999}]}, "gpus[0].memory_used_mib"),
        ({"gpus": [{"uuid": uuid}, {"uuid": uuid}]}, "gpus[1].uuid"),
        ({"ts": "yesterday"}, "ts"),
        ({"ts": 4_000_000_000}, "ts"),
        ({"ts": 1}, "ts"),
    ]
    for extra, field in bad:
        status, err = await beat(**extra)
        assert status == 400 and err["field"] == field, (extra, err)
    # the server extension sends ts as an ISO string: accepted
    status, _ = await beat(ts=ans["created_at"])
    assert status == 204
    status, err = await beat()
    assert status == 429
    with broker.broker.engine.connect() as conn:
        rows = conn.execute(select(func.count()).select_from(heartbeats_table)).scalar()
    assert rows == 1
    status, usage = await call(broker, "GET", "/teams/a/usage", "tok-alice")
    measured = usage["pools"]["shared"]["measured"]
    assert measured["heartbeats"] == 1 and measured["utilization_pct_avg"] == 40.0


def test_heartbeat_detail_is_pruned_and_aggregates_kept(tmp_path: Any) -> None:
    clock = [1_800_000_000.0]
    limits = BrokerLimits(
        heartbeat_min_interval_s=10, heartbeat_retention_s=100, heartbeat_prune_every=5
    )
    b = Broker(
        small(),
        make_engine(f"sqlite:///{tmp_path}/h.sqlite"),
        clock=lambda: clock[0],
        limits=limits,
    )
    b.load()
    b.submit(request("a", "shared", fraction=0.25, user="alice"))
    grant = next(iter(b.state.grants.values()))
    uuid = grant.placement.slices[0].gpu_uuid
    for _ in range(30):
        b.heartbeat(grant.id, None, [{"uuid": uuid, "utilization_pct": 50.0}], True)
        clock[0] += 10
    with b.engine.connect() as conn:
        rows = conn.execute(select(func.count()).select_from(heartbeats_table)).scalar()
    assert rows is not None and rows <= 100 / 10 + 5  # retention + one prune period
    assert b.measured_view("a", "shared")["heartbeats"] == 30  # type: ignore[index]
    b2 = Broker(small(), b.engine, clock=lambda: clock[0])
    b2.load()
    assert b2.measured_view("a", "shared")["heartbeats"] == 30  # type: ignore[index]
    b.close()
    b2.close()


# -- item 8: queue limits and the cost of re-deciding the queue ---------------------------


def test_queue_limits_per_user_and_team(tmp_path: Any) -> None:
    limits = BrokerLimits(max_queued_per_user=3, max_queued_per_team=5)
    b = Broker(small(), make_engine(f"sqlite:///{tmp_path}/q.sqlite"), limits=limits)
    b.load()

    def batch(user: str) -> dict[str, Any]:
        return b.submit(
            request("a", "train", whole=4, user=user, kind=Kind.BATCH, priority="training")
        )

    assert batch("alice")["status"] == "granted"  # takes the whole pool
    assert [batch("alice")["status"] for _ in range(4)] == ["queued"] * 3 + ["refused"]
    refused = batch("alice")
    assert refused["code"] == "queue_limit" and "alice" in refused["reason"]
    assert [batch("carol")["status"] for _ in range(3)] == ["queued", "queued", "refused"]
    assert "team a" in batch("carol")["reason"]
    assert len(b.queue) == 5
    b.close()


def test_release_redecides_the_queue_at_the_cost_of_one_decision(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    limits = BrokerLimits(max_queued_per_user=0, max_queued_per_team=0)
    b = Broker(small(), make_engine(f"sqlite:///{tmp_path}/d.sqlite"), limits=limits)
    b.load()
    first = b.submit(
        request("a", "train", whole=4, user="alice", kind=Kind.BATCH, priority="training")
    )
    for i in range(300):
        ans = b.submit(
            request("a", "train", whole=4, user=f"u{i % 7}", kind=Kind.BATCH, priority="training")
        )
        assert ans["status"] == "queued"
    calls = []
    real = lifecycle.decide
    monkeypatch.setattr(lifecycle, "decide", lambda *a, **k: calls.append(1) or real(*a, **k))
    b.release(first["grant_id"])
    # the head of the queue is granted, the next one stays queued; the rest are the same shape
    assert len(calls) <= 3, len(calls)
    assert len(b.queue) == 299 and len(b.state.grants) == 1
    head = b.ordered_queue("train")[0]
    assert b.queue_view()[0]["request_id"] == head.id
    assert b.queue_view()[0]["position"] == 1 and b.queue_view()[-1]["position"] == 299
    b.close()


async def test_admin_queue_is_paged(broker: Any) -> None:
    b = broker.broker
    b.limits.max_queued_per_user = 0
    b.limits.max_queued_per_team = 0
    b.submit(request("a", "train", whole=4, user="alice", kind=Kind.BATCH, priority="training"))
    ids = [
        b.submit(
            request("a", "train", whole=4, user="carol", kind=Kind.BATCH, priority="training")
        )["request_id"]
        for _ in range(30)
    ]
    status, page = await call(broker, "GET", "/admin/queue?limit=10&offset=5", "tok-admin")
    assert status == 200 and page["total"] == 30 and page["queued"] == 30
    assert [q["request_id"] for q in page["queue"]] == ids[5:15]
    assert [q["position"] for q in page["queue"]] == list(range(6, 16))
    status, err = await call(broker, "GET", "/admin/queue?limit=-1", "tok-admin")
    assert status == 400 and err["field"] == "limit"
