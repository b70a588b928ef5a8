"""A team's page for its admins: ``<prefix>team/<name>``.

Who may open it: gpushare admins (any team), and the users named in the team's ``admins``
in the policy in force (their own teams only); everyone else gets a 403 page. It shows the
team's members (the hub's groups of the team), its live grants, its waiting requests, its
GPU-hours this month against its budget per pool, and its recent refusals and preemptions,
with a link to the team's monthly report (``admin/report?team=<name>``).

``<prefix>home`` is where the service's root sends a browser (the hub's Services menu entry):
an admin goes on to the admin page, a team admin to the team's page (a list when the user
administers several teams); anyone else gets a 403 page that says why.

The live part (grants, queue, usage) is read from the broker's memory on the event loop; the
members from the hub; the refusals and preemptions from the database in a worker thread.
"""

from __future__ import annotations

import asyncio
import html
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from sqlalchemy import Engine, select

from ...core.grant_end import EndKind
from ...report import reading
from ..errors import BrokerError
from ..hubclient import HubError
from ..store.db import grants_table, requests_table
from ..store.serial import iso
from .pages import PageHandler, logged_in_page

if TYPE_CHECKING:
    from ...core.model import Policy
    from .auth import Identity

RECENT = 30
"""Refusals and preemptions shown on a team's page."""


def teams_administered(policy: Policy, identity: Identity) -> list[str]:
    """The teams whose page ``identity`` may open: every team for a gpushare admin, else
    those naming the user among their ``admins``."""
    if identity.admin:
        return [t.name for t in policy.teams]
    if identity.kind != "user":
        return []
    return [t.name for t in policy.teams if identity.name in t.admins]


def require_team(policy: Policy, identity: Identity, team: str) -> None:
    """403 unless ``identity`` may see ``team``'s page and report (404: no such team, said
    only to those who may see every team)."""
    if identity.admin:
        if policy.team(team) is None:
            raise BrokerError(404, f"no team {team!r} in the policy")
        return
    if team not in teams_administered(policy, identity):
        raise BrokerError(
            403,
            f"{identity.name} is not an admin of team {team!r} (the "
            "team's admins are named in the policy)",
        )


def team_events(engine: Engine, team: str) -> dict[str, list[dict[str, Any]]]:
    """The team's recent preemptions and refusals (database reads: run it in a thread)."""
    g, r = grants_table.c, requests_table.c
    with engine.connect() as conn:
        preempted = conn.execute(
            select(
                g.id,
                g.username,
                g.server,
                g.pool,
                g.node,
                g.borrowed,
                g.released_at,
                g.release_reason,
                g.ended_by_team,
            )
            .where(
                g.team == team, g.released_at.is_not(None), g.end_kind == EndKind.PREEMPTED.value
            )
            .order_by(g.released_at.desc())
            .limit(RECENT)
        ).all()
        refused = conn.execute(
            select(r.id, r.username, r.server, r.pool, r.code, r.reason, r.updated_at)
            .where(r.team == team, r.status == "refused")
            .order_by(r.updated_at.desc())
            .limit(RECENT)
        ).all()
    return {
        "preemptions": [
            {
                "grant_id": x.id,
                "user": x.username,
                "server": x.server,
                "pool": x.pool,
                "node": x.node,
                "borrowed": bool(x.borrowed),
                "at": iso(x.released_at),
                "reason": x.release_reason or "",
                "by_team": x.ended_by_team or "",
            }
            for x in preempted
        ],
        "refusals": [
            {
                "request_id": x.id,
                "user": x.username,
                "server": x.server,
                "pool": x.pool,
                "code": x.code,
                "reason": x.reason,
                "at": iso(x.updated_at),
            }
            for x in refused
        ],
    }


def _e(value: Any) -> str:
    return html.escape(str(value if value is not None else ""))


def _table(cls: str, head: list[str], rows: list[str]) -> str:
    cells = "".join(f"<th>{_e(h)}</th>" for h in head)
    body = "".join(rows) or f'<tr><td colspan="{len(head)}">none</td></tr>'
    return f'<table class="{cls}"><thead><tr>{cells}</tr></thead><tbody>{body}</tbody></table>'


def _time(stamp: str | None) -> str:
    """An ISO time in a <time> element (the page's script writes it in local time)."""
    if not stamp:
        return ""
    return f'<time datetime="{_e(stamp)}">{_e(stamp[:16].replace("T", " "))} UTC</time>'


def usage_rows(usage: dict[str, Any]) -> list[str]:
    rows = []
    for pool, u in usage["pools"].items():
        budget = u["gpu_hours_budget"]
        used = u["gpu_hours_month"]
        share = used / budget if budget else None
        rows.append(
            f'<tr data-pool="{_e(pool)}"><td>{_e(pool)}</td>'
            f'<td class="num">{_e(reading.units(u["in_use"]))}</td>'
            f'<td class="num">{_e(reading.units(u["guaranteed"]))}</td>'
            f'<td class="num">{_e(reading.units(u["borrow_limit"]))}</td>'
            f'<td class="num">{_e(reading.units(u["borrowed"]))}</td>'
            f'<td class="num">{_e(reading.units(u["lent"]))}</td>'
            f'<td class="num" data-gpu-hours="{used}">{_e(reading.gpu_hours(used))}</td>'
            f'<td class="num">{_e(reading.gpu_hours(budget))}</td>'
            f'<td class="num">{_e(reading.percent(share))}</td>'
            f'<td class="num">{_e(u["queued"])}</td></tr>'
        )
    return rows


def grant_rows(grants: list[dict[str, Any]]) -> list[str]:
    return [
        f'<tr data-grant="{_e(g["id"])}"><td>{_e(g["user"])}</td><td>{_e(g["server"])}</td>'
        f"<td>{_e(g['kind'])}</td><td>{_e(g['profile'])}</td><td>{_e(g['pool'])}</td>"
        f'<td>{_e(g["node"])}</td><td class="num">{_e(reading.units(g["units"]))}</td>'
        f"<td>{'borrowed' if g['borrowed'] else 'guaranteed'}"
        f"{', being preempted' if g.get('preemption') else ''}</td>"
        f"<td>{_time(g['granted_at'])}</td></tr>"
        for g in sorted(grants, key=lambda g: (g["pool"], g["user"], g["granted_at"] or ""))
    ]


def queue_rows(queue: list[dict[str, Any]]) -> list[str]:
    return [
        f'<tr data-request="{_e(q["request_id"])}"><td class="num">'
        f"{_e(q['position'] if q['position'] is not None else '')}</td><td>{_e(q['user'])}</td>"
        f'<td>{_e(q["pool"])}</td><td class="num">{_e(reading.units(q["units"]))}</td>'
        f"<td>{_e(q['priority'])}</td><td>{_e(q['status'])}</td>"
        f"<td>{_e(reading.duration(q.get('expected_wait_s')))}</td>"
        f"<td>{_time(q['created_at'])}</td></tr>"
        for q in queue
    ]


def event_tables(events: dict[str, list[dict[str, Any]]]) -> str:
    pre = [
        f'<tr data-grant="{_e(p["grant_id"])}"><td>{_time(p["at"])}</td><td>{_e(p["user"])}</td>'
        f"<td>{_e(p['server'])}</td><td>{_e(p['pool'])}</td><td>{_e(p['node'])}</td>"
        f"<td>{'yes' if p['borrowed'] else 'no'}</td><td>{_e(p['by_team'])}</td>"
        f"<td>{_e(p['reason'])}</td></tr>"
        for p in events["preemptions"]
    ]
    ref = [
        f'<tr data-request="{_e(r["request_id"])}"><td>{_time(r["at"])}</td>'
        f"<td>{_e(r['user'])}</td><td>{_e(r['server'])}</td><td>{_e(r['pool'])}</td>"
        f"<td>{_e(r['code'])}</td><td>{_e(r['reason'])}</td></tr>"
        for r in events["refusals"]
    ]
    return (
        f"<h2>Recent preemptions ({len(pre)})</h2>"
        + _table(
            "preemptions",
            ["at", "user", "server", "pool", "node", "borrowed", "for team", "reason"],
            pre,
        )
        + f"<h2>Recent refusals ({len(ref)})</h2>"
        + _table("refusals", ["at", "user", "server", "pool", "code", "reason"], ref)
    )


LOCAL_TIMES_JS = """
for (const t of document.querySelectorAll("time[datetime]")) {
  const d = new Date(t.getAttribute("datetime"));
  if (!isNaN(d)) t.textContent = d.toLocaleString(undefined, {year: "numeric",
    month: "short", day: "numeric", hour: "2-digit", minute: "2-digit", timeZoneName: "short"});
  t.dataset.local = "yes";
}
"""
"""Times written in the reader's local time, with the zone (the server writes UTC)."""

STYLE = """<style>.num{text-align:right}.members li.admin::after{content:" (team admin)";
color:#555}h2{font-size:16px;margin:1.2em 0 .4em}table{font-size:13px;margin-bottom:1em}
.meta{color:#555}</style>"""


class TeamPage(PageHandler):
    """``<prefix>team/<name>``: the team's page (its admins and gpushare admins)."""

    @logged_in_page
    async def get(self, team: str) -> None:
        broker = self.ctx.broker
        require_team(broker.policy, self.identity, team)
        usage = broker.team_usage(team)
        grants = broker.list_grants(team=team)
        queue = [q for q in broker.queue_view() if q["team"] == team]
        loop = asyncio.get_running_loop()
        events = await loop.run_in_executor(None, team_events, broker.engine, team)
        members = await self._members(team)
        self.page(f"Team {team}", self._body(team, usage, grants, queue, events, members))

    async def _members(self, team: str) -> str:
        policy_team = self.ctx.broker.policy.team(team)
        assert policy_team is not None
        if self.ctx.hub is None:
            return '<p class="meta">No hub to ask for the members.</p>'
        parts = []
        for group in policy_team.groups:
            try:
                users = await self.ctx.hub.group_members(group)
            except HubError:
                parts.append(f"<li>group {_e(group)}: the hub could not be asked</li>")
                continue
            if users is None:
                parts.append(f"<li>group {_e(group)}: no such group in the hub</li>")
                continue
            items = (
                "".join(
                    f'<li class="{"admin" if u in policy_team.admins else ""}" '
                    f'data-user="{_e(u)}">{_e(u)}</li>'
                    for u in users
                )
                or "<li>nobody</li>"
            )
            parts.append(
                f'<li>group <b>{_e(group)}</b> ({len(users)}):<ul class="members">{items}</ul></li>'
            )
        admins = ", ".join(policy_team.admins) or "none named"
        return (
            f'<ul class="groups">{"".join(parts)}</ul><p class="meta">Team admins: '
            f"{_e(admins)}.</p>"
        )

    def _body(
        self,
        team: str,
        usage: dict[str, Any],
        grants: list[dict[str, Any]],
        queue: list[dict[str, Any]],
        events: dict[str, list[dict[str, Any]]],
        members: str,
    ) -> str:
        report = f"{self.prefix}admin/report?team={quote(team, safe='')}"
        month = usage["month"]
        return (
            STYLE
            + f'<div id="gpushare-team" data-team="{_e(team)}">'
            + f'<p class="meta">Month {_e(month)} so far &middot; {len(grants)} live grant(s) '
            f"&middot; {len(queue)} waiting &middot; "
            f'<a id="team-report-link" href="{_e(report)}&month={_e(month)}">the team\'s '
            f'report this month (partial)</a> &middot; <a href="{_e(report)}">last month</a>'
            "</p>"
            + "<h2>GPU-hours and budget this month, per pool</h2>"
            + _table(
                "usage",
                [
                    "pool",
                    "in use",
                    "guaranteed",
                    "borrow limit",
                    "borrowed",
                    "lent to others",
                    "GPU-hours this month",
                    "budget",
                    "budget used",
                    "waiting",
                ],
                usage_rows(usage),
            )
            + f"<h2>Live grants ({len(grants)})</h2>"
            + _table(
                "grants",
                ["user", "server / job", "kind", "profile", "pool", "node", "GPUs", "as", "since"],
                grant_rows(grants),
            )
            + f"<h2>Waiting requests ({len(queue)})</h2>"
            + _table(
                "queue",
                [
                    "position",
                    "user",
                    "pool",
                    "GPUs",
                    "priority",
                    "status",
                    "expected wait",
                    "since",
                ],
                queue_rows(queue),
            )
            + event_tables(events)
            + f"<h2>Members</h2>{members}</div>"
            + f"<script>{LOCAL_TIMES_JS}</script>"
        )


class TeamListPage(PageHandler):
    """``<prefix>team/``: the teams the caller administers (straight to the one, if one)."""

    @logged_in_page
    def get(self) -> None:
        teams = teams_administered(self.ctx.broker.policy, self.identity)
        if not teams:
            raise BrokerError(
                403,
                f"{self.identity.name} is not an admin of any team (the "
                "teams' admins are named in the policy)",
            )
        if len(teams) == 1:
            self.redirect(f"{self.prefix}team/{quote(teams[0], safe='')}")
            return
        items = "".join(
            f'<li><a href="{_e(self.prefix)}team/{_e(quote(t, safe=""))}">{_e(t)}</a></li>'
            for t in teams
        )
        self.page("Your teams", f'<ul id="team-list">{items}</ul>')


class HomePage(PageHandler):
    """``<prefix>home``: the Services menu's landing: admins to the admin page, team admins
    to their team's page, everyone else a 403 page."""

    @logged_in_page
    def get(self) -> None:
        if self.identity.admin:
            self.redirect(self.prefix + "admin/")
            return
        if teams_administered(self.ctx.broker.policy, self.identity):
            self.redirect(self.prefix + "team/")
            return
        raise BrokerError(
            403,
            f"{self.identity.name} is neither a gpushare admin nor an "
            "admin of a team: there is no page here for you",
        )


def team_routes(prefix: str, ctx: Any) -> list[tuple[str, type, dict[str, Any]]]:
    """The team pages and the menu's landing (browser login must be on)."""
    kw = {"ctx": ctx}
    return [
        (prefix + "home", HomePage, kw),
        (prefix + "team/?", TeamListPage, kw),
        (prefix + "team/([^/]+)", TeamPage, kw),
    ]


__all__ = [
    "HomePage",
    "TeamListPage",
    "TeamPage",
    "require_team",
    "team_events",
    "team_routes",
    "teams_administered",
]
