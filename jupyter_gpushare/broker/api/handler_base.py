"""What every REST handler of the broker shares: the context the app hands them, token and
browser authentication, authorisation helpers, JSON answers and errors; and the two public
endpoints, ``/openapi.yaml`` and ``/health``.

Every handler but those two needs ``Authorization: token <hub token>``: no token → 401, a
token the hub does not know or one without access to this service → 403, and each handler
checks that the caller may act for the user (and server) concerned.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import exc as sa_exc
from tornado import web

from ..hubclient import HubClient, HubError
from ..ops.metrics import BrokerMetrics
from ..ops.reconcile import HolderChecker
from ..service.broker import Broker, BrokerError
from ..service.fields import BadField, Fields, json_object
from ..service.preempt import NoticeHub
from ..service.ratelimit import TokenBuckets, register_request_buckets
from ..service.writes import TASK_WRITES
from .auth import BrowserAuthMixin, BrowserLogin, Identity, TokenAuthenticator

log = logging.getLogger("gpushare.broker.api")
DATABASE_DOWN = (sa_exc.OperationalError, sa_exc.InterfaceError, sa_exc.DisconnectionError,
                 sa_exc.InvalidatePoolError)
"""What SQLAlchemy raises when the database cannot be reached (answered 503, not 500)."""

OPENAPI_PATH = os.path.join(os.path.dirname(__file__), "openapi.yaml")
MAX_LOGGED_URI = 200  # characters of a request's URI quoted in a log line
MAX_ERROR_MESSAGE = 1000  # characters of an error message sent back (a last guard)


def bounded_message(message: str) -> str:
    """An error message cut to :data:`MAX_ERROR_MESSAGE` characters: whatever a handler
    quoted into it, an error body never carries a client's value whole."""
    if len(message) <= MAX_ERROR_MESSAGE:
        return message
    return message[:MAX_ERROR_MESSAGE] + f"… ({len(message)} characters)"


@dataclass
class Context:
    broker: Broker
    auth: TokenAuthenticator
    hub: HubClient | None
    notices: NoticeHub
    metrics: BrokerMetrics
    checker: HolderChecker
    reconcile_min_age_s: float = 60.0
    jobs: Any = None  # the JobManager (batch jobs), when enabled
    login: BrowserLogin | None = None  # the hub's OAuth login for browsers (None: tokens only)
    reloader: Any = None  # the PolicyReloader (None: the policy was not read from a file)
    streams_by_owner: Counter[str] = field(default_factory=Counter)  # open notice streams
    request_buckets: TokenBuckets = field(init=False)  # POST /requests per user

    def __post_init__(self) -> None:
        limits = self.broker.limits
        self.request_buckets = TokenBuckets(
            lambda: float(limits.requests_per_minute_per_user),
            lambda: int(limits.request_burst_per_user),
            self.broker.clock,
        )
        register_request_buckets(self.broker, self.request_buckets)  # POST /jobs too


def json_body(handler: web.RequestHandler) -> dict[str, Any]:
    """The JSON object of a request body of any size (jobs carry notebooks; the broker's
    own endpoints read bodies through :class:`~.fields.Fields`, bounded)."""
    return json_object(handler.request.body or b"{}")


# -- base ------------------------------------------------------------------------------------


class BaseHandler(BrowserAuthMixin, web.RequestHandler):
    public = False
    ctx: Context
    identity: Identity

    def initialize(self, ctx: Context) -> None:
        self.ctx = ctx
        self.login = ctx.login
        self._t0 = time.perf_counter()
        self.fields = Fields(ctx.broker.limits)

    def set_default_headers(self) -> None:
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")

    def prepare(self) -> Awaitable[None] | None:
        TASK_WRITES.set(None)  # this request's own changes only (its task's copy)
        self._check_path_names()
        if self.public:
            return None
        header = self.request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        token = token.strip()
        if scheme.lower() not in ("token", "bearer") or not token:
            if self.has_login_cookie():  # a browser logged in with the hub (auth.BrowserLogin)
                return self.login_from_cookie()
            raise BrokerError(
                401, "authentication required: Authorization: token <JupyterHub token>"
            )
        self._token_authenticated = True
        identity = self.ctx.auth.cached(token)
        if identity is not None:  # the hot path: no await, no hub
            self.identity = identity
            return None
        return self._identify(token)

    async def _identify(self, token: str) -> None:
        try:
            identity = await self.ctx.auth.identify_and_cache(token)
        except web.HTTPError as exc:
            if exc.status_code in (401, 403):
                identity = None
            else:
                raise BrokerError(503, "cannot check the token with the hub") from exc
        except (HubError, OSError) as exc:
            raise BrokerError(503, "cannot check the token with the hub") from exc
        if identity is None:
            raise BrokerError(403, "this token may not use the gpushare service")
        self.identity = identity

    def _check_path_names(self) -> None:
        """A name in the URL (a grant, request, job, team or node id) is bounded like one in
        a body: a longer one is a 400 before any handler can quote it back."""
        limit = self.ctx.broker.limits.max_name_length
        for value in self.path_args:
            if isinstance(value, str) and len(value) > limit:
                raise BadField(
                    "path", f"a name in the path has {len(value)} characters, at most {limit}"
                )

    def _request_summary(self) -> str:
        """The request as log lines quote it: its URI shortened (never a client's megabyte)."""
        uri = self.request.uri or ""
        if len(uri) > MAX_LOGGED_URI:
            uri = uri[:MAX_LOGGED_URI] + f"… ({len(uri)} characters)"
        return f"{self.request.method} {uri} ({self.request.remote_ip})"

    def _handle_request_exception(self, e: BaseException) -> None:
        if isinstance(e, DATABASE_DOWN) and not self._finished:
            # the database cannot be reached (stopped, restarting, its connection cut): a
            # 503 the clients retry, not a 500 with a traceback per request
            why = bounded_message(str(e).splitlines()[0] if str(e) else repr(e))
            log.warning("%s: the database cannot be reached: %s", self._request_summary(), why)
            self.ctx.broker.writes.database_failed(why)
            e = BrokerError(503, "the broker's database cannot be reached; try again shortly",
                            code="db_unavailable", headers={"Retry-After": "1"})
        if isinstance(e, BrokerError):
            if self._finished:
                return
            self.set_status(e.status)
            body: dict[str, Any] = {"error": bounded_message(e.message)}
            if e.field:
                body["field"] = e.field
            if e.code:
                body["code"] = e.code
            for name, value in e.headers.items():
                self.set_header(name, value)
            self.finish(json.dumps(body))
            return
        super()._handle_request_exception(e)

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        reason = self._reason
        exc = kwargs.get("exc_info", (None, None, None))[1]
        if isinstance(exc, web.HTTPError) and exc.log_message:
            reason = exc.log_message % exc.args if exc.args else exc.log_message
        self.finish(json.dumps({"error": reason}))

    def on_finish(self) -> None:
        self.ctx.metrics.observe_latency(
            type(self).__name__, self.request.method or "", time.perf_counter() - self._t0
        )

    async def settle(self) -> None:
        """Return once every change this request made is durable (the loop serves other
        requests meanwhile); raises a 503 if one of them failed."""
        await self.ctx.broker.durable()

    async def answer(self, data: Any, status: int = 200) -> None:
        """Send ``data`` once every change this request made is durable (the handlers that
        change grants answer with this)."""
        await self.settle()
        self.send(data, status)

    def send(self, data: Any, status: int = 200) -> None:
        """Send ``data`` as JSON; if this request changed something that is not durable
        yet, first wait for it, blocking (:meth:`answer` waits without blocking); a 503 if
        one of its changes failed."""
        self.ctx.broker.ensure_durable()
        self.set_status(status)
        self.finish(json.dumps(data))

    def require(self, allowed: bool, message: str = "not allowed for this token") -> None:
        if not allowed:
            raise BrokerError(403, message)

    def arg(self, name: str) -> str | None:
        value = self.get_query_argument(name, None)
        if value is not None and len(value) > self.ctx.broker.limits.max_name_length:
            raise BadField(name, f"{name} is too long")
        return value

    async def teams_of(self, user: str, groups: list[str] | None = None) -> tuple[str, ...]:
        """The user's teams from their hub groups (or ``groups`` passed by a trusted caller)."""
        if groups is None:
            if self.ctx.hub is not None:
                try:
                    groups = list(await self.ctx.hub.groups_of(user))
                except HubError as exc:
                    raise BrokerError(503, "cannot read the user's groups from the hub") from exc
            elif self.identity.name == user:
                groups = list(self.identity.groups)
            else:
                groups = []
        return self.ctx.broker.policy.teams_of(set(groups))


# -- handlers --------------------------------------------------------------------------------


class OpenAPIHandler(BaseHandler):
    public = True

    def get(self) -> None:
        self.set_header("Content-Type", "application/yaml")
        with open(OPENAPI_PATH, "rb") as f:
            self.finish(f.read())


class HealthHandler(BaseHandler):
    """``GET /health``: 200 ``ok`` when the broker serves; 200 ``starting`` while it loads its
    state; 503 ``database unavailable`` while the database does not answer (``SELECT 1``, on
    a worker thread, at most once a second) or writes are refused after a failed commit
    (the state is being rebuilt from the database)."""

    public = True

    async def get(self) -> None:
        broker = self.ctx.broker
        problem = await broker.writes.database_problem()
        if problem is not None:
            self.set_status(503)
            self.set_header("Retry-After", "1")
            self.finish(json.dumps({"status": "database unavailable",
                                    "reason": bounded_message(problem)}))
            return
        self.send({"status": "ok" if broker.loaded else "starting"})


def request_logger(log: logging.Logger | logging.LoggerAdapter[Any]) -> Callable[
    [web.RequestHandler], None
]:
    """The app's ``log_function``: 5xx answers as warnings, the rest at debug level."""

    def log_request(handler: web.RequestHandler) -> None:
        status = handler.get_status()
        level = logging.WARNING if status >= 500 else logging.DEBUG
        if not log.isEnabledFor(level):
            return
        log.log(
            level,
            "%d %s %.1fms",
            status,
            handler._request_summary(),
            1000 * handler.request.request_time(),
        )

    return log_request
