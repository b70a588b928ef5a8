"""Helpers for broker tests and benchmarks: an in-process broker with static tokens.

``static_tokens()`` gives a token table (token -> hub-like model) for users, a server token,
the spawner (act-as-users) and an admin; ``start_broker(policy, db_url, tokens)`` starts a
:class:`jupyter_gpushare.broker.BrokerApp` on a free port inside the running event loop and
returns it (``app.port``, ``await app.stop_async()``).
"""

from __future__ import annotations

import json
import os
from typing import Any

from ports import free_port
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest
from tornado.iostream import StreamClosedError

from jupyter_gpushare.broker import BrokerApp
from jupyter_gpushare.broker.api.auth import StaticTokenAuthenticator

ACCESS = "access:services!service=gpushare"
BASE = "/services/gpushare/api/v1"

AsyncHTTPClient.configure(None, max_clients=512)


COMMIT_MODE = os.environ.get("GPUSHARE_TEST_COMMIT_MODE", "auto")
"""``BrokerApp.commit_mode`` of the brokers tests start (``thread``: the writer thread on SQLite
too, to run a test file against it)."""


def user_model(name: str, groups: list[str], extra: list[str] | None = None) -> dict[str, Any]:
    return {
        "kind": "user",
        "name": name,
        "groups": groups,
        "scopes": [ACCESS, f"access:servers!user={name}", *(extra or [])],
    }


def server_model(name: str, server: str, groups: list[str]) -> dict[str, Any]:
    return {
        "kind": "user",
        "name": name,
        "groups": groups,
        "scopes": [ACCESS, f"access:servers!server={name}/{server}", f"users:activity!user={name}"],
    }


def static_tokens(users: dict[str, list[str]]) -> dict[str, dict[str, Any]]:
    """Tokens ``tok-<user>`` for each user (with groups), ``tok-<user>-srv`` for their default
    server, ``tok-spawner`` (act-as-users), ``tok-admin``, ``tok-metrics`` and ``tok-noaccess``."""
    table: dict[str, dict[str, Any]] = {}
    for name, groups in users.items():
        table[f"tok-{name}"] = user_model(name, groups)
        table[f"tok-{name}-srv"] = server_model(name, "", groups)
    table["tok-spawner"] = {
        "kind": "service",
        "name": "gpushare-spawner",
        "scopes": ["custom:gpushare:act-as-users", ACCESS],
    }
    table["tok-admin"] = {
        "kind": "user",
        "name": "boss",
        "groups": [],
        "scopes": ["custom:gpushare:admin", ACCESS],
    }
    table["tok-metrics"] = {
        "kind": "service",
        "name": "prom",
        "scopes": ["custom:gpushare:metrics"],
    }
    table["tok-noaccess"] = {
        "kind": "user",
        "name": "nobody",
        "groups": [],
        "scopes": ["access:servers!user=nobody"],
    }
    return table


async def start_broker(
    policy: Any, db_url: str, tokens: dict[str, Any], port: int | None = None, **traits: Any
) -> BrokerApp:
    traits.setdefault("commit_mode", COMMIT_MODE)
    app = BrokerApp(
        policy=policy,
        db_url=db_url,
        port=port or free_port(),
        ip="127.0.0.1",
        use_hub=False,
        authenticator_class=StaticTokenAuthenticator,
        reconcile_on_start=False,
        reconcile_interval_s=0,
        **traits,
    )
    app.config.StaticTokenAuthenticator.tokens = tokens
    if "requests_per_minute_per_user" not in app.config.BrokerLimits:
        # tests of other things send bursts from one user; tests/test_trust_bounds*.py
        # set the request rate limit themselves
        app.config.BrokerLimits.requests_per_minute_per_user = 0
    await app.start_async()
    return app


async def call(
    app_or_url: Any, method: str, path: str, token: str | None = None, body: Any = None
) -> tuple[int, Any]:
    """One HTTP call; returns (status, parsed JSON or text or None)."""
    base = (
        app_or_url if isinstance(app_or_url, str) else f"http://127.0.0.1:{app_or_url.port}{BASE}"
    )
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"token {token}"
    req = HTTPRequest(
        base + path,
        method=method,
        headers=headers,
        body=None if body is None else json.dumps(body),
        allow_nonstandard_methods=True,
        request_timeout=30,
    )
    try:
        resp = await AsyncHTTPClient().fetch(req, raise_error=False)
    except (OSError, HTTPClientError, StreamClosedError) as exc:
        raise ConnectionError(str(exc)) from exc
    if resp.code == 599:
        raise ConnectionError(str(resp.error))
    data: Any = None
    if resp.body:
        try:
            data = json.loads(resp.body)
        except ValueError:
            data = resp.body.decode()
    return resp.code, data
