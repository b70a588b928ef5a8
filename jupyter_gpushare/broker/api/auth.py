"""Who is calling: JupyterHub tokens resolved into an :class:`Identity`.

The broker resolves ``Authorization: token <t>`` with :class:`jupyterhub.services.auth.HubAuth`
(``GET /hub/api/user`` with the broker's own token; answers cached for ``cache_max_age``).
The hub answers with the token owner's model plus the token's *expanded* scopes.

What a single-user server's token looks like (JupyterHub 6, checked in
``jupyterhub/scopes.py`` and ``roles.py``): the server's ``$JUPYTERHUB_API_TOKEN`` gets the
scopes of ``Spawner.server_token_scopes`` (default: the ``server`` role, i.e.
``users:activity!user`` and ``access:servers!server``), and the hub expands the bare filters
to the owner: ``access:servers!server=alice/`` (default server) or
``access:servers!server=alice/gpu2``. A user's personal token instead carries
``access:servers!user=alice`` (from ``self``). So a token whose scopes name
``access:servers!server=<user>/<name>`` and do not grant access to all of the user's servers
is a server token, and it may act only for that server. ``hubsetup.setup_gpushare`` adds
``custom:gpushare:use`` to the server token scopes and to the ``user`` role (and
``access:services!service=gpushare``, which also shows the hub's menu entry, to admins and
team admins only).

Access to the broker at all needs one of ``access:services``,
``access:services!service=gpushare`` or a ``custom:gpushare:*`` scope.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import time
from dataclasses import dataclass
from typing import Any, Protocol

from jupyterhub.services.auth import HubOAuthenticated
from traitlets import Dict, Float, Integer, Unicode
from traitlets.config import LoggingConfigurable

ADMIN = "custom:gpushare:admin"
ACT_AS = "custom:gpushare:act-as-users"
METRICS = "custom:gpushare:metrics"
USE = "custom:gpushare:use"


@dataclass(frozen=True)
class Identity:
    """The caller, as the hub described its token."""

    kind: str  # "user" or "service"
    name: str
    scopes: frozenset[str]
    groups: tuple[str, ...] = ()
    servers: frozenset[str] | None = None  # a server token: the only server(s) it may act for

    @property
    def admin(self) -> bool:
        return ADMIN in self.scopes

    @property
    def act_as(self) -> bool:
        return self.admin or ACT_AS in self.scopes

    @property
    def metrics(self) -> bool:
        return self.admin or METRICS in self.scopes

    def may_act_for(self, user: str, server: str | None = None) -> bool:
        """Whether this caller may create, read or release things of ``user``'s ``server``."""
        if self.act_as:
            return True
        if self.kind != "user" or self.name != user:
            return False
        if self.servers is None:
            return True
        return server is not None and server in self.servers

    def may_read_user(self, user: str) -> bool:
        """Reading a user's grants/notices: the user's own tokens (any server's), act-as, admin."""
        return self.act_as or (self.kind == "user" and self.name == user)


def service_access(scopes: frozenset[str], service_name: str) -> bool:
    if scopes & {ADMIN, ACT_AS, METRICS, USE}:
        return True
    return "access:services" in scopes or f"access:services!service={service_name}" in scopes


def identity_from_model(model: dict[str, Any], service_name: str = "gpushare") -> Identity | None:
    """Build an :class:`Identity` from the hub's ``/api/user`` answer; ``None`` if no access."""
    scopes = frozenset(model.get("scopes") or ())
    if not service_access(scopes, service_name):
        return None
    kind = model.get("kind") or "user"
    name = model.get("name") or ""
    servers: frozenset[str] | None = None
    if kind == "user":
        prefix = f"access:servers!server={name}/"
        named = frozenset(s[len(prefix) :] for s in scopes if s.startswith(prefix))
        broad = "access:servers" in scopes or f"access:servers!user={name}" in scopes
        if named and not broad:
            servers = named
    return Identity(
        kind=kind,
        name=name,
        scopes=scopes,
        groups=tuple(model.get("groups") or ()),
        servers=servers,
    )


@dataclass(frozen=True)
class TokenAnswer:
    """What an authenticator holds of the hub's answer about one token (monotonic times)."""

    identity: Identity
    expires: float | None  # kept for :meth:`TokenAuthenticator.cached` until then; None: not
    confirmed: float | None  # when the hub last confirmed it (None: not kept as a fallback)


class TokenMemory(Protocol):
    """A second memory of the hub's answers, beside an authenticator's own: asked when the
    authenticator has no answer of its own, and told each answer the hub gives. The broker's
    is :class:`..ops.carry.Carry` (what the broker before this one learnt, and what this one
    learns for the next)."""

    def recall(self, token: str) -> tuple[float, Identity] | None:
        """A fresh identity of ``token`` and when it expires (monotonic), if remembered."""

    def recall_confirmed(self, token: str) -> tuple[float, Identity] | None:
        """When the hub last confirmed ``token`` (monotonic), and the identity it gave."""

    def learnt(self, token: str, answer: TokenAnswer) -> None:
        """The hub confirmed ``token``: ``answer`` is what the authenticator holds now."""

    def refused(self, token: str) -> None:
        """The hub refused ``token`` (revoked): it must never be recalled again."""


class TokenAuthenticator(LoggingConfigurable):
    """Resolve a token to an :class:`Identity` (``None``: unknown token or no access)."""

    service_name = Unicode("gpushare", config=True, help="This service's name in the hub.")
    stale_identity_s = Float(
        3600.0,
        config=True,
        help="When the hub cannot be reached (it is shutting down or restarting), a token "
        "the hub confirmed within this many seconds keeps the identity it had, so the "
        "spawners' releases during the hub's shutdown still succeed. 0: never.",
    )

    #: seconds an identity stays in :meth:`cached` (0: never cached)
    identity_ttl_s: float = 0.0
    max_cached = 10000

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._identities: dict[str, tuple[float, Identity]] = {}  # token -> (expires, identity)
        self._confirmed: dict[str, tuple[float, Identity]] = {}  # last answer of the hub
        self.memory: TokenMemory | None = None  # a second memory (the carry), if any

    async def identify(self, token: str) -> Identity | None:  # pragma: no cover - interface
        raise NotImplementedError

    def cached(self, token: str) -> Identity | None:
        """The identity of ``token`` if known and fresh, without awaiting (the hot path)."""
        hit = self._identities.get(token)
        if hit is None:
            return self._recalled(token)
        if hit[0] < time.monotonic():
            del self._identities[token]
            return None
        return hit[1]

    def _recalled(self, token: str) -> Identity | None:
        """A fresh identity of ``token`` from the second memory, kept as if learnt here."""
        hit = self.memory.recall(token) if self.memory is not None else None
        if hit is None or hit[0] <= time.monotonic():
            return None
        self._keep(token, *hit)
        return hit[1]

    def _keep(self, token: str, expires: float, identity: Identity) -> None:
        if len(self._identities) >= self.max_cached:
            now = time.monotonic()
            self._identities = {t: v for t, v in self._identities.items() if v[0] >= now}
            if len(self._identities) >= self.max_cached:
                self._identities.clear()
        self._identities[token] = (expires, identity)

    def answer(self, token: str) -> TokenAnswer | None:
        """What this authenticator holds of the hub's answer about ``token``."""
        kept, confirmed = self._identities.get(token), self._confirmed.get(token)
        if kept is None and confirmed is None:
            return None
        return TokenAnswer(
            identity=(kept or confirmed)[1],  # type: ignore[index]
            expires=kept[0] if kept is not None else None,
            confirmed=confirmed[0] if confirmed is not None else None,
        )

    def answers(self) -> dict[str, TokenAnswer]:
        """Every answer held: fresh identities, and the hub's last confirmations."""
        now = time.monotonic()
        tokens = [t for t, kept in self._identities.items() if kept[0] > now]
        held = {t: self.answer(t) for t in dict.fromkeys([*tokens, *self._confirmed])}
        return {t: a for t, a in held.items() if a is not None}

    async def identify_and_cache(self, token: str) -> Identity | None:
        try:
            identity = await self.identify(token)
        except Exception as exc:
            known = self._confirmed.get(token)
            if known is None and self.memory is not None:
                known = self.memory.recall_confirmed(token)
            unreachable = isinstance(exc, OSError) or getattr(exc, "status_code", 0) >= 500
            if (unreachable and known is not None
                    and time.monotonic() - known[0] <= self.stale_identity_s):
                self.log.warning("gpushare: the hub is unreachable (%s); %s %s keeps the "
                                 "identity the hub confirmed %.0fs ago", exc,
                                 known[1].kind, known[1].name, time.monotonic() - known[0])
                return known[1]
            raise
        if identity is None:
            self._confirmed.pop(token, None)  # revoked: never again, not even as stale
            if self.memory is not None:
                self.memory.refused(token)
            return None
        if self.stale_identity_s > 0:
            if len(self._confirmed) >= self.max_cached:
                self._confirmed.clear()
            self._confirmed[token] = (time.monotonic(), identity)
        if self.identity_ttl_s > 0:
            self._keep(token, time.monotonic() + self.identity_ttl_s, identity)
        answer = self.answer(token)
        if self.memory is not None and answer is not None:
            self.memory.learnt(token, answer)
        return identity


class HubTokenAuthenticator(TokenAuthenticator):
    """Tokens checked with JupyterHub (``HubAuth``), answers cached."""

    api_url = Unicode(config=True, help="Hub API URL (default: $JUPYTERHUB_API_URL).")
    api_token = Unicode(
        config=True, help="This service's hub token (default: $JUPYTERHUB_API_TOKEN)."
    )
    cache_max_age = Integer(300, config=True, help="Seconds to cache the hub's answer for a token.")

    def _default_api_url(self) -> str:
        return os.environ.get("JUPYTERHUB_API_URL", "http://127.0.0.1:8081/hub/api")

    def _default_api_token(self) -> str:
        return os.environ.get("JUPYTERHUB_API_TOKEN", "")

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        from jupyterhub.services.auth import HubAuth

        self.hub_auth = HubAuth(
            api_url=self.api_url or self._default_api_url(),
            api_token=self.api_token or self._default_api_token(),
            cache_max_age=self.cache_max_age,
        )
        # the identity built from the hub's answer is cached instead of the answer itself,
        # for the same time (so a revoked token still stops working within cache_max_age)
        self.identity_ttl_s = float(self.cache_max_age)

    async def identify(self, token: str) -> Identity | None:
        model = await self.hub_auth.user_for_token(
            token, use_cache=self.identity_ttl_s <= 0, sync=False
        )
        if not model:
            return None
        return identity_from_model(model, self.service_name)


class StaticTokenAuthenticator(TokenAuthenticator):
    """Tokens from a fixed table (benchmarks and crash tests without a hub; never in production).

    ``tokens`` maps a token to a hub-like model ``{"kind", "name", "scopes", "groups"}``;
    ``tokens_file`` names a JSON file holding the same mapping.
    """

    tokens = Dict(config=True)
    tokens_file = Unicode("", config=True)
    identity_ttl_s = 3600.0

    async def identify(self, token: str) -> Identity | None:
        table = self.tokens
        if not table and self.tokens_file:
            with open(self.tokens_file) as f:
                self.tokens = table = json.load(f)
        model = table.get(token)
        if model is None:
            return None
        return identity_from_model(model, self.service_name)


# -- browser login (the hub's OAuth) ---------------------------------------------------------

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


class BrowserLogin(LoggingConfigurable):
    """The hub's OAuth login for browsers, with JupyterHub's own :class:`HubOAuth`.

    A browser that opens a page of the broker without a cookie is sent to the hub's
    ``/hub/api/oauth2/authorize``; the hub (where the user is logged in) sends it back to
    ``<prefix>oauth_callback`` with a code, which :class:`HubOAuthCallbackHandler` trades for
    an OAuth token kept in a signed cookie. Every later request (pages and the JSON API)
    is identified by that token, whose scopes the hub limits to the service's
    ``oauth_client_allowed_scopes`` (``hubsetup`` allows the admin and metrics scopes),
    so a user who is not a gpushare admin never gets the admin scope in a browser.

    Cookie-authenticated requests that change state (POST, PUT, PATCH, DELETE) must carry
    the XSRF token (header ``X-XSRFToken`` or form field ``_xsrf``) that pages embed;
    token-authenticated API calls (``Authorization: token ...``) need none.
    """

    client_id = Unicode(config=True, help="OAuth client id (default: $JUPYTERHUB_CLIENT_ID, "
                        "else service-<name>).")
    redirect_uri = Unicode(config=True, help="OAuth callback URL (default: "
                           "$JUPYTERHUB_OAUTH_CALLBACK_URL, else <prefix>oauth_callback).")

    def __init__(self, *, api_url: str, api_token: str, base_url: str,
                 service_name: str = "gpushare", cache_max_age: int = 300, **kwargs: Any):
        super().__init__(**kwargs)
        from jupyterhub.services.auth import HubOAuth

        self.service_name = service_name
        self.base_url = base_url if base_url.endswith("/") else base_url + "/"
        client_id = (self.client_id or os.environ.get("JUPYTERHUB_CLIENT_ID")
                     or f"service-{service_name}")
        redirect = (self.redirect_uri or os.environ.get("JUPYTERHUB_OAUTH_CALLBACK_URL")
                    or self.base_url + "oauth_callback")
        self.hub_oauth = HubOAuth(api_url=api_url, api_token=api_token or "unset",
                                  base_url=self.base_url, oauth_client_id=client_id,
                                  oauth_redirect_uri=redirect, cache_max_age=cache_max_age)

    def has_cookie(self, handler: Any) -> bool:
        """Whether the request carries this service's login cookie (signed and unexpired)."""
        return handler.get_secure_cookie(self.hub_oauth.cookie_name) is not None

    async def identify(self, handler: Any) -> Identity | None:
        """The identity behind the login cookie (``None``: expired, revoked, no access)."""
        model = await self.hub_oauth.get_user(handler, sync=False)
        if not model:
            return None
        return identity_from_model(model, self.service_name)


class BrowserAuthMixin(HubOAuthenticated):  # type: ignore[misc]
    """What a tornado handler of the broker needs for browser logins.

    JupyterHub's ``HubOAuthenticated`` gives the XSRF token bound to the login
    (``self.xsrf_token``) and its check (``self.check_xsrf_cookie()``). The handler sets
    ``self.login`` (a :class:`BrowserLogin` or ``None``) and calls
    :meth:`login_from_cookie` when a request has no ``Authorization`` header.
    """

    login: BrowserLogin | None = None
    _token_authenticated = False

    @property
    def hub_auth(self) -> Any:
        return self.login.hub_oauth if self.login is not None else None

    @hub_auth.setter
    def hub_auth(self, value: Any) -> None:  # HubAuthenticated's setter; unused here
        pass

    def check_xsrf_cookie(self) -> None:
        # token calls need no XSRF token; browsers (cookie calls) do, on state changes
        if self._token_authenticated or self.login is None:
            return None
        return super().check_xsrf_cookie()  # type: ignore[no-any-return]

    def get_current_user(self) -> Any:  # never a blocking call to the hub
        return getattr(self, "identity", None)

    def has_login_cookie(self) -> bool:
        return self.login is not None and self.login.has_cookie(self)

    async def login_from_cookie(self) -> None:
        """Set ``self.identity`` from the login cookie; for a request that changes state the
        XSRF token is checked first (403 naming ``_xsrf`` without it)."""
        from ..errors import BrokerError

        assert self.login is not None
        if self.request.method not in SAFE_METHODS:
            try:
                self.check_xsrf_cookie()
            except Exception as exc:  # tornado's HTTPError(403, ...)
                raise BrokerError(403, "a browser request that changes something needs "
                                  "the XSRF token (header X-XSRFToken)", "_xsrf") from exc
        try:
            identity = await self.login.identify(self)
        except Exception as exc:
            raise BrokerError(503, "cannot check the login with the hub") from exc
        if identity is None:
            raise BrokerError(403, "this login may not use the gpushare service")
        self.identity = identity


def cookie_secret(path: str, log: logging.Logger | logging.LoggerAdapter[Any]) -> bytes:
    """The secret that signs login cookies, kept in the file ``path`` (made 0600 the first
    time; "" for a new secret on each start)."""
    if not path:
        return secrets.token_bytes(32)
    try:
        with open(path) as f:
            return bytes.fromhex(f.read().strip())
    except FileNotFoundError:
        pass
    except (OSError, ValueError) as exc:
        log.warning("gpushare: cannot read cookie secret %s (%s): a new one", path, exc)
        return secrets.token_bytes(32)
    secret = secrets.token_bytes(32)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secret.hex())
    except FileExistsError:  # another broker wrote it meanwhile
        return cookie_secret(path, log)
    except OSError as exc:
        log.warning("gpushare: cannot write cookie secret %s (%s)", path, exc)
    return secret
