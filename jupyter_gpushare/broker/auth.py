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
``access:services!service=gpushare`` to the server token scopes and to the ``user`` role.

Access to the broker at all needs one of ``access:services``,
``access:services!service=gpushare`` or a ``custom:gpushare:*`` scope.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from typing import Any

from traitlets import Dict, Integer, Unicode
from traitlets.config import LoggingConfigurable

ADMIN = "custom:gpushare:admin"
ACT_AS = "custom:gpushare:act-as-users"
METRICS = "custom:gpushare:metrics"


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
    if scopes & {ADMIN, ACT_AS, METRICS}:
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


class TokenAuthenticator(LoggingConfigurable):
    """Resolve a token to an :class:`Identity` (``None``: unknown token or no access)."""

    service_name = Unicode("gpushare", config=True, help="This service's name in the hub.")

    #: seconds an identity stays in :meth:`cached` (0: never cached)
    identity_ttl_s: float = 0.0
    max_cached = 10000

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._identities: dict[str, tuple[float, Identity]] = {}

    async def identify(self, token: str) -> Identity | None:  # pragma: no cover - interface
        raise NotImplementedError

    def cached(self, token: str) -> Identity | None:
        """The identity of ``token`` if known and fresh, without awaiting (the hot path)."""
        hit = self._identities.get(token)
        if hit is None:
            return None
        if hit[0] < time.monotonic():
            del self._identities[token]
            return None
        return hit[1]

    async def identify_and_cache(self, token: str) -> Identity | None:
        identity = await self.identify(token)
        if identity is not None and self.identity_ttl_s > 0:
            if len(self._identities) >= self.max_cached:
                now = time.monotonic()
                self._identities = {t: v for t, v in self._identities.items() if v[0] >= now}
                if len(self._identities) >= self.max_cached:
                    self._identities.clear()
            self._identities[token] = (time.monotonic() + self.identity_ttl_s, identity)
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
