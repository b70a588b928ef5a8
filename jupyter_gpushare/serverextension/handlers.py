"""HTTP and WebSocket handlers under ``/gpushare/api/``; every one is authenticated."""

from __future__ import annotations

import json
from typing import Any

from jupyter_core.utils import ensure_async
from jupyter_server.auth.decorator import authorized, ws_authenticated
from jupyter_server.base.handlers import APIHandler, JupyterHandler
from jupyter_server.extension.handler import ExtensionHandlerMixin
from tornado import web, websocket

from .service import TelemetryService

AUTH_RESOURCE = "gpushare"


class _ServiceMixin:
    settings: dict[str, Any]

    @property
    def service(self) -> TelemetryService:
        svc: TelemetryService = self.settings["gpushare_service"]
        return svc


class MetricsHandler(_ServiceMixin, ExtensionHandlerMixin, APIHandler):
    """Current sample of this server's GPUs, with the grant's limits."""

    auth_resource = AUTH_RESOURCE

    @web.authenticated
    @authorized
    async def get(self) -> None:
        await self.service.start()
        current = await self.service.current_answer()
        if current is None:
            raise web.HTTPError(503, "no GPU sample yet")
        self.finish(json.dumps(current))


class HistoryHandler(_ServiceMixin, ExtensionHandlerMixin, APIHandler):
    """Sample history (``?since=<unix time>`` for the newer ones only)."""

    auth_resource = AUTH_RESOURCE

    @web.authenticated
    @authorized
    async def get(self) -> None:
        await self.service.start()
        since_arg = self.get_argument("since", None)
        try:
            since = float(since_arg) if since_arg else None
        except ValueError as exc:
            raise web.HTTPError(400, "since must be a unix time in seconds") from exc
        self.finish(json.dumps(self.service.history_answer(since)))


class GrantHandler(_ServiceMixin, ExtensionHandlerMixin, APIHandler):
    """The grant: profile, team, borrowed or not, preemption notices and deadlines."""

    auth_resource = AUTH_RESOURCE

    @web.authenticated
    @authorized
    async def get(self) -> None:
        self.finish(json.dumps(await self.service.grant_answer()))


class TeamHandler(_ServiceMixin, ExtensionHandlerMixin, APIHandler):
    """The team's usage, from the broker."""

    auth_resource = AUTH_RESOURCE

    @web.authenticated
    @authorized
    async def get(self) -> None:
        self.finish(json.dumps(await self.service.team_answer()))


class StreamHandler(
    _ServiceMixin, ExtensionHandlerMixin, JupyterHandler, websocket.WebSocketHandler
):
    """WebSocket: one ``{"type": "sample", ...}`` message per sample, plus
    ``{"type": "watchdog"}`` and ``{"type": "notice"}`` events."""

    auth_resource = AUTH_RESOURCE

    async def pre_get(self) -> None:
        user = self.current_user
        ok = await ensure_async(self.authorizer.is_authorized(self, user, "read", AUTH_RESOURCE))
        if not ok:
            raise web.HTTPError(403)

    @ws_authenticated
    async def get(self, *args: Any, **kwargs: Any) -> None:
        await self.pre_get()
        await self.service.start()
        res = super().get(*args, **kwargs)
        if res is not None:
            await res

    def open(self, *args: Any, **kwargs: Any) -> None:
        self.service.subscribe(self._send)

    def _send(self, message: str) -> None:
        if self.ws_connection is None or self.ws_connection.is_closing():
            raise websocket.WebSocketClosedError()
        self.write_message(message)

    def on_message(self, message: str | bytes) -> None:
        """Clients need not send anything; ``ping`` is answered."""
        if message == "ping":
            self.write_message(json.dumps({"type": "pong"}))

    def on_close(self) -> None:
        self.service.unsubscribe(self._send)


def handlers() -> list[tuple[str, type]]:
    """Routes, relative to the server's base URL."""
    return [
        (r"/gpushare/api/metrics", MetricsHandler),
        (r"/gpushare/api/metrics/history", HistoryHandler),
        (r"/gpushare/api/metrics/stream", StreamHandler),
        (r"/gpushare/api/grant", GrantHandler),
        (r"/gpushare/api/team", TeamHandler),
    ]
