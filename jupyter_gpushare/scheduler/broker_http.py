"""Calls to the gpushare broker with this server's token, as the server extension makes them:
``$GPUSHARE_BROKER_URL`` (the broker's API base) and ``$JUPYTERHUB_API_TOKEN``."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest
from tornado.iostream import StreamClosedError


@dataclass(frozen=True)
class BrokerAnswer:
    """One answer of the broker: its HTTP status and body (503 when it cannot be reached)."""

    status: int
    body: bytes

    def json(self) -> Any:
        try:
            return json.loads(self.body or b"null")
        except ValueError:
            return {"error": self.body.decode(errors="replace")[:500]}


def broker_base() -> str:
    return os.environ.get("GPUSHARE_BROKER_URL", "").rstrip("/")


def server_token() -> str:
    return os.environ.get("JUPYTERHUB_API_TOKEN", "")


def unreachable(why: str) -> BrokerAnswer:
    return BrokerAnswer(503, json.dumps({"error": why}).encode())


async def call_broker(
    method: str, path: str, body: Any = None, timeout_s: float = 30.0
) -> BrokerAnswer:
    """One call to the broker (``path`` below its API base)."""
    base = broker_base()
    if not base:
        return unreachable("no gpushare broker configured (GPUSHARE_BROKER_URL)")
    req = HTTPRequest(
        base + path,
        method=method,
        headers={"Authorization": f"token {server_token()}", "Content-Type": "application/json"},
        body=None if body is None else json.dumps(body),
        allow_nonstandard_methods=True,
        request_timeout=timeout_s,
    )
    try:
        resp = await AsyncHTTPClient().fetch(req, raise_error=False)
    except (OSError, HTTPClientError, StreamClosedError) as exc:
        return unreachable(f"cannot reach the gpushare broker: {exc}")
    if resp.code == 599:
        return unreachable(f"cannot reach the gpushare broker: {resp.error}")
    return BrokerAnswer(resp.code, resp.body or b"")
