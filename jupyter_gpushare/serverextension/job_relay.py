"""The base of the jobs routes: a handler of the ``gpushare`` resource that calls the broker
with this server's token (``$JUPYTERHUB_API_TOKEN``) and reads a notebook from the user's files.

:mod:`.jobs` (the routes) and :mod:`.job_output` (the executed notebook) both build on it; it
imports neither, so neither imports the other's module to get it.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import posixpath
import time
from typing import Any

from jupyter_server.base.handlers import APIHandler
from jupyter_server.extension.handler import ExtensionHandlerMixin
from tornado import web
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest
from tornado.iostream import StreamClosedError

AUTH_RESOURCE = "gpushare"

DEFAULT_RETRY_WINDOW_S = 10.0
RETRY_STATUSES = frozenset({502, 503, 504})
IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "DELETE", "PUT"})


def refused(exc: BaseException | None) -> bool:
    """True when the connection was refused: the broker received nothing of the call."""
    return isinstance(exc, ConnectionRefusedError) or getattr(exc, "errno", None) == (
        errno.ECONNREFUSED
    )


def may_send_again(method: str, status: int, unsent: bool, keyed: bool = False) -> bool:
    """Whether a call that got ``status`` (503 also when the connection broke before the
    answer) may be sent again: always when nothing was sent, else after a 502/503/504 for
    an idempotent method or a body with an ``idempotency_key`` (the broker answers a
    repeat with what the first made); a POST without one is never sent twice."""
    if unsent:
        return True
    return status in RETRY_STATUSES and (keyed or method.upper() in IDEMPOTENT_METHODS)


def broker_base() -> str:
    return os.environ.get("GPUSHARE_BROKER_URL", "").rstrip("/")


def server_token() -> str:
    return os.environ.get("JUPYTERHUB_API_TOKEN", "")


class JobsRelayHandler(ExtensionHandlerMixin, APIHandler):
    auth_resource = AUTH_RESOURCE

    def _fail(self, status: int, message: str, field: str | None = None) -> None:
        self.set_status(status)
        body: dict[str, Any] = {"error": message}
        if field:
            body["field"] = field
        self.finish(json.dumps(body))

    async def broker(
        self, method: str, path: str, body: Any = None, timeout: float = 30.0,
    ) -> tuple[int, bytes, str]:
        status, data, headers = await self.broker_call(method, path, body, timeout)
        return status, data, headers.get("Content-Type", "application/json")

    async def broker_call(
        self, method: str, path: str, body: Any = None, timeout: float = 30.0,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, bytes, dict[str, str]]:
        """One call to the broker with this server's token: status, body, headers (a
        broker that cannot be reached is a 503 naming why).

        A broker that is restarting (its supervisor brings it back within seconds) is not an
        error the user sees: the call is sent again within ``broker_retry_window_s`` where
        that is safe (:func:`may_send_again`)."""
        window = float(self.settings.get("gpushare_broker_retry_window_s",
                                         DEFAULT_RETRY_WINDOW_S))
        deadline = time.monotonic() + window
        delay = 0.05
        base = broker_base()  # none configured: said at once, never retried
        while True:
            status, data, got, unsent = await self._broker_once(
                method, path, body, timeout, headers)
            keyed = isinstance(body, dict) and bool(body.get("idempotency_key"))
            if not base or not may_send_again(method, status, unsent, keyed):
                return status, data, got
            if time.monotonic() + delay > deadline:
                return status, data, got
            await asyncio.sleep(delay)
            delay = min(2 * delay, 0.5)

    async def _broker_once(
        self, method: str, path: str, body: Any, timeout: float,
        headers: dict[str, str] | None,
    ) -> tuple[int, bytes, dict[str, str], bool]:
        base = broker_base()
        json_type = {"Content-Type": "application/json"}
        if not base:
            return 503, json.dumps({"error": "no gpushare broker configured "
                                    "(GPUSHARE_BROKER_URL)"}).encode(), json_type, False
        req = HTTPRequest(
            base + path, method=method,
            headers={"Authorization": f"token {server_token()}", "Content-Type": "application/json",
                     **(headers or {})},
            body=None if body is None else json.dumps(body),
            allow_nonstandard_methods=True, request_timeout=timeout,
        )
        try:
            resp = await AsyncHTTPClient().fetch(req, raise_error=False)
        except (OSError, HTTPClientError, StreamClosedError) as exc:
            why = json.dumps({"error": f"cannot reach the gpushare broker: {exc}"})
            return 503, why.encode(), json_type, refused(exc)
        if resp.code == 599:
            return 503, json.dumps({"error": f"cannot reach the gpushare broker: "
                                    f"{resp.error}"}).encode(), json_type, refused(resp.error)
        got = {k: v for k, v in resp.headers.get_all()}
        got.setdefault("Content-Type", "application/json")
        return resp.code, resp.body or b"", got, False

    async def relay(self, method: str, path: str, body: Any = None) -> None:
        status, data, ctype = await self.broker(method, path, body)
        self.set_status(status)
        self.finish(data, set_content_type=ctype)  # APIHandler would say JSON otherwise

    async def read_notebook(self, path: Any) -> dict[str, Any] | None:
        """The notebook at ``path`` in this server's files, or None after answering 4xx."""
        if not isinstance(path, str) or not path.strip():
            self._fail(400, "path is required: the notebook's path in your files", "path")
            return None
        norm = posixpath.normpath(path.strip().lstrip("/"))
        if path.strip().startswith(("/", "~")) or norm == ".." or norm.startswith("../"):
            self._fail(400, f"{path} is outside your files", "path")
            return None
        if not norm.endswith(".ipynb"):
            self._fail(400, f"{path} is not a notebook (.ipynb)", "path")
            return None
        cm = self.contents_manager
        try:
            model = await maybe_await(cm.get(norm, content=True, type="notebook"))
        except web.HTTPError as exc:
            if exc.status_code == 404:
                self._fail(404, f"no notebook {norm} in your files", "path")
            else:
                self._fail(400, f"{norm} cannot be read as a notebook: {exc.log_message}", "path")
            return None
        except Exception as exc:  # noqa: BLE001 - a file that is not a notebook
            self._fail(400, f"{norm} is not a valid notebook: {exc}", "path")
            return None
        return {"path": norm, "name": model["name"], "content": json.loads(json.dumps(
            model["content"]))}


async def maybe_await(value: Any) -> Any:
    if hasattr(value, "__await__"):
        return await value
    return value
