"""Tornado handlers of the REST API (thin: parse, authorise, call the service, answer JSON):
requests, grants, team usage, heartbeats and profiles; the route table of them all
(the shared base in :mod:`.handler_base`, admin endpoints in :mod:`.admin_handlers`, jobs in
:mod:`.job_handlers`, preemption and other notices in :mod:`.notice_handlers`).

Every handler but ``/openapi.yaml`` and ``/health`` needs ``Authorization: token <hub token>``:
no token → 401, a token the hub does not know or one without access to this service → 403,
and each handler checks that the caller may act for the user (and server) concerned.
"""

from __future__ import annotations

from typing import Any

from ...core import rules
from ...core.model import Kind
from ..hubclient import HubError
from ..service.broker import BrokerError, make_request, new_id
from ..service.fields import BadField, shorten
from ..service.ratelimit import retry_after
from .admin_handlers import (
    AdminNodeHandler,
    AdminPolicyHandler,
    AdminPolicyReloadHandler,
    AdminQueueHandler,
    AdminReconcileHandler,
    MetricsHandler,
)
from .handler_base import BaseHandler, Context, HealthHandler, OpenAPIHandler
from .job_handlers import job_routes
from .notice_handlers import NoticesHandler, NoticeStreamHandler


class RequestsHandler(BaseHandler):
    async def post(self) -> None:
        f = self.fields
        body = f.body(self.request.body)
        ident = self.identity
        user = f.text(body, "user", ident.name if ident.kind == "user" else None, required=True)
        server = f.text(body, "server", "") or ""
        assert user is not None
        self.require(
            ident.may_act_for(user, server),
            f"this token may not request GPUs for {shorten(user)}/{shorten(server)}",
        )
        kind = f.text(body, "kind", "interactive")
        if kind not in ("interactive", "batch"):
            raise BadField("kind", "kind must be interactive or batch")
        idem = f.text(body, "idempotency_key")
        broker = self.ctx.broker
        if idem and await self._send_existing(user, idem):
            return  # a retry of an answered request: free, it stores nothing
        self._take_rate_token(user)
        groups = body.get("groups")
        if groups is not None:
            if not ident.act_as:
                raise BrokerError(403, "only the hub's spawner may pass groups", "groups")
            if (
                not isinstance(groups, list)
                or len(groups) > 1000
                or not all(isinstance(g, str) for g in groups)
            ):
                raise BadField("groups", "groups must be a list of at most 1000 strings")
        spec = self._spec(body)
        team = f.text(body, "team")
        teams = await self.teams_of(user, groups)
        # another call with the same key may have been answered while the hub was asked
        if idem and await self._send_existing(user, idem):
            return
        profile = broker.policy.profile(spec["profile_slug"]) if spec["profile_slug"] else None
        if not spec["gpu_ask"].is_empty:
            team = self._check_rules(teams, team, profile, spec)
        elif team is None:
            team = next(iter(teams), None)
        elif team not in teams and not ident.admin:
            raise BrokerError(
                403, f"{shorten(user)} is not a member of team {shorten(team)}", "team"
            )
        spec["kind"] = kind
        spec["server"] = server
        spec["checkpointing"] = f.flag(body, "checkpointing")
        spec["max_runtime_s"] = f.number(body, "max_runtime_s", integer=True, maximum=10**9)
        now = broker.clock()
        rid = new_id("r")
        if spec["gpu_ask"].is_empty:  # a profile without GPU: it starts without a grant
            req = make_request(
                broker.policy, request_id=rid, user=user, team=team or "", body=spec, now=now
            )
            view = broker.refuse(req, "no GPU asked: nothing to grant", "no_gpu", idem, "granted")
            self.send(view, 201)
            return
        if team is None:
            why = f"{user} is in no team that may use " + (
                f"profile {profile.slug}" if profile else f"pool {spec['pool']}"
            )
            view = broker.refuse(
                make_request(broker.policy, request_id=rid, user=user, team="", body=spec, now=now),
                why,
                "no_team",
                idem,
            )
            self.send(view, 409)
            return
        self._one_grant_per_holder(user, server, kind)
        req = make_request(broker.policy, request_id=rid, user=user, team=team, body=spec, now=now)
        view = broker.submit(req, idempotency_key=idem)
        await self.answer(view, 409 if view["status"] == "refused" else 201)

    def _take_rate_token(self, user: str) -> None:
        """At most ``requests_per_minute_per_user`` (after a burst of
        ``request_burst_per_user``) new requests per user: else 429 with Retry-After,
        before anything is asked of the hub or stored. The hub's spawner and admins
        (act-as tokens) are not counted: the hub throttles its own spawns, and a retry of a
        spawn after a broker restart must not be refused."""
        if self.identity.act_as:
            return
        wait = self.ctx.request_buckets.take(user)
        if wait is None:
            return
        limits = self.ctx.broker.limits
        raise BrokerError(
            429,
            f"too many requests for {shorten(user)}: at most "
            f"{limits.requests_per_minute_per_user:g} a minute after a burst of "
            f"{limits.request_burst_per_user} (BrokerLimits.requests_per_minute_per_user); "
            f"retry in {retry_after(wait)} s",
            headers={"Retry-After": retry_after(wait)},
            code="requests_per_minute_per_user",
        )

    def _check_rules(
        self, teams: tuple[str, ...], team: str | None, profile: Any, spec: dict[str, Any]
    ) -> str | None:
        """The team the request is charged to, after the policy's rules on teams, profiles,
        explicit asks and priorities (:mod:`..core.rules`): a 403 naming the field if it
        breaks one; ``None`` if the user is in no team with a quota in the pool."""
        policy = self.ctx.broker.policy
        explicit_pool = None if profile is not None else spec["pool"]
        kwargs: dict[str, Any] = dict(
            user_teams=teams,
            profile=profile,
            explicit_pool=explicit_pool,
            priority=spec["priority"],
            is_admin=self.identity.admin,
        )
        if team is not None:
            refusal = rules.check_request(policy, team=team, **kwargs)
        else:
            team, refusal = rules.choose_team(policy, **kwargs)
        if refusal is not None:
            raise BrokerError(403, refusal.message, refusal.field, code=refusal.code)
        return team

    async def _send_existing(self, user: str, idem: str) -> bool:
        """Answer with the request already made with this idempotency key, if any (once
        it is durable: it may be another call's admission whose commit is in flight)."""
        broker = self.ctx.broker
        existing = broker.find_idempotent(user, idem)
        if existing is None:
            return False
        if broker.unsettled_answer(user, idem) is not None:  # found in memory: wait, re-read
            await broker.durable(everything=True)
            existing = broker.find_idempotent(user, idem)
            if existing is None:  # its commit failed: nothing was kept
                return False
        self.send(existing, 409 if existing["status"] == "refused" else 201)
        return True

    def _one_grant_per_holder(self, user: str, server: str, kind: str) -> None:
        """One server (or job) holds at most one grant or waiting request.

        The hub's spawner (act-as) asks only when it starts the server, so whatever the
        server still holds is left over from an earlier start: it is released (or its
        request cancelled) first. Any other token gets a 409."""
        if kind == "batch" and not server:
            return  # a batch request that names no job: nothing to hold it to
        broker = self.ctx.broker
        held = broker.held_by(kind, user, server)
        if not held:
            return
        what = f"server {user}/{server}" if kind == "interactive" else f"job {server}"
        if not self.identity.act_as:
            raise BrokerError(
                409,
                f"{shorten(what)} already holds {', '.join(sorted(held))}: one grant per "
                + (
                    "server; stop the server or release that grant first"
                    if kind == "interactive"
                    else "job; release that grant first"
                ),
                "server",
            )
        for live_id in sorted(held):
            if live_id in broker.state.grants:
                broker.release(live_id, "released: superseded by a new start of its holder")
            else:
                broker.cancel(live_id)

    def _spec(self, body: dict[str, Any]) -> dict[str, Any]:
        f = self.fields
        policy = self.ctx.broker.policy
        profile_value = body.get("profile")
        if isinstance(profile_value, str):
            slug = f.text(body, "profile")
            profile = policy.profile(slug or "")
            if profile is None:
                raise BadField("profile", f"unknown profile {shorten(profile_value)}")
            chosen = f.text(body, "priority") or profile.priority
            if policy.priority(chosen) is None:
                raise BadField("priority", f"unknown priority class {shorten(chosen)}")
            return {
                "profile_slug": profile.slug,
                "pool": profile.pool,
                "gpu_ask": profile.gpu,
                "priority": chosen,
                "cpu_milli": profile.cpu_milli,
                "memory_mib": profile.memory_mib,
                "gpu_models": profile.gpu_models,
            }
        if profile_value is not None and not isinstance(profile_value, dict):
            raise BadField("profile", "profile must be a profile slug or an object")
        src = profile_value if isinstance(profile_value, dict) else body
        pool = f.text(src, "pool", required=True)
        if policy.pool(pool or "") is None:
            raise BadField("pool", f"unknown pool {shorten(pool)}")
        priority = f.text(src, "priority")
        if priority is None:
            priority = "interactive" if policy.priority("interactive") else None
        if priority is None or policy.priority(priority) is None:
            raise BadField("priority", f"unknown priority class {shorten(priority)}")
        models = src.get("gpu_models", [])
        if (
            not isinstance(models, list)
            or len(models) > 64
            or not all(isinstance(m, str) and len(m) <= 255 for m in models)
        ):
            raise BadField("gpu_models", "gpu_models must be a list of at most 64 model names")
        return {
            "profile_slug": "",
            "pool": pool,
            "gpu_ask": f.gpu_ask(src.get("gpu")),
            "priority": priority,
            "cpu_milli": f.number(src, "cpu_milli", integer=True, maximum=10**9) or 0,
            "memory_mib": f.number(src, "memory_mib", integer=True, maximum=10**10) or 0,
            "gpu_models": tuple(models),
        }

    def get(self) -> None:
        user = self.arg("user")
        if not self.identity.act_as:
            self.require(user in (None, self.identity.name), "you may list only your own requests")
            user = self.identity.name
        self.send({"requests": self.ctx.broker.list_requests(user=user)})


class RequestHandler(BaseHandler):
    def _load(self, request_id: str) -> dict[str, Any]:
        view = self.ctx.broker.get_request(request_id, durable=True)
        if view is None:
            raise BrokerError(404, f"no request {request_id}")
        self.require(self.identity.may_read_user(view["user"]), "not your request")
        return view

    def get(self, request_id: str) -> None:
        self.send(self._load(request_id))

    async def delete(self, request_id: str) -> None:
        view = self._load(request_id)
        self.require(self.identity.may_act_for(view["user"], view["server"]), "not your request")
        self.ctx.broker.cancel(request_id)
        await self.settle()  # then read it back as committed
        self.send(self._load(request_id))


class GrantsHandler(BaseHandler):
    def get(self) -> None:
        user = self.arg("user")
        if not self.identity.act_as:
            self.require(
                user in (None, self.identity.name),
                "you may list only your own grants (team totals: /teams/{team}/usage)",
            )
            user = self.identity.name
        grants = self.ctx.broker.list_grants(
            user=user, team=self.arg("team"), pool=self.arg("pool"), node=self.arg("node")
        )
        self.send({"grants": grants})


class GrantHandler(BaseHandler):
    def _load(self, grant_id: str) -> dict[str, Any]:
        view = self.ctx.broker.get_grant(grant_id, durable=True)
        if view is None:
            raise BrokerError(404, f"no grant {grant_id}")
        self.require(self.identity.may_read_user(view["user"]), "not your grant")
        return view

    def get(self, grant_id: str) -> None:
        self.send(self._load(grant_id))

    async def delete(self, grant_id: str) -> None:
        view = self._load(grant_id)
        ident = self.identity
        self.require(ident.may_act_for(view["user"], view["server"]), "not your grant")
        broker = self.ctx.broker
        grant = broker.state.grants.get(grant_id)
        if grant is not None and grant.request.kind is Kind.INTERACTIVE and ident.kind == "user":
            # a server never runs without its grant: its user releases it by stopping it
            running = await self._server_running(grant.user, grant.request.holder)
            if running and not ident.admin:
                raise BrokerError(
                    409,
                    f"server {shorten(grant.user)}/{shorten(grant.request.holder)} is running: "
                    "stop the server to release its grant",
                    "grant_id",
                )
            if running and self.ctx.hub is not None:
                try:  # an admin's release stops the server
                    await self.ctx.hub.stop_server(grant.user, grant.request.holder)
                except HubError as exc:
                    raise BrokerError(503, "cannot ask the hub to stop the server") from exc
        released = broker.release(grant_id, "released by holder")
        await self.settle()  # before get_grant, which reads the released row back
        self.send({"released": released, "grant": broker.get_grant(grant_id, durable=True)})

    async def _server_running(self, user: str, server: str) -> bool:
        """Whether the hub lists the server (running or starting); no hub: ``False``."""
        if self.ctx.hub is None:
            return False
        try:
            model = await self.ctx.hub.get_user(user)
        except HubError as exc:
            raise BrokerError(503, "cannot ask the hub whether the server runs") from exc
        return model is not None and server in (model.get("servers") or {})


class TeamUsageHandler(BaseHandler):
    async def get(self, team: str) -> None:
        if not self.identity.act_as:
            self.require(self.identity.kind == "user", "not allowed for this token")
            teams = await self.teams_of(self.identity.name)
            self.require(team in teams, f"you are not a member of team {team}")
        self.send(self.ctx.broker.team_usage(team))


class HeartbeatHandler(BaseHandler):
    def post(self) -> None:
        f = self.fields
        body = f.body(self.request.body)
        grant_id = f.text(body, "grant_id", required=True)
        assert grant_id is not None
        broker = self.ctx.broker
        grant = broker.state.grants.get(grant_id)
        if grant is None:
            raise BrokerError(404, f"no live grant {shorten(grant_id)}")
        self.require(self.identity.may_act_for(grant.user, grant.request.holder), "not your grant")
        ts = f.timestamp(body, "ts")
        gpus = body.get("gpus", [])
        if not isinstance(gpus, list) or len(gpus) > 64:
            raise BadField("gpus", "gpus must be a list of at most 64 objects")
        clean = []
        for i, item in enumerate(gpus):
            if not isinstance(item, dict):
                raise BadField(f"gpus[{i}]", "each gpu must be an object")
            clean.append(
                {
                    "uuid": f.text(item, "uuid", required=True, name=f"gpus[{i}].uuid"),
                    "memory_used_mib": f.number(
                        item, "memory_used_mib", maximum=10**8, name=f"gpus[{i}].memory_used_mib"
                    ),
                    "utilization_pct": f.number(
                        item, "utilization_pct", maximum=100, name=f"gpus[{i}].utilization_pct"
                    ),
                    "power_w": f.number(item, "power_w", maximum=10**5, name=f"gpus[{i}].power_w"),
                }
            )
        kernel_ts = f.timestamp(body, "kernel_activity_ts")
        broker.heartbeat(grant_id, ts, clean, f.flag(body, "simulated"), kernel_activity=kernel_ts)
        self.set_status(204)
        self.finish()


class ProfilesHandler(BaseHandler):
    async def get(self) -> None:
        user = self.arg("user") or self.identity.name
        if not self.identity.act_as:
            self.require(
                self.identity.kind == "user" and user == self.identity.name,
                "you may list only your own profiles",
            )
        teams = await self.teams_of(user)
        broker = self.ctx.broker
        profiles = broker.profiles_view(teams, user)
        self.send(
            {
                "user": user,
                "teams": list(teams),
                "profiles": profiles,
                "policy_version": broker.policy_version,
            }
        )


def routes(base_url: str, ctx: Context) -> list[tuple[str, type, dict[str, Any]]]:
    base = base_url.rstrip("/") + "/api/v1"
    kw = {"ctx": ctx}
    table: list[tuple[str, type]] = [
        (base + r"/requests", RequestsHandler),
        (base + r"/requests/([^/]+)", RequestHandler),
        (base + r"/grants", GrantsHandler),
        (base + r"/grants/([^/]+)", GrantHandler),
        (base + r"/teams/([^/]+)/usage", TeamUsageHandler),
        (base + r"/notices", NoticesHandler),
        (base + r"/notices/stream", NoticeStreamHandler),
        (base + r"/heartbeats", HeartbeatHandler),
        (base + r"/admin/nodes/([^/]+)/(drain|resume)", AdminNodeHandler),
        (base + r"/admin/reconcile", AdminReconcileHandler),
        (base + r"/admin/queue", AdminQueueHandler),
        (base + r"/admin/policy", AdminPolicyHandler),
        (base + r"/admin/policy/reload", AdminPolicyReloadHandler),
        (base + r"/metrics", MetricsHandler),
        (base_url.rstrip("/") + r"/metrics", MetricsHandler),
        (base + r"/policy/profiles", ProfilesHandler),
        (base + r"/openapi.yaml", OpenAPIHandler),
        (base_url.rstrip("/") + r"/openapi.yaml", OpenAPIHandler),
        (base + r"/health", HealthHandler),
        (base_url.rstrip("/") + r"/?", HealthHandler),
    ]
    table += job_routes(base)
    return [(pattern, handler, kw) for pattern, handler in table]


__all__ = ["routes"]
