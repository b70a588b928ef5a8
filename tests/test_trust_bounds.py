"""Issue 23, findings 8, 9 and 14 (broker side): bounds on what one client can make the
broker store or hold open, and on what it quotes back.

* 8: a per-user token bucket on ``POST /requests`` (429, Retry-After, the limit named)
  and retention of request rows (days, rows per user), never a live one or a ledger's;
* 9: notice streams per user (429 naming the limit; others still get theirs);
* 14: a name longer than ``max_name_length`` anywhere (body or path) is a 400 that quotes
  it shortened, and log lines quote URIs shortened.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any

import pytest
from brokerkit import BASE, call, start_broker, static_tokens
from brokerpolicies import small
from sqlalchemy import func, insert, select, update
from tornado.httpclient import AsyncHTTPClient, HTTPRequest
from traitlets.config import Config

from jupyter_gpushare.broker.ops.retention import DAY, RequestRetention
from jupyter_gpushare.broker.service.ratelimit import TokenBuckets, retry_after
from jupyter_gpushare.broker.store.db import requests_table

USERS = {"alice": ["a"], "bob": ["b"], "carol": ["a"]}
SHARED = {"pool": "shared", "gpu": {"fraction": 0.25}}


async def _broker(tmp_path: Any, **limits: Any) -> Any:
    config = Config()
    for key, value in limits.items():
        setattr(config.BrokerLimits, key, value)
    config.BrokerLimits.setdefault("requests_per_minute_per_user", 0)
    return await start_broker(small(), f"sqlite:///{tmp_path}/b.sqlite", static_tokens(USERS),
                              config=config)


def _rows(app: Any, **where: Any) -> int:
    r = requests_table.c
    query = select(func.count()).select_from(requests_table)
    for key, value in where.items():
        query = query.where(getattr(r, key) == value)
    with app.broker.engine.connect() as conn:
        return int(conn.execute(query).scalar_one())


# -- 8: request rate per user ------------------------------------------------------------------


def test_token_bucket_refills_at_its_rate_and_forgets_full_buckets() -> None:
    now = [1000.0]
    buckets = TokenBuckets(lambda: 60.0, lambda: 3, lambda: now[0])
    assert [buckets.take("u") for _ in range(3)] == [None, None, None]
    wait = buckets.take("u")
    assert wait == pytest.approx(1.0) and retry_after(wait) == "1"  # type: ignore[arg-type]
    assert buckets.take("v") is None  # another user has their own bucket
    now[0] += 0.5
    assert buckets.take("u") == pytest.approx(0.5)
    now[0] += 0.5
    assert buckets.take("u") is None and buckets.take("u") is not None
    now[0] += 10.0  # full again: the bucket is dropped at the next sweep
    assert buckets.take("w") is None and set(buckets.buckets) == {"w"}
    off = TokenBuckets(lambda: 0.0, lambda: 1, lambda: now[0])
    assert all(off.take("u") is None for _ in range(100))


async def test_requests_beyond_the_burst_are_429_and_store_nothing(tmp_path: Any) -> None:
    app = await _broker(tmp_path, requests_per_minute_per_user=60.0, request_burst_per_user=4)
    try:
        answers = []
        for i in range(4):  # the burst: the 4th is still accepted
            body = {**SHARED, "server": f"s{i}", "idempotency_key": f"k{i}"}
            answers.append(await call(app, "POST", "/requests", "tok-alice", body))
        assert [s for s, _ in answers] == [201, 201, 201, 201], answers
        stored = _rows(app)
        status, err = await call(app, "POST", "/requests", "tok-alice", {**SHARED, "server": "x"})
        assert status == 429, err
        assert err["code"] == "requests_per_minute_per_user"
        assert "requests_per_minute_per_user" in err["error"] and "60" in err["error"]
        assert _rows(app) == stored  # the refused one is not stored
        # a retry of an answered request costs nothing and still gets its answer
        status, again = await call(app, "POST", "/requests", "tok-alice",
                                   {**SHARED, "server": "s0", "idempotency_key": "k0"})
        assert status == 201 and again["request_id"] == answers[0][1]["request_id"]
        # the hub's spawner (act-as) is not counted: it throttles its own spawns
        for i in range(6):
            status, ans = await call(app, "POST", "/requests", "tok-spawner",
                                     {**SHARED, "user": "alice", "server": f"sp{i}",
                                      "groups": ["a"]})
            assert status in (201, 409), ans
        # another user is not slowed down by alice
        assert (await call(app, "POST", "/requests", "tok-bob", {**SHARED, "server": "b"}))[0] \
            in (201, 409)
        resp = await AsyncHTTPClient().fetch(HTTPRequest(
            f"http://127.0.0.1:{app.port}{BASE}/requests", method="POST",
            headers={"Authorization": "token tok-alice"}, body=json.dumps(SHARED)),
            raise_error=False)
        assert resp.code == 429 and resp.headers["Retry-After"] == "1"
        await asyncio.sleep(1.1)  # one token back
        status, ok = await call(app, "POST", "/requests", "tok-alice", {**SHARED, "server": "y"})
        assert status == 201, ok
    finally:
        await app.stop_async()


# -- 8: retention of request rows --------------------------------------------------------------


def _age(app: Any, request_id: str, days: float) -> None:
    when = app.broker.clock() - days * DAY
    with app.broker.engine.begin() as conn:
        conn.execute(update(requests_table).where(requests_table.c.id == request_id)
                     .values(created_at=when, updated_at=when))


async def test_retention_deletes_old_finished_rows_and_never_a_live_or_ledger_one(
    tmp_path: Any,
) -> None:
    app = await _broker(tmp_path, request_retention_days=30.0, max_request_rows_per_user=0)
    try:
        post = lambda tok, body: call(app, "POST", "/requests", tok, body)  # noqa: E731
        _, live = await post("tok-alice", {"pool": "train", "gpu": {"count": 4}, "server": "g"})
        _, released = await post("tok-bob", {"pool": "shared", "gpu": {"count": 1},
                                             "server": "r"})
        await call(app, "DELETE", f"/grants/{released['grant_id']}", "tok-bob")
        _, queued = await post("tok-carol", {"pool": "train", "gpu": {"count": 1},
                                             "server": "q", "kind": "batch"})
        _, refused = await post("tok-bob", {"pool": "debug", "gpu": {"count": 4},
                                            "server": "f"})
        _, cancelled = await post("tok-bob", {"pool": "train", "gpu": {"count": 4},
                                              "server": "c", "kind": "batch"})
        await call(app, "DELETE", f"/requests/{cancelled['request_id']}", "tok-bob")
        _, recent = await post("tok-bob", {"pool": "debug", "gpu": {"count": 4}, "server": "n"})
        assert live["status"] == "granted" and queued["status"] == "queued", (live, queued)
        assert refused["status"] == recent["status"] == "refused", refused
        assert _rows(app, id=cancelled["request_id"], status="cancelled") == 1
        assert _rows(app, id=released["request_id"], status="released") == 1
        # a queued row the broker no longer holds in memory (e.g. written by a crashed
        # commit): the status alone keeps it
        with app.broker.engine.begin() as conn:
            conn.execute(insert(requests_table).values(
                id="r-orphan", username="bob", server="o", team="b", pool="train",
                kind="interactive", profile="", status="queued", reason="", code="",
                spec={}, grant_id=None, idempotency_key=None, created_at=0.0, updated_at=0.0))
        for view in (live, released, queued, refused, cancelled):
            _age(app, view["request_id"], 31)
        _age(app, recent["request_id"], 29)
        deleted = RequestRetention(app.broker).prune()
        with app.broker.engine.connect() as conn:
            kept = set(conn.execute(select(requests_table.c.id)).scalars())
        assert deleted == 2, kept
        assert refused["request_id"] not in kept and cancelled["request_id"] not in kept
        assert {live["request_id"], released["request_id"], queued["request_id"],
                recent["request_id"], "r-orphan"} <= kept
        # what is left still answers
        for view in (live, released, queued):
            status, ans = await call(app, "GET", f"/requests/{view['request_id']}", "tok-admin")
            assert status == 200, ans
    finally:
        await app.stop_async()


async def test_retention_keeps_the_newest_rows_per_user_at_the_exact_count(
    tmp_path: Any,
) -> None:
    app = await _broker(tmp_path, request_retention_days=0.0, max_request_rows_per_user=3,
                        request_prune_batch=2)
    try:
        ids = []
        for i in range(6):
            status, ans = await call(app, "POST", "/requests", "tok-bob",
                                     {"pool": "debug", "gpu": {"count": 4}, "server": f"s{i}"})
            assert status == 409, ans
            _age(app, ans["request_id"], 6 - i)  # older first
            ids.append(ans["request_id"])
        await call(app, "POST", "/requests", "tok-alice",
                   {"pool": "debug", "gpu": {"count": 4}, "server": "a"})
        retention = RequestRetention(app.broker)
        assert retention.prune_once() == 2  # a batch at a time
        assert retention.prune() == 1
        with app.broker.engine.connect() as conn:
            kept = set(conn.execute(select(requests_table.c.id)).scalars())
        assert {i for i in ids if i in kept} == set(ids[3:])  # the newest 3, exactly
        assert _rows(app, username="alice") == 1
        assert retention.prune() == 0
    finally:
        await app.stop_async()


# -- 9: notice streams per user ----------------------------------------------------------------


class Stream:
    """An open notice stream (the client holds it until ``close``)."""

    def __init__(self, app: Any, token: str, timeout: float = 60) -> None:
        self.seen: list[bytes] = []
        self.client = AsyncHTTPClient(force_instance=True)
        self.done = asyncio.ensure_future(self.client.fetch(HTTPRequest(
            f"http://127.0.0.1:{app.port}{BASE}/notices/stream",
            headers={"Authorization": f"token {token}"},
            streaming_callback=self.seen.append, request_timeout=timeout), raise_error=False))

    async def opened(self) -> bool:
        for _ in range(100):
            if b"connected" in b"".join(self.seen):
                return True
            if self.done.done():
                return False
            await asyncio.sleep(0.02)
        return False

    async def close(self) -> None:
        self.client.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.done, 2)


async def test_one_user_cannot_hold_every_notice_stream(tmp_path: Any) -> None:
    app = await _broker(tmp_path, max_notice_streams_per_user=2, max_notice_subscribers=4)
    streams: list[Stream] = []
    try:
        for timeout in (2.0, 60.0):  # the limit itself: still open (the first hangs up)
            streams.append(Stream(app, "tok-alice", timeout))
            assert await streams[-1].opened()
        status, err = await call(app, "GET", "/notices/stream", "tok-alice")
        assert status == 429, err
        assert err["code"] == "max_notice_streams_per_user"
        assert "max_notice_streams_per_user" in err["error"] and "2" in err["error"]
        streams.append(Stream(app, "tok-bob"))  # others still get theirs
        assert await streams[-1].opened()
        await streams.pop(0).close()  # alice hangs up one: she may open one again
        for _ in range(200):
            if app.ctx.streams_by_owner["user:alice"] == 1:
                break
            await asyncio.sleep(0.02)
        streams.append(Stream(app, "tok-alice"))
        assert await streams[-1].opened()
        assert dict(app.ctx.streams_by_owner) == {"user:alice": 2, "user:bob": 1}
    finally:
        for stream in streams:
            await stream.close()
        await app.stop_async()


# -- 14: names bounded and never echoed whole --------------------------------------------------

LONG = "p" * 100_000
PATH = "q" * 30_000


@pytest.mark.parametrize(("method", "path", "body"), [
    ("POST", "/requests", {"profile": LONG}),
    ("POST", "/requests", {**SHARED, "team": LONG}),
    ("POST", "/requests", {"profile": {"pool": "shared", "gpu": {"fraction": 0.5},
                                       "priority": LONG}}),
    ("POST", "/heartbeats", {"grant_id": LONG}),
    ("POST", "/jobs", {"notebook": {}, "profile": LONG}),
    ("POST", "/jobs", {"notebook": {}, "profile": "p" * 250}),
    ("GET", f"/requests/{PATH}", None),
    ("DELETE", f"/grants/{PATH}", None),
    ("GET", f"/teams/{PATH}/usage", None),
    ("GET", f"/jobs/{PATH}/log", None),
    ("POST", f"/admin/nodes/{PATH}/drain", {}),
])
async def test_a_long_name_is_refused_and_quoted_shortened(
    tmp_path: Any, method: str, path: str, body: Any,
) -> None:
    app = await _broker(tmp_path)
    records: list[str] = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = lambda record: records.append(record.getMessage())  # type: ignore[method-assign]
    app.log.addHandler(handler)
    app.log.setLevel(logging.DEBUG)
    try:
        for token in ("tok-alice", "tok-admin"):
            status, err = await call(app, method, path, token, body)
            assert 400 <= status < 500, (status, str(err)[:200])
            assert len(json.dumps(err)) < 400, (status, json.dumps(err)[:300])
            assert "p" * 65 not in json.dumps(err) and "q" * 201 not in json.dumps(err)
        assert records and all(len(line) < 500 for line in records), max(map(len, records))
    finally:
        app.log.removeHandler(handler)
        await app.stop_async()


def test_an_error_message_is_cut_whatever_a_handler_quoted_into_it() -> None:
    from jupyter_gpushare.broker.api.handler_base import MAX_ERROR_MESSAGE, bounded_message

    assert bounded_message("short") == "short"
    cut = bounded_message("x" * 1_048_576)
    assert len(cut) < MAX_ERROR_MESSAGE + 40 and cut.endswith("… (1048576 characters)")


async def test_the_broker_prunes_request_rows_periodically(tmp_path: Any) -> None:
    app = await _broker(tmp_path, request_retention_days=1.0, request_prune_interval_s=1.0)
    try:
        status, ans = await call(app, "POST", "/requests", "tok-bob",
                                 {"pool": "debug", "gpu": {"count": 4}, "server": "f"})
        assert status == 409, ans
        _age(app, ans["request_id"], 2)
        for _ in range(60):
            if _rows(app) == 0:
                break
            await asyncio.sleep(0.1)
        assert _rows(app) == 0 and app.retention.deleted_total == 1
    finally:
        await app.stop_async()
