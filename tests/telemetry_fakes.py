"""A tiny tornado app that plays the broker API, for telemetry and server-extension tests."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ports import free_port
from tornado import web
from tornado.httpserver import HTTPServer

TOKEN = "test-hub-token"


@dataclass
class BrokerState:
    grants: dict[str, dict[str, Any]] = field(default_factory=dict)
    teams: dict[str, dict[str, Any]] = field(default_factory=dict)
    notices: list[dict[str, Any]] = field(default_factory=list)
    heartbeats: list[dict[str, Any]] = field(default_factory=list)
    auth_headers: list[str] = field(default_factory=list)


class _Base(web.RequestHandler):
    def initialize(self, state: BrokerState) -> None:
        self.state = state

    def prepare(self) -> None:
        auth = self.request.headers.get("Authorization", "")
        self.state.auth_headers.append(auth)
        if auth != f"token {TOKEN}":
            raise web.HTTPError(403)


class GrantH(_Base):
    def get(self, gid: str) -> None:
        if gid not in self.state.grants:
            raise web.HTTPError(404)
        self.finish(self.state.grants[gid])


class TeamH(_Base):
    def get(self, team: str) -> None:
        if team not in self.state.teams:
            raise web.HTTPError(404)
        self.finish(self.state.teams[team])


class NoticesH(_Base):
    def get(self) -> None:
        gid = self.get_argument("grant_id")
        self.finish({"notices": [n for n in self.state.notices if n["grant_id"] == gid]})


class HeartbeatH(_Base):
    def post(self) -> None:
        self.state.heartbeats.append(json.loads(self.request.body))
        self.set_status(204)
        self.finish()


class FakeBroker:
    """Serves ``/api/v1/...`` on 127.0.0.1 on a free port."""

    prefix = "/services/gpushare/api/v1"

    def __init__(self) -> None:
        self.state = BrokerState()
        self.port = free_port()
        self.server: HTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}{self.prefix}"

    def start(self) -> None:
        p, kw = self.prefix, {"state": self.state}
        app = web.Application(
            [
                (rf"{p}/grants/([^/]+)", GrantH, kw),
                (rf"{p}/teams/([^/]+)/usage", TeamH, kw),
                (rf"{p}/notices", NoticesH, kw),
                (rf"{p}/heartbeats", HeartbeatH, kw),
            ]
        )
        self.server = HTTPServer(app)
        self.server.listen(self.port, "127.0.0.1")

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()


# -- server-extension test helpers ---------------------------------------------------

EXT_CONFIG: dict[str, Any] = {
    "ServerApp": {"jpserver_extensions": {"jupyter_gpushare.serverextension": True}},
}


def clear_gpushare_env(monkeypatch: Any) -> None:
    import os

    for k in list(os.environ):
        if k.startswith("GPUSHARE_"):
            monkeypatch.delenv(k)


def grant_env(monkeypatch: Any, broker_url: str | None, **extra: str) -> None:
    """Set the spawner's GPUSHARE_* contract for a simulated grant."""
    clear_gpushare_env(monkeypatch)
    env = {
        "GPUSHARE_GRANT_ID": "g-1",
        "GPUSHARE_GPU_UUIDS": "GPU-sim-node0-0",
        "GPUSHARE_MEMORY_LIMIT_MIB": "10240",
        "GPUSHARE_COMPUTE_PCT": "25",
        "GPUSHARE_UNITS": "0.25",
        "GPUSHARE_PROFILE": "inference-dev",
        "GPUSHARE_TEAM": "vision",
        "GPUSHARE_POOL": "shared",
        "GPUSHARE_BORROWED": "true",
        "GPUSHARE_ENFORCEMENT": "env",
        "GPUSHARE_SIMULATED": "1",
        "JUPYTERHUB_API_TOKEN": TOKEN,
        **extra,
    }
    if broker_url:
        env["GPUSHARE_BROKER_URL"] = broker_url
    for k, v in env.items():
        monkeypatch.setenv(k, v)


async def wait_until(pred: Any, timeout: float = 60.0, what: str = "condition") -> Any:
    """Poll ``pred`` (sync or async) until truthy; fail after a generous timeout."""
    import asyncio
    import inspect
    import time

    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if inspect.isawaitable(v):
            v = await v
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)
