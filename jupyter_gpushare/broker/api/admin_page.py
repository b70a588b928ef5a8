"""The admin page: every GPU and who holds which share, the queue, teams, recent events.

``<prefix>admin/`` (``/services/gpushare/admin/``; the hub's Services menu links to the
service's root, which redirects here) is for gpushare admins only, through the hub's OAuth
login (:mod:`.pages`): anyone else gets a 403 page. The page is one HTML document with its
script and style inline (``static/admin.js``, ``static/admin.css``); it polls
``api/v1/admin/overview`` every ``POLL_MS`` and redraws only when the answer changed. Drain
and resume call the existing ``POST api/v1/admin/nodes/{node}/drain|resume`` with the
page's XSRF token.

The overview is built in two parts: what the broker holds in memory (GPUs, grants, queue,
teams), read on the event loop without I/O, and the recent preemptions and refusals, read
from the database in a worker thread.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, Engine, select
from tornado.log import app_log

from ...core.grant_end import EndKind
from ...core.model import from_milli
from ..errors import BrokerError
from ..store.db import grants_table, jobs_table, requests_table
from ..store.serial import iso
from .handler_base import BaseHandler, Context, HealthHandler
from .pages import PageHandler, admin_page
from .report_page import ReportPage
from .team_page import team_routes

if TYPE_CHECKING:
    from ..ops.culler import GPUCuller
    from ..service.broker import Broker

STATIC = Path(__file__).resolve().parent / "static"
POLL_MS = 2000
RECENT = 50  # preemptions, refusals and culls shown


def policy_version_of(path: str) -> str:
    """A short hash of the policy file's text (what the admin page shows as the version)."""
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:12]
    except OSError:
        return ""


def live_overview(broker: Broker, culler: GPUCuller | None) -> dict[str, Any]:
    """The in-memory part of the overview (no I/O: safe on the event loop)."""
    state = broker.state
    holders: dict[str, list[dict[str, Any]]] = {}
    preempting = state.preempting
    for g in state.grants.values():
        req = g.request
        for sl in g.placement.slices:
            holders.setdefault(sl.gpu_uuid, []).append({
                "grant_id": g.id,
                "user": req.user,
                "server": req.holder,
                "team": req.team,
                "kind": req.kind.value,
                "profile": req.profile,
                "memory_mib": sl.memory_mib,
                "compute_pct": sl.compute_milli / 10,
                "borrowed": g.borrowed,
                "preempting": g.id in preempting,
                "idle_warned": g.id in broker.cull_notices,
            })
    nodes = []
    for node in broker.policy.nodes:
        nodes.append({
            "name": node.name,
            "pool": node.pool,
            "drained": state.nodes[node.name].cordoned,
            "gpus": [
                {
                    "uuid": gpu.uuid,
                    "index": gpu.index,
                    "model": gpu.model,
                    "memory_mib": gpu.memory_mib,
                    "simulated": gpu.simulated,
                    "holders": holders.get(gpu.uuid, []),
                }
                for gpu in node.gpus
            ],
        })
    teams = []
    now = broker.clock()
    ledger = broker.month_hours(now)
    for team in broker.policy.teams:
        for pool, quota in team.quotas:
            key = (team.name, pool)
            teams.append({
                "team": team.name,
                "pool": pool,
                "in_use": from_milli(state.usage.get(key, 0)),
                "borrowed": from_milli(state.borrowed.get(key, 0)),
                "guaranteed": from_milli(quota.guaranteed_milli),
                "borrow_limit": from_milli(quota.borrow_limit_milli),
                "gpu_hours_month": round(ledger.hours(key, now), 3),
                "gpu_hours_budget": quota.gpu_hours_per_month,
            })
    pools = [
        {
            "pool": p.name,
            "mode": p.mode.value,
            "capacity": from_milli(state.pool_capacity_milli(p.name)),
            "in_use": from_milli(sum(v for (_, pl), v in state.usage.items() if pl == p.name)),
        }
        for p in broker.policy.pools
    ]
    return {
        "now": iso(now),
        "grants": len(state.grants),
        "nodes": nodes,
        "pools": pools,
        "teams": teams,
        "queue": broker.queue_view(),
        "culls": list(culler.history)[-RECENT:][::-1] if culler is not None else [],
    }


def recent_events(engine: Engine, ids: list[str]) -> dict[str, Any]:
    """Recent preemptions and refusals, and the reasons of the waiting requests ``ids``
    (database reads: run it in a thread)."""
    g, r = grants_table.c, requests_table.c
    with engine.connect() as conn:
        preempted = conn.execute(
            select(g.id, g.username, g.team, g.pool, g.node, g.borrowed, g.released_at,
                   g.release_reason, g.ended_by_request, g.ended_by_team)
            .where(g.released_at.is_not(None), g.end_kind == EndKind.PREEMPTED.value)
            .order_by(g.released_at.desc()).limit(RECENT)
        ).all()
        refused = conn.execute(
            select(r.id, r.username, r.team, r.pool, r.code, r.reason, r.updated_at)
            .where(r.status == "refused").order_by(r.updated_at.desc()).limit(RECENT)
        ).all()
        reasons: dict[str, tuple[str, str]] = {}
        holders: dict[str, tuple[str, str, str]] = {}
        for k in range(0, len(ids), 500):
            for rid, reason, code, server, kind, profile in conn.execute(
                select(r.id, r.reason, r.code, r.server, r.kind, r.profile)
                .where(r.id.in_(ids[k:k + 500]))
            ):
                reasons[rid] = (reason, code)
                holders[rid] = (server, kind, profile)
        jobs = job_names(conn, [h[0] for h in holders.values() if h[1] == "batch"])
    return {
        "preemptions": [
            {"grant_id": x.id, "user": x.username, "team": x.team, "pool": x.pool,
             "node": x.node, "borrowed": bool(x.borrowed), "at": iso(x.released_at),
             "reason": x.release_reason, "by_request": x.ended_by_request,
             "by_team": x.ended_by_team}
            for x in preempted
        ],
        "refusals": [
            {"request_id": x.id, "user": x.username, "team": x.team, "pool": x.pool,
             "code": x.code, "reason": x.reason, "at": iso(x.updated_at)}
            for x in refused
        ],
        "reasons": reasons,
        "holders": {rid: {"server": sv, "kind": kd, "profile": pf, "job_name": jobs.get(sv, "")}
                    for rid, (sv, kd, pf) in holders.items()},
    }


def job_names(conn: Connection, job_ids: list[str]) -> dict[str, str]:
    """The names users gave the batch jobs ``job_ids`` (a request's server is its job's id)."""
    names: dict[str, str] = {}
    j = jobs_table.c
    for k in range(0, len(job_ids), 500):
        for jid, name in conn.execute(select(j.id, j.name).where(j.id.in_(job_ids[k:k + 500]))):
            names[jid] = name or ""
    return names


class AdminOverviewHandler(BaseHandler):
    """``GET api/v1/admin/overview``: what the admin page draws (admins only)."""

    culler: GPUCuller | None = None
    policy_file: str = ""

    def initialize(  # type: ignore[override]
        self, ctx: Context, culler: GPUCuller | None = None, policy_file: str = ""
    ) -> None:
        super().initialize(ctx)
        self.culler = culler
        self.policy_file = policy_file

    async def get(self) -> None:
        self.require(self.identity.admin, "admin only")
        broker = self.ctx.broker
        data = live_overview(broker, self.culler)
        ids = [q["request_id"] for q in data["queue"]]
        loop = asyncio.get_running_loop()
        events = await loop.run_in_executor(None, recent_events, broker.engine, ids)
        reasons = events.pop("reasons")
        holders = events.pop("holders")
        for q in data["queue"]:
            q["reason"], q["code"] = reasons.get(q["request_id"], ("", ""))
            q.update(holders.get(q["request_id"], {}))
        data.update(events)
        version = getattr(broker, "policy_version", "")  # the broker's own, where it has one
        if not version and self.policy_file:  # else the file's hash, read off the loop
            version = await loop.run_in_executor(None, policy_version_of, self.policy_file)
        data["policy_version"] = version
        self.send(data)


def _static(name: str) -> str:
    return (STATIC / name).read_text(encoding="utf-8")


class AdminPage(PageHandler):
    """``<prefix>admin/``: the admin page (admins only)."""

    @admin_page
    def get(self) -> None:
        body = (
            f"<style>{_static('admin.css')}</style>"
            f'<div id="gpushare-admin" data-poll-ms="{POLL_MS}">'
            "<p>Loading...</p></div>"
            f"<script>{_static('admin.js')}</script>"
        )
        self.page("GPU sharing: admin", body)


class AdminCancelHandler(BaseHandler):
    """``POST api/v1/admin/requests/{id}/cancel``: an admin cancels someone's waiting request
    (the admin page's Cancel button), through the broker's own cancel; the log says who
    cancelled whose request."""

    async def post(self, request_id: str) -> None:
        self.require(self.identity.admin, "admin only")
        broker = self.ctx.broker
        view = broker.get_request(request_id, durable=True)
        if view is None:
            raise BrokerError(404, f"no request {request_id}", "request_id")
        if view["status"] not in ("queued", "preempting"):
            raise BrokerError(409, f"request {request_id} is {view['status']}, not waiting: "
                              "only a waiting request is cancelled here", "request_id")
        broker.cancel(request_id)
        app_log.warning("gpushare audit: admin %s cancelled request %s of %s (team %s, pool "
                        "%s, server %s)", self.identity.name, request_id, view["user"],
                        view.get("team"), view.get("pool"), view.get("server"))
        await self.settle()
        self.send(broker.get_request(request_id, durable=True))


class RootPage(HealthHandler):
    """``<prefix>``: where the hub's Services menu points. A browser (``Accept: text/html``)
    is sent to ``home`` (which logs it in, then leads an admin to the admin page and a team
    admin to the team's page, or says 403); anything else gets the health answer the root
    always gave."""

    async def get(self) -> None:
        if "text/html" in self.request.headers.get("Accept", "") and self.login is not None:
            self.redirect(self.login.base_url + "home")
            return
        await super().get()


def admin_routes(
    base_url: str, ctx: Context, culler: GPUCuller | None, policy_file: str = ""
) -> list[tuple[str, type, dict[str, Any]]]:
    """The admin page and its data (the page only when browser login is on). Put these
    before the API's routes: the service's root is answered here."""
    prefix = base_url if base_url.endswith("/") else base_url + "/"
    api = {"ctx": ctx, "culler": culler, "policy_file": policy_file}
    table: list[tuple[str, type, dict[str, Any]]] = [
        (prefix + "api/v1/admin/overview", AdminOverviewHandler, api),
        (prefix + r"api/v1/admin/requests/([^/]+)/cancel", AdminCancelHandler, {"ctx": ctx}),
    ]
    if ctx.login is not None:
        table += team_routes(prefix, ctx)
        table += [
            (prefix + "admin/report", ReportPage,
             {"ctx": ctx, "kept": OrderedDict(), "making": {}}),
            (prefix + "admin/?", AdminPage, {"ctx": ctx}),
            (prefix + "?", RootPage, {"ctx": ctx}),
        ]
    return table


__all__ = [
    "AdminCancelHandler", "AdminOverviewHandler", "AdminPage", "admin_routes", "live_overview",
]
