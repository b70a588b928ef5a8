"""The spawner's poll: the grant check after a hub restart is retried until the broker
answers, a server found dead gives its grant back at once (pure: a stand-in broker), and the
first poll after a restart waits for a server that is still starting (a real HTTP server)."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import pytest
from jupyterhub.objects import Server
from jupyterhub.spawner import Spawner
from realhub import free_port

from jupyter_gpushare.broker.client import BrokerError, GrantInfo
from jupyter_gpushare.spawner.mixin import GPUShareSpawner


class _Process(Spawner):
    status: int | None = None

    async def start(self) -> Any:
        return ("127.0.0.1", 1)

    async def stop(self, now: bool = False) -> None:
        return None

    async def poll(self) -> Any:
        return self.status


class Spawn(GPUShareSpawner, _Process):
    pass


class Broker:
    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.asked = 0
        self.released: list[str] = []
        self.base_url = "http://broker"

    async def get_grant(self, gid: str, retry_window_s: float | None = None) -> GrantInfo:
        self.asked += 1
        if self.failures:
            self.failures -= 1
            raise BrokerError(503, "gpushare broker unreachable")
        return GrantInfo(id=gid, user="alice")

    async def release_grant(self, gid: str) -> None:
        self.released.append(gid)


def spawner(broker: Broker) -> Spawn:
    s = Spawn(user=SimpleNamespace(name="alice", groups=[]), _log_name="alice")
    s.load_state({"gpushare_grant_id": "g-1", "gpushare_profile": "half"})
    s._gpushare_client = broker
    s.broker_url = broker.base_url
    return s


async def test_grant_check_is_retried_until_the_broker_answers() -> None:
    b = Broker(failures=2)
    s = spawner(b)
    s.grant_check_retry_s = 0.0
    for _ in range(5):
        assert await s.poll() is None
    assert b.asked == 3  # two failures, then it knew, then never again
    assert s.gpushare_grant is not None and s.gpushare_grant.id == "g-1"


async def test_retry_waits_between_tries(monkeypatch) -> None:
    b = Broker(failures=1)
    s = spawner(b)
    await s.poll()
    await s.poll()  # within CHECK_RETRY_S: not asked again yet
    assert b.asked == 1


async def test_a_dead_server_gives_its_grant_back_at_once() -> None:
    b = Broker(failures=0)
    s = spawner(b)
    s.status = -9
    assert await s.poll() == -9
    assert b.released == ["g-1"] and s.grant_id is None
    assert s.gpushare_last_stop and s.gpushare_last_stop["kind"] == "died"
    assert "stopped by itself" in s.gpushare_stop_message


def test_a_server_with_a_grant_is_polled_fast() -> None:
    s = spawner(Broker(0))
    assert s.poll_interval == pytest.approx(2.0)
    plain = Spawn(user=SimpleNamespace(name="bob", groups=[]), _log_name="bob")
    plain.load_state({})
    assert plain.poll_interval == 30


# -- after a hub restart: a server still starting is asked until it answers ------------------


class _Later:
    """An HTTP server on ``port`` that starts listening ``after`` seconds from now."""

    def __init__(self, port: int, after: float) -> None:
        from tornado.httpserver import HTTPServer
        from tornado.web import Application, RequestHandler

        class Root(RequestHandler):
            def get(self) -> None:
                self.redirect("/hub/login")  # what a single-user server answers a stranger

        self.server = HTTPServer(Application([(r"/.*", Root)]))
        self.port = port
        self.listening_at = 0.0
        asyncio.get_running_loop().call_later(after, self._listen)

    def _listen(self) -> None:
        self.server.listen(self.port, "127.0.0.1")
        self.listening_at = time.monotonic()


def running_spawner(port: int) -> Spawn:
    """A spawner as the hub's start finds it: loaded, and its check pending (init_spawners)."""
    s = spawner(Broker(failures=0))
    s.server = Server(ip="127.0.0.1", port=port, base_url="/user/alice/")
    s._check_pending = True
    return s


async def test_the_first_poll_after_a_restart_waits_until_the_server_answers() -> None:
    port = free_port()
    later = _Later(port, after=0.8)
    s = running_spawner(port)
    began = time.monotonic()
    assert await s.poll() is None
    done = time.monotonic()
    assert later.listening_at, "the poll came back before the server listened"
    # asked every ANSWER_POLL_S: seen within a try of it answering (JupyterHub's own check
    # backs off to 5 s between tries)
    assert done - later.listening_at < 0.35, done - later.listening_at
    assert done - began >= 0.8
    later.server.stop()


async def test_only_the_hubs_check_on_its_start_waits_and_never_past_http_timeout() -> None:
    port = free_port()  # nothing ever listens there (a server whose node died)
    s = running_spawner(port)
    s.http_timeout = 1
    began = time.monotonic()
    assert await s.poll() is None
    assert 0.8 <= time.monotonic() - began < 2.0  # gave up after http_timeout
    s._check_pending = False  # the hub's check is over: its periodic polls never wait
    began = time.monotonic()
    assert await s.poll() is None
    assert time.monotonic() - began < 0.3
    loaded = spawner(Broker(failures=0))  # loaded from the database, not being checked
    loaded.server = Server(ip="127.0.0.1", port=port, base_url="/user/alice/")
    began = time.monotonic()
    assert await loaded.poll() is None
    assert time.monotonic() - began < 0.3


async def test_a_server_answering_5xx_is_not_yet_up() -> None:
    """As JupyterHub's own check: a 5xx (a proxy's 503, a server still loading) is asked
    again; only an answer below 500 ends the wait."""
    from tornado.httpserver import HTTPServer
    from tornado.web import Application, RequestHandler

    ready_at = time.monotonic() + 0.6

    class Root(RequestHandler):
        def get(self) -> None:
            if time.monotonic() < ready_at:
                self.set_status(503)
            else:
                self.redirect("/hub/login")

    port = free_port()
    server = HTTPServer(Application([(r"/.*", Root)]))
    server.listen(port, "127.0.0.1")
    try:
        s = running_spawner(port)
        assert await s.poll() is None
        assert time.monotonic() >= ready_at
    finally:
        server.stop()
