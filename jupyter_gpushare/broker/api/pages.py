"""Browser pages of the broker: the hub's OAuth login and pages for gpushare admins only.

A page is a :class:`PageHandler` whose methods are wrapped in :func:`admin_page` (admins
only) or :func:`logged_in_page` (any user with access to the service)::

    from jupyter_gpushare.broker.api.pages import PageHandler, admin_page

    class UsagePage(PageHandler):
        @admin_page
        async def get(self) -> None:
            rows = self.ctx.broker.admin_queue()           # any service call
            self.page("GPU usage", "<table>...</table>")  # a whole HTML page

    # in the routes, with the same {"ctx": ctx} as every handler:
    (base_url + "admin/usage", UsagePage)

What the base class does:

* **Login.** A GET without credentials is redirected to the hub's OAuth login (the user
  logs in at the hub if needed and comes back through ``<prefix>oauth_callback``); the
  cookie then also authenticates the JSON API (``/api/v1/...``) for that browser. An
  ``Authorization: token`` header works on pages too.
* **Admins only.** :func:`admin_page` answers 403 (an HTML page saying why) to anyone whose
  login lacks ``custom:gpushare:admin``; :attr:`identity` is the caller.
* **XSRF.** A cookie-authenticated POST/PUT/PATCH/DELETE (to a page or to the API) without
  the XSRF token is refused with 403. :meth:`page` embeds the token
  (``<meta name="gpushare-xsrf">``) and a ``gpushare.api(method, path, body)`` helper that
  sends it as ``X-XSRFToken``; forms add ``{self.xsrf_form_html()}``.
* **Errors** are HTML pages with the status and the reason, never a traceback.
"""

from __future__ import annotations

import functools
import html
from collections.abc import Awaitable, Callable
from typing import Any

from jupyterhub.services.auth import HubOAuthCallbackHandler
from tornado import web

from ..errors import BrokerError
from .handler_base import BaseHandler, Context

Method = Callable[..., Awaitable[None] | None]

_API_JS = """
window.gpushare = {
  xsrf: document.querySelector('meta[name="gpushare-xsrf"]').content,
  base: document.querySelector('meta[name="gpushare-api"]').content,
  async api(method, path, body) {
    const r = await fetch(this.base + path, {method, credentials: "same-origin",
      headers: {"X-XSRFToken": this.xsrf, "Content-Type": "application/json"},
      body: body === undefined ? undefined : JSON.stringify(body)});
    const text = await r.text();
    let data = null; try { data = text ? JSON.parse(text) : null; } catch (e) { data = text; }
    if (!r.ok) throw Object.assign(new Error((data && data.error) || r.statusText),
                                   {status: r.status, data});
    return data;
  },
};
"""


class PageHandler(BaseHandler):
    """Base class of the broker's browser pages (see the module docstring)."""

    def set_default_headers(self) -> None:
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.set_header("Cache-Control", "no-store")
        self.set_header("X-Frame-Options", "SAMEORIGIN")
        self.set_header("Content-Security-Policy", "frame-ancestors 'self'")

    @property
    def prefix(self) -> str:
        """The service's URL prefix (``/services/gpushare/``)."""
        return self.login.base_url if self.login is not None else "/"

    def prepare(self) -> Awaitable[None] | None:
        has_token = bool(self.request.headers.get("Authorization"))
        if (not has_token and self.login is not None and not self.has_login_cookie()
                and self.request.method in ("GET", "HEAD")):
            self.redirect(self.get_login_url())  # the hub's OAuth, then back here
            return None
        return super().prepare()

    async def login_from_cookie(self) -> None:
        """As for the API, except that a page opened with a login the hub no longer knows
        (expired or revoked) logs in again instead of answering 403."""
        try:
            await super().login_from_cookie()
        except BrokerError as exc:
            if exc.status != 403 or exc.field or self.request.method not in ("GET", "HEAD"):
                raise
            self.clear_cookie(self.login.hub_oauth.cookie_name,  # type: ignore[union-attr]
                              path=self.prefix)
            self.redirect(self.get_login_url())

    def page(self, title: str, body_html: str, status: int = 200) -> None:
        """Answer a whole HTML page: ``body_html`` (already escaped) under ``title``."""
        self.set_status(status)
        who = html.escape(getattr(getattr(self, "identity", None), "name", "") or "")
        api = html.escape(self.prefix + "api/v1")
        xsrf = html.escape(self.xsrf_token.decode() if isinstance(self.xsrf_token, bytes)
                           else str(self.xsrf_token))
        self.finish(f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="gpushare-xsrf" content="{xsrf}"><meta name="gpushare-api" content="{api}">
<title>{html.escape(title)} - gpushare</title>
<style>body{{font-family:system-ui,sans-serif;margin:2rem;max-width:70rem}}
table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:.25rem .5rem}}
.who{{color:#555;float:right}}</style></head>
<body><span class="who">{who}</span><h1>{html.escape(title)}</h1>
{body_html}
<script>{_API_JS}</script></body></html>""")

    def _handle_request_exception(self, e: BaseException) -> None:
        if self._finished:
            return
        if isinstance(e, BrokerError):
            status, reason = e.status, e.message
        elif isinstance(e, web.HTTPError):
            status = e.status_code
            reason = (e.log_message % e.args if e.args else e.log_message) if e.log_message \
                else self._reason
        else:
            super()._handle_request_exception(e)
            return
        self.clear()
        self.set_default_headers()
        self.page(f"{status}: {web.httputil.responses.get(status, 'Error')}",
                  f"<p>{html.escape(reason or '')}</p>", status)

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        self.page(f"{status_code}: {self._reason}", "<p>Something went wrong; the broker's "
                  "log says what.</p>", status_code)


def _guard(check: Callable[[PageHandler], None]) -> Callable[[Method], Method]:
    def decorate(method: Method) -> Method:
        @functools.wraps(method)
        async def wrapper(self: PageHandler, *args: Any, **kwargs: Any) -> None:
            check(self)
            result = method(self, *args, **kwargs)
            if result is not None:
                await result

        return wrapper

    return decorate


def _require_admin(handler: PageHandler) -> None:
    identity = handler.identity
    if not identity.admin:
        raise BrokerError(403, f"{identity.name} is not a gpushare admin (the scope "
                          "custom:gpushare:admin, e.g. from the gpushare-admin role)")


logged_in_page = _guard(lambda handler: None)
"""A page method for anyone logged in with access to the service (``self.identity``)."""

admin_page = _guard(_require_admin)
"""A page method for gpushare admins only; everyone else gets a 403 page."""


class OAuthCallbackHandler(HubOAuthCallbackHandler):  # type: ignore[misc]
    """``<prefix>oauth_callback``: JupyterHub's own end of the OAuth login."""

    def initialize(self, ctx: Context) -> None:
        assert ctx.login is not None
        self.hub_auth = ctx.login.hub_oauth

    def get_current_user(self) -> Any:
        return None  # never the blocking lookup; a stale login simply logs in again


class SessionPage(PageHandler):
    """``<prefix>admin/session``: who is logged in, and a button that reconciles now
    (a state change through the API with the XSRF token): an example of both."""

    @admin_page
    def get(self) -> None:
        identity = self.identity
        scopes = "".join(f"<li><code>{html.escape(s)}</code></li>" for s in sorted(
            identity.scopes) if "gpushare" in s)
        self.page("gpushare admin", f"""
<p>Logged in as <b>{html.escape(identity.name)}</b> with:</p><ul>{scopes}</ul>
<p><a href="{html.escape(self.prefix)}api/v1/admin/queue">The queue (JSON)</a></p>
<p><button id="reconcile">Reconcile now</button> <span id="out"></span></p>
<script>document.getElementById("reconcile").onclick = async () => {{
  const out = document.getElementById("out");
  try {{ out.textContent = JSON.stringify(await gpushare.api("POST", "/admin/reconcile")); }}
  catch (e) {{ out.textContent = e.status + " " + e.message; }} }};</script>""")


def page_routes(base_url: str, ctx: Context) -> list[tuple[str, type, dict[str, Any]]]:
    """The OAuth callback and the broker's own pages (none when browser login is off)."""
    if ctx.login is None:
        return []
    prefix = base_url if base_url.endswith("/") else base_url + "/"
    kw = {"ctx": ctx}
    return [
        (prefix + "oauth_callback", OAuthCallbackHandler, kw),
        (prefix + "admin/session", SessionPage, kw),
    ]


__all__ = ["OAuthCallbackHandler", "PageHandler", "admin_page", "logged_in_page",
           "page_routes"]
