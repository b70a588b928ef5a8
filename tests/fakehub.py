"""A stand-in for the parts of JupyterHub's REST API the broker calls, over real HTTP.

For tests that must run where no real hub can (no npm proxy) yet go through the broker's
real token path: ``HubTokenAuthenticator`` asks ``GET /hub/api/user`` with the caller's
token through JupyterHub's own ``HubAuth``, and ``HubClient`` asks ``GET /hub/api/users/<name>``
(groups, running servers) and ``DELETE .../server`` with the broker's token, as against a
real hub. The answers have the shape JupyterHub 5/6 gives (token models with expanded
scopes, user models with ``servers``); the hub's own rules (who may hold which scope) are
the test's to set: ``user_token``, ``server_token`` and ``token`` mint them.

API::

    hub = FakeHub(); hub.start()          # on a free port, in the running event loop
    hub.api_url                           # http://127.0.0.1:<port>/hub/api
    hub.add_user("alice", ["vision"])
    hub.user_token("alice")               # a personal token (access:servers!user=alice)
    hub.server_token("alice", "lab")      # the token of alice's server "lab"
    hub.token("boss", ["custom:gpushare:admin"])
    hub.start_server("alice", "lab"); hub.stop_server("alice", "lab")
    hub.stops                             # [(user, server)] the broker asked to stop
    hub.stop()

    app = await start_broker_with_hub(policy, db_url, hub)   # a broker that asks this hub
"""

from __future__ import annotations

import json
import secrets
from typing import Any

from brokerkit import ACCESS, COMMIT_MODE, free_port
from tornado import web
from tornado.httpserver import HTTPServer

from jupyter_gpushare.broker import BrokerApp
from jupyter_gpushare.broker.api.auth import HubTokenAuthenticator
from jupyter_gpushare.core.model import Policy


class FakeHub:
    """Users, groups, servers and tokens, served like JupyterHub's REST API."""

    def __init__(self) -> None:
        self.port = free_port()
        self.api_url = f"http://127.0.0.1:{self.port}/hub/api"
        self.broker_token = secrets.token_hex(16)
        self.users: dict[str, dict[str, Any]] = {}
        self.tokens: dict[str, dict[str, Any]] = {}
        self.stops: list[tuple[str, str]] = []
        self.calls = 0
        self._server: HTTPServer | None = None

    # -- the test's side -----------------------------------------------------------------

    def add_user(self, name: str, groups: list[str] | tuple[str, ...] = ()) -> None:
        self.users[name] = {"name": name, "groups": list(groups), "servers": {}}

    def token(self, name: str, scopes: list[str], kind: str = "user") -> str:
        tok = secrets.token_hex(12)
        groups = self.users.get(name, {}).get("groups", []) if kind == "user" else []
        self.tokens[tok] = {"kind": kind, "name": name, "groups": groups, "scopes": scopes}
        return tok

    def user_token(self, name: str) -> str:
        """What a user's own API token expands to (role ``user`` plus gpushare access)."""
        return self.token(name, [ACCESS, f"access:servers!user={name}",
                                 f"read:users:name!user={name}"])

    def server_token(self, name: str, server: str = "") -> str:
        """What ``$JUPYTERHUB_API_TOKEN`` of ``name``'s ``server`` expands to."""
        return self.token(name, [ACCESS, f"access:servers!server={name}/{server}",
                                 f"users:activity!user={name}"])

    def start_server(self, name: str, server: str = "") -> None:
        self.users[name]["servers"][server] = {"name": server, "ready": True}

    def stop_server(self, name: str, server: str = "") -> None:
        self.users[name]["servers"].pop(server, None)

    def running(self, name: str) -> set[str]:
        return set(self.users[name]["servers"])

    # -- serving -------------------------------------------------------------------------

    def start(self) -> None:
        app = web.Application([
            (r"/hub/api/user", _WhoAmI, {"hub": self}),
            (r"/hub/api/users/([^/]+)", _User, {"hub": self}),
            (r"/hub/api/users/([^/]+)/server", _Server, {"hub": self}),
            (r"/hub/api/users/([^/]+)/servers/([^/]*)", _Server, {"hub": self}),
        ])
        self._server = app.listen(self.port, "127.0.0.1")

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None


class _Base(web.RequestHandler):
    def initialize(self, hub: FakeHub) -> None:
        self.hub = hub
        hub.calls += 1

    def check_xsrf_cookie(self) -> None:
        return None

    def caller_token(self) -> str:
        scheme, _, tok = self.request.headers.get("Authorization", "").partition(" ")
        return tok.strip() if scheme.lower() in ("token", "bearer") else ""

    def answer(self, status: int, body: Any = None) -> None:
        self.set_status(status)
        if body is not None:
            self.set_header("Content-Type", "application/json")
            self.finish(json.dumps(body))
        else:
            self.finish()

    def require_broker(self) -> bool:
        if self.caller_token() != self.hub.broker_token:
            self.answer(403, {"status": 403, "message": "Action is not authorized"})
            return False
        return True


class _WhoAmI(_Base):
    def get(self) -> None:
        model = self.hub.tokens.get(self.caller_token())
        if model is None:  # JupyterHub: 403 for a token it does not know
            self.answer(403, {"status": 403, "message": "Missing or invalid credentials."})
            return
        self.answer(200, model)


class _User(_Base):
    def get(self, name: str) -> None:
        if not self.require_broker():
            return
        user = self.hub.users.get(name)
        if user is None:
            self.answer(404, {"status": 404, "message": "Not Found"})
            return
        self.answer(200, {"kind": "user", **user})


class _Server(_Base):
    def delete(self, name: str, server: str = "") -> None:
        if not self.require_broker():
            return
        user = self.hub.users.get(name)
        if user is None or server not in user["servers"]:
            self.answer(400, {"status": 400, "message": f"{name}/{server} is not running"})
            return
        del user["servers"][server]
        self.hub.stops.append((name, server))
        self.answer(204)


async def start_broker_with_hub(policy: Policy, db_url: str, hub: FakeHub,
                                **traits: Any) -> BrokerApp:
    """A broker that checks every token with ``hub`` and reads groups and servers from it."""
    traits.setdefault("commit_mode", COMMIT_MODE)
    app = BrokerApp(
        policy=policy,
        db_url=db_url,
        port=free_port(),
        ip="127.0.0.1",
        use_hub=True,
        hub_api_url=hub.api_url,
        api_token=hub.broker_token,
        authenticator_class=HubTokenAuthenticator,
        browser_login=False,
        reconcile_on_start=False,
        reconcile_interval_s=0,
        **traits,
    )
    await app.start_async()
    return app
