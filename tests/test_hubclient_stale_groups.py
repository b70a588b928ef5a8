"""While the hub restarts, the broker's hub client answers a user's groups as last read
(for a bounded time), so admission does not stop with the hub; a user never read, or read too
long ago, still gets the hub's error. The cache is bounded in users.

A real tornado server stands in for the hub's ``GET /users/<name>``; it is stopped to play
the hub being down.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest
from realhub import free_port
from tornado import web
from tornado.httpserver import HTTPServer

from jupyter_gpushare.broker.hubclient import HubClient, HubError

GROUPS = {"alice": ["alpha"], "bob": ["beta"]}


class UserHandler(web.RequestHandler):
    def get(self, name: str) -> None:
        self.application.settings["asked"].append(name)  # type: ignore[attr-defined]
        if name not in GROUPS:
            raise web.HTTPError(404)
        self.finish(json.dumps({"name": name, "groups": GROUPS[name]}))


class Hub:
    def __init__(self) -> None:
        self.port = free_port()
        self.asked: list[str] = []
        self.server: HTTPServer | None = None

    def start(self) -> None:
        app = web.Application([(r"/hub/api/users/([^/]+)", UserHandler)], asked=self.asked)
        self.server = HTTPServer(app)
        self.server.listen(self.port, "127.0.0.1")

    def stop(self) -> None:
        assert self.server is not None
        self.server.stop()
        self.server = None


@pytest.fixture
async def hub() -> AsyncIterator[Hub]:
    h = Hub()
    h.start()
    yield h
    if h.server is not None:
        h.stop()


def client(hub: Hub, ttl: float, stale_max: float) -> HubClient:
    return HubClient(f"http://127.0.0.1:{hub.port}/hub/api", "t", ttl, stale_max)


async def test_groups_as_last_read_stand_while_the_hub_is_down(hub: Hub) -> None:
    c = client(hub, ttl=0.0, stale_max=3600.0)
    assert await c.groups_of("alice") == ("alpha",)
    assert await c.groups_of("alice") == ("alpha",)
    assert hub.asked == ["alice", "alice"]  # a TTL of 0 asks every time
    hub.stop()
    assert await c.groups_of("alice") == ("alpha",)  # the hub is down: as last read
    with pytest.raises(HubError):
        await c.groups_of("bob")  # never read: nothing to stand for it


async def test_groups_read_too_long_ago_do_not_stand(hub: Hub) -> None:
    c = client(hub, ttl=0.0, stale_max=0.0)
    assert await c.groups_of("alice") == ("alpha",)
    hub.stop()
    with pytest.raises(HubError):
        await c.groups_of("alice")


async def test_within_the_ttl_the_hub_is_not_asked_again(hub: Hub) -> None:
    c = client(hub, ttl=60.0, stale_max=3600.0)
    await c.groups_of("alice")
    await c.groups_of("alice")
    assert hub.asked == ["alice"]


async def test_the_cache_keeps_at_most_its_bound_of_users_dropping_the_oldest(
    hub: Hub, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(HubClient, "MAX_CACHED_USERS", 2)
    c = client(hub, ttl=60.0, stale_max=3600.0)
    for name in ("alice", "bob", "carol", "alice"):
        await c.groups_of(name)
    assert list(c._groups) == ["carol", "alice"]  # bob, the oldest read, was dropped
