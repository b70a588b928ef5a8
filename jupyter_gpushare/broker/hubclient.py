"""A small async client of the JupyterHub REST API, with the broker's own token."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from datetime import datetime
from typing import Any, Protocol
from urllib.parse import quote

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

log = logging.getLogger("gpushare.broker.hub")


class HubError(RuntimeError):
    """The hub could not be asked (down, or refused the broker's token)."""


class GroupsMemory(Protocol):
    """Told each user's groups as the hub gave them (the broker's: :class:`.ops.carry.Carry`)."""

    def groups_learnt(self, name: str, read_at: float, groups: tuple[str, ...]) -> None:
        """``name``'s ``groups``, read from the hub at ``read_at`` (monotonic)."""


class HubClient:
    """Users, groups and servers from the hub; stops servers on preemption."""

    MAX_CACHED_USERS = 10_000
    """Users whose groups are kept at most (the oldest read is dropped first)."""

    def __init__(
        self,
        api_url: str,
        token: str,
        groups_ttl_s: float = 60.0,
        groups_stale_max_s: float = 3600.0,
    ) -> None:
        self.api_url = api_url.rstrip("/")
        self.token = token
        self.groups_ttl_s = groups_ttl_s
        self.groups_stale_max_s = groups_stale_max_s
        self._groups: dict[str, tuple[float, tuple[str, ...]]] = {}  # name -> (read at, groups)
        self.memory: GroupsMemory | None = None  # told each answer (the carry), if any

    async def _call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        req = HTTPRequest(
            self.api_url + path,
            method=method,
            headers={"Authorization": f"token {self.token}", "Content-Type": "application/json"},
            body=None if body is None and method in ("GET", "DELETE") else json.dumps(body or {}),
            allow_nonstandard_methods=True,
            request_timeout=20,
        )
        try:
            resp = await AsyncHTTPClient().fetch(req)
        except HTTPClientError as exc:
            if exc.code in (404, 400):
                return exc.code, None
            raise HubError(f"{method} {path}: hub answered {exc.code}") from exc
        except OSError as exc:
            raise HubError(f"{method} {path}: {exc}") from exc
        data = json.loads(resp.body) if resp.body else None
        return resp.code, data

    async def get_user(self, name: str) -> dict[str, Any] | None:
        """The hub's model of ``name`` (with ``servers``), or ``None`` if no such user."""
        code, data = await self._call("GET", f"/users/{quote(name, safe='')}")
        return data if code == 200 else None

    async def active_users(self, page: int = 200) -> list[dict[str, Any]]:
        """Every user with an active server (``GET /users?state=active``, page by page)."""
        out: list[dict[str, Any]] = []
        offset = 0
        while True:
            code, data = await self._call(
                "GET", f"/users?state=active&offset={offset}&limit={page}"
            )
            items = data.get("items", []) if isinstance(data, dict) else (data or [])
            out.extend(items)
            if code != 200 or len(items) < page:
                return out
            offset += len(items)

    async def groups_of(self, name: str) -> tuple[str, ...]:
        """``name``'s hub groups: read at most every ``groups_ttl_s``. While the hub cannot
        be asked (it restarts; no group changes then either), the groups last read stand
        for up to ``groups_stale_max_s``; after that, or for a user never read, the
        :class:`HubError` is raised."""
        cached = self._groups.get(name)
        now = time.monotonic()
        if cached and now - cached[0] < self.groups_ttl_s:
            return cached[1]
        try:
            model = await self.get_user(name)
        except HubError as exc:
            if cached and now - cached[0] <= self.groups_stale_max_s:
                log.warning("the hub cannot be asked (%s): %s's groups as read %.0f s ago",
                            exc, name, now - cached[0])
                return cached[1]
            raise
        groups = tuple(model.get("groups") or ()) if model else ()
        self._keep(name, now, groups)
        if self.memory is not None:
            self.memory.groups_learnt(name, now, groups)
        return groups

    def _keep(self, name: str, read_at: float, groups: tuple[str, ...]) -> None:
        self._groups.pop(name, None)  # re-inserted last: the dict is oldest-read first
        self._groups[name] = (read_at, groups)
        while len(self._groups) > self.MAX_CACHED_USERS:
            del self._groups[next(iter(self._groups))]

    def remember_groups(self, name: str, read_at: float, groups: tuple[str, ...]) -> None:
        """``name``'s groups as read at ``read_at`` (monotonic) by another broker, unless
        this client read them itself."""
        if name not in self._groups:
            self._keep(name, read_at, groups)

    def groups_read(self) -> dict[str, tuple[float, tuple[str, ...]]]:
        """Every user's groups held, with when they were read (monotonic)."""
        return dict(self._groups)

    async def group_members(self, group: str) -> list[str] | None:
        """The users of the hub's group ``group`` (``None``: no such group)."""
        code, data = await self._call("GET", f"/groups/{quote(group, safe='')}")
        return sorted(data.get("users") or ()) if code == 200 and data else None

    async def stop_server(self, user: str, server: str, let_spawn_answer_s: float = 0.0) -> bool:
        """Ask the hub to stop ``user``'s server (``""`` = default); ``False`` if not running.

        ``let_spawn_answer_s``: a server still being spawned is stopped only once its spawn
        is that old (or over): JupyterHub interrupts a pending spawn it is asked to stop and
        answers the spawn's own request 500; after ``slow_spawn_timeout`` (10 s) that request
        has been answered 202 already."""
        if let_spawn_answer_s > 0:
            await self._let_spawn_answer(user, server, let_spawn_answer_s)
        path = f"/users/{quote(user, safe='')}/server"
        if server:
            path = f"/users/{quote(user, safe='')}/servers/{quote(server, safe='')}"
        code, _ = await self._call("DELETE", path)
        log.info("asked the hub to stop %s/%s: %s", user, server, code)
        return code in (202, 204)

    async def _let_spawn_answer(self, user: str, server: str, after_s: float) -> None:
        """Wait while ``user``'s ``server`` is being spawned and its spawn is younger than
        ``after_s`` (polling the hub every half second; at most ``after_s`` in all)."""
        deadline = time.monotonic() + after_s
        while time.monotonic() < deadline:
            model = await self.get_user(user)
            srv = ((model or {}).get("servers") or {}).get(server)
            if not srv or srv.get("pending") != "spawn":
                return
            started = hub_time(srv.get("started"))
            if started is not None and time.time() - started >= after_s:
                return
            await asyncio.sleep(0.5)


def hub_time(iso: Any) -> float | None:
    """Seconds since the epoch of the hub's ISO 8601 time (``None`` if absent or unreadable)."""
    if not isinstance(iso, str):
        return None
    try:
        return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
