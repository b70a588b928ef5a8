"""``GET /gpushare/api/switch``: what JupyterLab's "Switch hardware" dialog needs.

The answer names this server (user, server name, the hub's prefix), its current profile, the
profiles the user's teams may use with what each team has left and the broker's dry-run
decision for each (from the broker's ``/policy/profiles`` with the server's own token), and
what a restart stops and what it keeps. The switch itself is done by the browser with the
user's own hub session (stop, then start with ``{"profile": slug}`` through the hub's REST
API), so the hub's own rules decide who may stop and start which server, and the restart
does not depend on this process surviving its own stop.
"""

from __future__ import annotations

import json
import os
from typing import Any

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from jupyter_server.extension.handler import ExtensionHandlerMixin
from tornado import web
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest
from tornado.iostream import StreamClosedError

AUTH_RESOURCE = "gpushare"
RESTARTS = [
    "every running kernel and terminal of this server (their variables are lost)",
    "unsaved changes in open documents (they are saved first)",
    "this server's GPU grant (the new profile gets a new one; a refused start leaves the old "
    "profile restarted)",
]
KEPT = ["your files (the home folder is the same)", "your batch jobs (they run on their own)"]


def _env(name: str) -> str:
    return os.environ.get(name, "")


class SwitchOptionsHandler(ExtensionHandlerMixin, APIHandler):
    """The profiles this server may switch to, with the broker's answer for each."""

    auth_resource = AUTH_RESOURCE

    @web.authenticated
    @authorized
    async def get(self) -> None:
        user = _env("JUPYTERHUB_USER")
        answer: dict[str, Any] = {
            "hub": {
                "prefix": _env("JUPYTERHUB_BASE_URL").rstrip("/") + "/hub/"
                if _env("JUPYTERHUB_BASE_URL") else "",
                "user": user,
                "server_name": _env("JUPYTERHUB_SERVER_NAME"),
            },
            "current": _env("GPUSHARE_PROFILE") or None,
            "restarts": RESTARTS,
            "kept": KEPT,
            "profiles": [],
            "error": None,
        }
        if not user:
            answer["error"] = "this server was not started by JupyterHub: nothing to switch"
            self.finish(json.dumps(answer))
            return
        base = _env("GPUSHARE_BROKER_URL").rstrip("/")
        if not base:
            answer["error"] = "no gpushare broker configured (GPUSHARE_BROKER_URL)"
            self.finish(json.dumps(answer))
            return
        req = HTTPRequest(
            f"{base}/policy/profiles?user={user}",
            headers={"Authorization": f"token {_env('JUPYTERHUB_API_TOKEN')}"},
            request_timeout=15.0,
        )
        try:
            resp = await AsyncHTTPClient().fetch(req, raise_error=False)
        except (OSError, HTTPClientError, StreamClosedError) as exc:
            answer["error"] = f"cannot reach the gpushare broker: {exc}"
            self.finish(json.dumps(answer))
            return
        if resp.code != 200:
            answer["error"] = f"the broker answered {resp.code}: {(resp.body or b'')[:300]!r}"
        else:
            data = json.loads(resp.body or b"{}")
            answer["profiles"] = data.get("profiles") or []
            answer["teams"] = data.get("teams") or []
        self.finish(json.dumps(answer))


def switch_handlers() -> list[tuple[str, type]]:
    """Routes, relative to the server's base URL."""
    return [(r"/gpushare/api/switch", SwitchOptionsHandler)]
