"""Async client for the gpushare broker's REST API (``/services/gpushare/api/v1``).

Used by the spawners (in the hub process) and by anything else that speaks to the
broker with a JupyterHub token. Built on tornado's ``AsyncHTTPClient`` so it runs in
the hub's event loop without extra dependencies.

Every method returns plain typed data; any answer that is not a success raises
:class:`BrokerError` with the HTTP status, the broker's reason and, where the broker
names one, the offending field. A refusal of a request is *not* an error: the broker
answers 409 with ``status: "refused"`` and :meth:`BrokerClient.request` returns it as a
:class:`RequestAnswer` like any other outcome.

A broker that restarts (a crash, ``kill -9``; the supervisor brings it back within a few
seconds) is not an error the user sees: a call that could not reach it, or that it answered
502/503/504, is sent again until ``retry_window_s`` has passed, when that is safe: always
when the connection was refused (nothing was sent), and otherwise for reads, ``DELETE`` and
``PUT`` (idempotent) and for bodies that carry an ``idempotency_key`` (``POST /requests``:
the broker answers a repeated key with the request it already has, so nothing is admitted
twice).
"""

from __future__ import annotations

import asyncio
import errno
import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import quote, urlencode

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

__all__ = [
    "BrokerClient",
    "BrokerError",
    "GPUShare",
    "GrantInfo",
    "RequestAnswer",
]


DEFAULT_RETRY_WINDOW_S = 10.0
"""How long a call keeps trying a broker that is down or restarting (seconds)."""

RETRY_STATUSES = frozenset({502, 503, 504})
IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE"})


class BrokerError(Exception):
    """The broker could not be reached or answered with an error.

    ``transient``: the broker was unreachable or answered 502/503/504 (it may serve again
    soon); ``unsent``: the connection was refused, so the broker received nothing;
    ``unanswered``: no HTTP answer came at all (refused, cut, timed out)."""

    def __init__(self, status: int, reason: str, field: str | None = None, *,
                 transient: bool = False, unsent: bool = False,
                 unanswered: bool = False) -> None:
        where = f" (field {field})" if field else ""
        super().__init__(f"broker error {status}: {reason}{where}")
        self.status = status
        self.reason = reason
        self.field = field
        self.transient = transient
        self.unsent = unsent
        self.unanswered = unanswered


def _refused(exc: BaseException) -> bool:
    return isinstance(exc, ConnectionRefusedError) or getattr(exc, "errno", None) == (
        errno.ECONNREFUSED
    )


@dataclass(frozen=True)
class GPUShare:
    """The part of one GPU that a grant holds."""

    uuid: str
    memory_mib: int
    compute_pct: float
    model: str = ""
    simulated: bool = False
    total_memory_mib: int | None = None  # the whole GPU's memory, when the broker says

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> GPUShare:
        total = data.get("total_memory_mib", data.get("gpu_memory_mib"))
        return cls(
            uuid=str(data["uuid"]),
            memory_mib=int(data.get("memory_mib") or 0),
            compute_pct=float(data.get("compute_pct") or 0),
            model=str(data.get("model") or ""),
            simulated=bool(data.get("simulated", False)),
            total_memory_mib=int(total) if total else None,
        )


@dataclass(frozen=True)
class GrantInfo:
    """A grant as the broker reports it."""

    id: str
    request_id: str = ""
    user: str = ""
    server: str = ""
    team: str = ""
    pool: str = ""
    profile: str = ""
    kind: str = "interactive"
    node: str = ""
    gpus: tuple[GPUShare, ...] = ()
    units: float = 0.0
    borrowed: bool = False
    preemptible: bool = False
    priority: int | str | None = None
    granted_at: float | str | None = None
    grace_period_s: int = 30
    preemption: Any = None
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def simulated(self) -> bool:
        return bool(self.gpus) and all(g.simulated for g in self.gpus)

    def to_json(self) -> dict[str, Any]:
        """The broker's JSON form (what :meth:`from_json` reads)."""
        if self.raw:
            return dict(self.raw)
        out = {k: v for k, v in asdict(self).items() if k != "raw"}
        out["gpus"] = [asdict(g) for g in self.gpus]
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> GrantInfo:
        return cls(
            id=str(data["id"]),
            request_id=str(data.get("request_id") or ""),
            user=str(data.get("user") or ""),
            server=str(data.get("server") or ""),
            team=str(data.get("team") or ""),
            pool=str(data.get("pool") or ""),
            profile=str(data.get("profile") or ""),
            kind=str(data.get("kind") or "interactive"),
            node=str(data.get("node") or ""),
            gpus=tuple(GPUShare.from_json(g) for g in data.get("gpus") or ()),
            units=float(data.get("units") or 0),
            borrowed=bool(data.get("borrowed", False)),
            preemptible=bool(data.get("preemptible", False)),
            priority=data.get("priority"),
            granted_at=data.get("granted_at"),
            grace_period_s=int(data.get("grace_period_s") or 30),
            preemption=data.get("preemption"),
            raw=dict(data),
        )


@dataclass(frozen=True)
class RequestAnswer:
    """The broker's answer to a request: granted, queued, preempting or refused."""

    request_id: str
    status: str
    reason: str = ""
    code: str = ""
    position: int | None = None
    expected_wait_s: float | None = None
    grant: GrantInfo | None = None
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def pending(self) -> bool:
        return self.status in ("queued", "preempting", "pending")

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RequestAnswer:
        grant = data.get("grant")
        position = data.get("position")
        wait = data.get("expected_wait_s")
        return cls(
            request_id=str(data.get("request_id") or data.get("id") or ""),
            status=str(data.get("status") or ""),
            reason=str(data.get("reason") or ""),
            code=str(data.get("code") or ""),
            position=int(position) if position is not None else None,
            expected_wait_s=float(wait) if wait is not None else None,
            grant=GrantInfo.from_json(grant) if isinstance(grant, dict) else None,
            raw=dict(data),
        )


class BrokerClient:
    """Typed calls to the broker. ``base_url`` ends in ``/api/v1`` (with or without ``/``)."""

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        request_timeout: float = 20.0,
        connect_timeout: float = 5.0,
        retry_window_s: float = DEFAULT_RETRY_WINDOW_S,
        retry_delay_s: float = 0.05,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.request_timeout = request_timeout
        self.connect_timeout = connect_timeout
        # a broker that restarts serves again within a few seconds: calls that are safe to
        # send again are sent again for this long (0: never), first after retry_delay_s
        # (at once after the first call left unanswered), then at growing intervals up to
        # 0.5 s
        self.retry_window_s = retry_window_s
        self.retry_delay_s = retry_delay_s
        self.retries = 0  # calls sent again, for logs and tests

    # ------------------------------------------------------------------ plumbing

    async def call(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        query: dict[str, Any] | None = None,
        *,
        ok_statuses: tuple[int, ...] = (),
        retry_window_s: float | None = None,
    ) -> tuple[int, Any]:
        """Send one request; return ``(status, decoded JSON or None)``.

        Non-2xx answers raise :class:`BrokerError` unless listed in ``ok_statuses``. A broker
        that is down or restarting is tried again within ``retry_window_s`` (this call's, else
        the client's) where that is safe (module docstring).
        """
        window = self.retry_window_s if retry_window_s is None else retry_window_s
        deadline = time.monotonic() + window
        delay = self.retry_delay_s
        at_once = True  # the first call left unanswered is sent again without waiting
        while True:
            try:
                return await self._once(method, path, body, query, ok_statuses)
            except BrokerError as exc:
                if not self._may_retry(method, body, exc) or time.monotonic() + delay > deadline:
                    raise
                wait = delay
                if exc.unanswered and at_once:
                    # a broker killed mid-call under its supervisor: the supervisor keeps the
                    # listening socket, so a new connection waits for the next broker in the
                    # accept queue; waiting first only adds to the gap (a soak's probes)
                    wait, at_once = 0.0, False
            self.retries += 1
            await asyncio.sleep(wait)
            if wait:
                delay = min(2 * delay, 0.5)

    @staticmethod
    def _may_retry(method: str, body: dict[str, Any] | None, exc: BrokerError) -> bool:
        if not exc.transient:
            return False
        if exc.unsent or method.upper() in IDEMPOTENT_METHODS:
            return True
        return isinstance(body, dict) and bool(body.get("idempotency_key"))

    async def _once(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None,
        query: dict[str, Any] | None,
        ok_statuses: tuple[int, ...],
    ) -> tuple[int, Any]:
        url = self.base_url + path
        if query:
            url += "?" + urlencode({k: v for k, v in query.items() if v is not None})
        headers = {"Authorization": f"token {self.token}", "Accept": "application/json"}
        payload = None
        if body is not None:
            payload = json.dumps(body)
            headers["Content-Type"] = "application/json"
        req = HTTPRequest(
            url,
            method=method,
            headers=headers,
            body=payload,
            request_timeout=self.request_timeout,
            connect_timeout=self.connect_timeout,
            allow_nonstandard_methods=True,
        )
        unreachable = f"gpushare broker unreachable at {self.base_url}"
        try:
            resp = await AsyncHTTPClient().fetch(req, raise_error=False)
        except (OSError, HTTPClientError) as exc:
            raise BrokerError(
                503, f"{unreachable}: {exc}", transient=True, unsent=_refused(exc),
                unanswered=True,
            ) from exc
        data: Any = None
        if resp.body:
            try:
                data = json.loads(resp.body)
            except ValueError:
                data = {"reason": resp.body.decode("utf-8", "replace")[:500]}
        if resp.code == 599:
            raise BrokerError(
                503, f"{unreachable}: {resp.error}", transient=True,
                unsent=resp.error is not None and _refused(resp.error), unanswered=True,
            )
        if 200 <= resp.code < 300 or resp.code in ok_statuses:
            return resp.code, data
        reason = ""
        fld = None
        if isinstance(data, dict):
            reason = str(data.get("reason") or data.get("message") or data.get("error") or "")
            fld = data.get("field")
        raise BrokerError(resp.code, reason or resp.reason or "error", fld,
                          transient=resp.code in RETRY_STATUSES)

    # ------------------------------------------------------------------ requests

    async def request(
        self,
        *,
        user: str,
        server: str,
        groups: list[str],
        profile: str,
        idempotency_key: str,
        kind: str = "interactive",
        extra: dict[str, Any] | None = None,
    ) -> RequestAnswer:
        """Ask for a grant (POST /requests). A refusal is returned, not raised."""
        body: dict[str, Any] = {
            "user": user,
            "server": server,
            "groups": list(groups),
            "kind": kind,
            "profile": profile,
            "idempotency_key": idempotency_key,
        }
        if extra:
            body.update(extra)
        status, data = await self.call("POST", "/requests", body, ok_statuses=(409,))
        if not isinstance(data, dict):
            raise BrokerError(502, "broker sent no request status")
        if status == 409 and data.get("status") != "refused":
            raise BrokerError(409, str(data.get("reason") or "conflict"), data.get("field"))
        return RequestAnswer.from_json(data)

    async def get_request(self, request_id: str) -> RequestAnswer:
        _, data = await self.call("GET", f"/requests/{quote(request_id, safe='')}")
        return RequestAnswer.from_json(data)

    async def cancel_request(self, request_id: str) -> None:
        await self.call("DELETE", f"/requests/{quote(request_id, safe='')}", ok_statuses=(404,))

    # ------------------------------------------------------------------ grants

    async def get_grant(
        self, grant_id: str, *, retry_window_s: float | None = None
    ) -> GrantInfo | None:
        """The grant, or None if the broker does not know it (any more); ``retry_window_s``
        for this call only (0: asked once)."""
        status, data = await self.call(
            "GET", f"/grants/{quote(grant_id, safe='')}", ok_statuses=(404,),
            retry_window_s=retry_window_s,
        )
        if status == 404 or not isinstance(data, dict):
            return None
        return GrantInfo.from_json(data.get("grant", data) if "id" not in data else data)

    async def release_grant(self, grant_id: str) -> None:
        """Release a grant (idempotent: an unknown grant is already released)."""
        await self.call("DELETE", f"/grants/{quote(grant_id, safe='')}", ok_statuses=(404, 410))

    # ------------------------------------------------------------------ reading

    async def team_usage(self, team: str) -> dict[str, Any]:
        _, data = await self.call("GET", f"/teams/{quote(team, safe='')}/usage")
        return data if isinstance(data, dict) else {}

    async def profiles(self, user: str) -> list[dict[str, Any]]:
        """Profiles the user may pick, with their team's availability."""
        _, data = await self.call("GET", "/policy/profiles", query={"user": user})
        if isinstance(data, dict):
            data = data.get("profiles", [])
        return [p for p in data or [] if isinstance(p, dict)]

    async def notices(self, grant_id: str) -> list[dict[str, Any]]:
        _, data = await self.call("GET", "/notices", query={"grant_id": grant_id})
        if isinstance(data, dict):
            data = data.get("notices", [])
        return [n for n in data or [] if isinstance(n, dict)]
