"""A preemption stops a victim's server only once its spawn has been answered.

Found by the soak harness (issue 28, seed 43): a borrowed training GPU was reclaimed while its
server was still being spawned; the broker's DELETE made JupyterHub interrupt the spawn and
answer the user's own spawn request 500 (an uncaught CancelledError in the hub). The hub
answers a spawn request 202 once the spawn is ``slow_spawn_timeout`` (10 s) old, so the
broker waits while the server is pending ``spawn`` and younger than that, then stops it.

A real tornado server stands in for the hub's ``GET /users/<name>`` and
``DELETE /users/<name>/server``; the pending spawn ends (or not) when the test says.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from realhub import free_port
from tornado import web
from tornado.httpserver import HTTPServer

from jupyter_gpushare.broker.hubclient import HubClient


class Hub:
    """One user, alice, whose default server is pending spawn since ``started``."""

    def __init__(self, started_ago_s: float) -> None:
        self.port = free_port()
        self.pending: str | None = "spawn"
        self.started = dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=started_ago_s)
        self.deleted_at: float | None = None
        hub = self

        class User(web.RequestHandler):
            def get(self, name: str) -> None:
                server = {"pending": hub.pending, "ready": hub.pending is None,
                          "started": hub.started.isoformat().replace("+00:00", "Z")}
                self.finish(json.dumps({"name": name, "servers": {"": server}}))

        class Server(web.RequestHandler):
            def delete(self, name: str) -> None:
                hub.deleted_at = time.monotonic()
                self.set_status(204)

        app = web.Application([(r"/hub/api/users/([^/]+)", User),
                               (r"/hub/api/users/([^/]+)/server", Server)])
        self.server = HTTPServer(app)
        self.server.listen(self.port, "127.0.0.1")

    def client(self) -> HubClient:
        return HubClient(f"http://127.0.0.1:{self.port}/hub/api", "t")


@pytest.fixture
async def hubs() -> AsyncIterator[list[Hub]]:
    made: list[Hub] = []
    yield made
    for h in made:
        h.server.stop()


async def test_a_server_being_spawned_is_stopped_once_its_spawn_ended(hubs: list[Any]) -> None:
    hub = Hub(started_ago_s=1.0)
    hubs.append(hub)
    t0 = time.monotonic()
    stop = asyncio.ensure_future(hub.client().stop_server("alice", "", let_spawn_answer_s=10))
    await asyncio.sleep(1.2)
    assert hub.deleted_at is None  # still spawning, 2 s old: not yet
    hub.pending = None  # the spawn ended (its request answered)
    assert await stop is True
    assert hub.deleted_at is not None and 1.2 <= hub.deleted_at - t0 < 3.0


async def test_a_spawn_older_than_the_hubs_answer_time_is_not_waited_for(hubs: list[Any]) -> None:
    hub = Hub(started_ago_s=11.0)  # its request was answered 202 a second ago
    hubs.append(hub)
    t0 = time.monotonic()
    assert await hub.client().stop_server("alice", "", let_spawn_answer_s=10) is True
    assert hub.deleted_at is not None and hub.deleted_at - t0 < 1.0


async def test_the_wait_ends_when_the_spawn_is_old_enough_even_if_still_pending(
    hubs: list[Any],
) -> None:
    hub = Hub(started_ago_s=8.5)  # 1.5 s to go
    hubs.append(hub)
    t0 = time.monotonic()
    assert await hub.client().stop_server("alice", "", let_spawn_answer_s=10) is True
    assert hub.deleted_at is not None and 1.0 <= hub.deleted_at - t0 < 3.0


async def test_without_a_wait_the_server_is_stopped_at_once(hubs: list[Any]) -> None:
    hub = Hub(started_ago_s=1.0)  # the culler and reconcile stop what they stop at once
    hubs.append(hub)
    t0 = time.monotonic()
    assert await hub.client().stop_server("alice", "") is True
    assert hub.deleted_at is not None and hub.deleted_at - t0 < 1.0


class RecordingHub:
    """What the preemption runner asks of the hub (and the spawner's release on a stop)."""

    def __init__(self, broker: Any) -> None:
        self.broker = broker
        self.stops: list[tuple[str, str, float]] = []

    async def stop_server(self, user: str, server: str, let_spawn_answer_s: float = 0.0) -> bool:
        self.stops.append((user, server, let_spawn_answer_s))
        for gid, g in list(self.broker.state.grants.items()):
            if g.user == user and g.request.holder == server:
                self.broker.release(gid, "released by holder")
        return True


async def test_a_preemption_lets_a_victims_spawn_be_answered(tmp_path: Any) -> None:
    from brokerpolicies import small
    from corefactory import request as ask

    from jupyter_gpushare.broker.service.broker import Broker
    from jupyter_gpushare.broker.service.preempt import SPAWN_ANSWER_S, PreemptionRunner
    from jupyter_gpushare.broker.store.db import make_engine

    engine = make_engine(f"sqlite:///{tmp_path}/b.sqlite")
    now = [1_800_000_000.0]
    broker = Broker(small(), engine, clock=lambda: now[0])
    broker.load()
    try:
        for i in range(4):  # team b's servers borrow the 4 training GPUs
            ans = broker.submit(ask("b", "train", whole=1, user=f"bob{i}", priority="research"))
            assert ans["status"] == "granted", ans
        ans = broker.submit(ask("a", "train", whole=1, user="alice", priority="training"))
        assert ans["status"] == "preempting", ans
        hub = RecordingHub(broker)
        runner = PreemptionRunner(hub, None)  # type: ignore[arg-type]
        runner.broker = broker
        now[0] += 2  # past the grace period
        await runner.execute(ans["request_id"])
        assert hub.stops and all(wait == SPAWN_ANSWER_S == 10.0 for _, _, wait in hub.stops)
    finally:
        broker.close()
        engine.dispose()
