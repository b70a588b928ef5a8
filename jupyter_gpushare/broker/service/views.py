"""Read-only views of the broker's state as the JSON of the REST API.

Grants, requests, the queue, notices, team usage and the profiles a user may pick; nothing
here changes the state or writes to the database. :class:`Views` owns no state: it reads
what :class:`ViewSource` names (the broker is one).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import replace
from typing import Any, Protocol

from sqlalchemy import select

from ...core.admission import AdmissionFacts, Decision, Outcome, decide
from ...core.grant_end import kind_of
from ...core.model import Grant, Policy, Request, from_milli
from ...core.placement import place
from ...core.state import ClusterState
from ..errors import BrokerError
from ..store.db import grants_table, requests_table
from ..store.serial import gpus_json, iso, slices_to_json, spec_to_request
from .heartbeats import Heartbeats
from .ledger import Ledger
from .waiting import Pending, WaitQueue
from .writes import Writes


def end_view(row: Any) -> dict[str, Any] | None:
    """The end record of a grant row (``None`` while it lives); rows closed before the
    record existed and never migrated read their kind from the reason."""
    if row.released_at is None:
        return None
    kind = kind_of(row.end_kind, row.release_reason).value
    return {"kind": kind, "by_request": row.ended_by_request, "by_team": row.ended_by_team}


class ViewSource(Protocol):
    """What the views read (the broker's state and parts; all read-only here)."""

    policy: Policy
    state: ClusterState
    gpus: dict[str, Any]  # the policy's GPUs by uuid
    policy_version: str
    clock: Callable[[], float]
    queue: WaitQueue
    pending: dict[str, Pending]
    preempt_info: dict[str, tuple[str, float]]
    policy_notices: dict[str, dict[str, Any]]
    cull_notices: dict[str, dict[str, Any]]
    ledger: Ledger
    heartbeats: Heartbeats
    writes: Writes

    def facts(self, now: float, request: Request, retry: bool = False) -> AdmissionFacts:
        """The admission's facts (the lifecycle's), for the profiles' dry run."""
        ...


class Views:
    """The API's answers about grants, requests, the queue, notices, usage and profiles."""

    def __init__(self, src: ViewSource) -> None:
        self.src = src

    def notice_of(self, grant_id: str) -> dict[str, Any]:
        grant = self.src.state.grants[grant_id]
        reason, deadline = self.src.preempt_info[grant_id]
        return {
            "grant_id": grant_id,
            "user": grant.user,
            "server": grant.request.holder,
            "kind": "preemption",
            "holder_kind": grant.request.kind.value,
            "reason": reason,
            "deadline": iso(deadline),
            "deadline_ts": deadline,
            "for_request": self.src.state.preempting.get(grant_id),
        }

    def notices(self, user: str | None = None, grant_id: str | None = None) -> list[dict[str, Any]]:
        out = []
        for gid in list(self.src.preempt_info):
            if gid not in self.src.state.grants:
                continue
            if grant_id and gid != grant_id:
                continue
            if user and self.src.state.grants[gid].user != user:
                continue
            out.append(self.notice_of(gid))
        for gid, notice in list(
            self.src.policy_notices.items()
        ):  # made borrowed by a policy change
            if gid not in self.src.state.grants or (grant_id and gid != grant_id):
                continue
            if user and notice["user"] != user:
                continue
            out.append(notice)
        for gid, notice in list(self.src.cull_notices.items()):  # the GPU idle culler's warnings
            if gid not in self.src.state.grants or (grant_id and gid != grant_id):
                continue
            if user and notice["user"] != user:
                continue
            out.append(notice)
        return out

    def grant_view(self, grant: Grant) -> dict[str, Any]:
        req = grant.request
        info = self.src.preempt_info.get(grant.id)
        return {
            "id": grant.id,
            "request_id": req.id,
            "user": req.user,
            "server": req.holder,
            "team": req.team,
            "pool": req.pool,
            "profile": req.profile,
            "kind": req.kind.value,
            "node": grant.placement.node,
            "gpus": gpus_json(self.src.gpus, slices_to_json(grant.placement)),
            "units": from_milli(grant.units_milli),
            "borrowed": grant.borrowed,
            "preemptible": grant.preemptible,
            "priority": req.priority,
            "priority_value": grant.priority_value,
            "cpu_milli": req.cpu_milli,
            "memory_mib": req.memory_mib,
            "granted_at": iso(grant.granted_at),
            **self._lifetime(req.profile, grant.granted_at),
            "grace_period_s": grant.grace_period_s,
            "released_at": None,
            "release_reason": None,
            "end": None,
            "preemption": {"reason": info[0], "deadline": iso(info[1])} if info else None,
            "usage": self.src.heartbeats.last.get(grant.id),
        }

    def _lifetime(self, profile_slug: str | None, granted_at: float | None) -> dict[str, Any]:
        """The profile's ``max_lifetime_s`` and when the server is stopped for it
        (``ends_at``, ISO 8601); both null when the profile (now) sets no lifetime."""
        profile = self.src.policy.profile(profile_slug) if profile_slug else None
        lifetime = profile.max_lifetime_s if profile is not None else None
        ends = granted_at + lifetime if lifetime and granted_at is not None else None
        return {"max_lifetime_s": lifetime or None, "ends_at": iso(ends)}

    def _grant_view_row(self, row: Any) -> dict[str, Any]:
        spec = row.spec
        return {
            "id": row.id,
            "request_id": row.request_id,
            "user": row.username,
            "server": row.server,
            "team": row.team,
            "pool": row.pool,
            "profile": row.profile,
            "kind": row.kind,
            "node": row.node,
            "gpus": gpus_json(self.src.gpus, row.slices),
            "units": from_milli(row.units_milli),
            "borrowed": bool(row.borrowed),
            "preemptible": bool(row.preemptible),
            "priority": row.priority,
            "priority_value": row.priority_value,
            "cpu_milli": spec.get("cpu_milli", 0),
            "memory_mib": spec.get("memory_mib", 0),
            "granted_at": iso(row.granted_at),
            **self._lifetime(row.profile, row.granted_at),
            "grace_period_s": row.grace_period_s,
            "released_at": iso(row.released_at),
            "release_reason": row.release_reason,
            "end": end_view(row),
            "preemption": None,
            "usage": None,
        }

    def get_grant(self, grant_id: str, durable: bool = False) -> dict[str, Any] | None:
        """A live grant from memory, else as the database has it (``durable``: see
        :meth:`get_request`)."""
        grant = self.src.state.grants.get(grant_id)
        if grant is not None:
            return self.grant_view(grant)
        with (
            self.src.writes.reading_committed() if durable else nullcontext(),
            self.src.writes.engine.connect() as conn,
        ):
            row = conn.execute(select(grants_table).where(grants_table.c.id == grant_id)).first()
        return self._grant_view_row(row) if row else None

    def list_grants(
        self,
        *,
        user: str | None = None,
        team: str | None = None,
        pool: str | None = None,
        node: str | None = None,
    ) -> list[dict[str, Any]]:
        out = []
        for grant in self.src.state.grants.values():
            if user is not None and grant.user != user:
                continue
            if team is not None and grant.team != team:
                continue
            if pool is not None and grant.pool != pool:
                continue
            if node is not None and grant.placement.node != node:
                continue
            out.append(self.grant_view(grant))
        return out

    def position(self, req: Request) -> int | None:
        """1-based place of a queued request in its pool's order (``None``: not queued)."""
        return self.src.queue.position(req.id)

    def expected_wait(self, req: Request, now: float) -> float | None:
        pend = self.src.pending.get(req.id)
        if pend is not None:
            return max(0.0, pend.deadline - now)
        if req.id not in self.src.queue:
            return None
        end = self._earliest_end(req.pool)
        return max(0.0, end - now) if end is not None else None

    def _earliest_end(self, pool: str) -> float | None:
        """The earliest end of a grant in the pool that declared a maximum runtime."""
        ends = [
            g.granted_at + g.request.max_runtime_s
            for g in self.src.state.grants.values()
            if g.pool == pool and g.request.max_runtime_s
        ]
        return min(ends) if ends else None

    def from_decision(
        self, req: Request, decision: Decision, status: str, grant: Grant | None, now: float
    ) -> dict[str, Any]:
        return {
            "request_id": req.id,
            "status": status,
            "reason": decision.reason,
            "code": decision.code,
            "user": req.user,
            "server": req.holder,
            "team": req.team,
            "pool": req.pool,
            "profile": req.profile,
            "kind": req.kind.value,
            "position": self.position(req),
            "expected_wait_s": self.expected_wait(req, now),
            "deadline": self.reclaim_deadline(req.id),
            "grant_id": grant.id if grant else None,
            "grant": self.grant_view(grant) if grant else None,
            "victims": list(decision.victims) if decision.outcome is Outcome.PREEMPTING else [],
            "created_at": iso(now),
            "policy_version": self.src.policy_version,
        }

    def reclaim_deadline(self, request_id: str) -> str | None:
        """When a preempting request's victims are stopped (their notices' deadline)."""
        pend = self.src.pending.get(request_id)
        return iso(pend.deadline) if pend is not None else None

    def _request_view(self, row: Any) -> dict[str, Any]:
        req = spec_to_request(row.spec)
        now = self.src.clock()
        grant = self.get_grant(row.grant_id, durable=True) if row.grant_id else None
        pend = self.src.pending.get(row.id)
        return {
            "request_id": row.id,
            "status": row.status,
            "reason": row.reason,
            "code": row.code,
            "user": row.username,
            "server": row.server,
            "team": row.team,
            "pool": row.pool,
            "profile": row.profile,
            "kind": row.kind,
            "position": self.position(req),
            "expected_wait_s": self.expected_wait(req, now),
            "deadline": self.reclaim_deadline(row.id),
            "grant_id": row.grant_id,
            "grant": grant,
            "victims": sorted(pend.victims) if pend else [],
            "created_at": iso(row.created_at),
            "policy_version": self.src.policy_version,
        }

    def get_request(self, request_id: str, durable: bool = False) -> dict[str, Any] | None:
        """The request as the database has it. ``durable``: read what is committed without
        waiting for the commit queue (a client's poll: everything it was answered is
        committed already); else the read waits for the queue first."""
        with (
            self.src.writes.reading_committed() if durable else nullcontext(),
            self.src.writes.engine.connect() as conn,
        ):
            row = conn.execute(
                select(requests_table).where(requests_table.c.id == request_id)
            ).first()
        return self._request_view(row) if row else None

    def queue_view(self, limit: int | None = None, offset: int = 0) -> list[dict[str, Any]]:
        """Waiting requests: the preempting ones, then the queued ones in decision order
        (``limit``/``offset``: a page of that list)."""
        now = self.src.clock()
        out: list[dict[str, Any]] = []
        ends: dict[str, float | None] = {}
        stop = None if limit is None else offset + limit
        for pend in list(self.src.pending.values())[offset:stop]:
            req = pend.request
            out.append(
                {
                    "request_id": req.id,
                    "user": req.user,
                    "team": req.team,
                    "pool": req.pool,
                    "status": "preempting",
                    "priority": req.priority,
                    "position": None,
                    "units": from_milli(req.gpu.units_milli),
                    "created_at": iso(req.created_at),
                    "expected_wait_s": max(0.0, pend.deadline - now),
                    "victims": sorted(pend.victims),
                }
            )
        skip = max(0, offset - len(self.src.pending))
        room = None if limit is None else limit - len(out)
        queued = self.src.queue.ordered()
        for req in queued[skip : None if room is None else skip + room]:
            if req.pool not in ends:
                ends[req.pool] = self._earliest_end(req.pool)
            end = ends[req.pool]
            out.append(
                {
                    "request_id": req.id,
                    "user": req.user,
                    "team": req.team,
                    "pool": req.pool,
                    "status": "queued",
                    "priority": req.priority,
                    "position": self.src.queue.position(req.id),
                    "units": from_milli(req.gpu.units_milli),
                    "created_at": iso(req.created_at),
                    "expected_wait_s": max(0.0, end - now) if end is not None else None,
                }
            )
        return out

    def team_usage(self, team_name: str) -> dict[str, Any]:
        team = self.src.policy.team(team_name)
        if team is None:
            raise BrokerError(404, f"unknown team {team_name!r}")
        now = self.src.clock()
        ledger = self.src.ledger.month_at(now, self.src.state.grants)
        pools: dict[str, Any] = {}
        for pool, quota in team.quotas:
            used = self.src.state.team_used(team.name, pool)
            others_borrowed = sum(
                v for (t, p), v in self.src.state.borrowed.items() if p == pool and t != team.name
            )
            lent = min(max(0, quota.guaranteed_milli - used), others_borrowed)
            pools[pool] = {
                "guaranteed": from_milli(quota.guaranteed_milli),
                "borrow_limit": from_milli(quota.borrow_limit_milli),
                "in_use": from_milli(used),
                "borrowed": from_milli(self.src.state.team_borrowed(team.name, pool)),
                "lent": from_milli(lent),
                "gpu_hours_month": round(ledger.hours((team.name, pool), now), 6),
                "gpu_hours_budget": quota.gpu_hours_per_month,
                "queued": self.src.queue.per_team_pool[(team.name, pool)],
                "measured": self.src.heartbeats.measured_view(team.name, pool),
            }
        year, month = ledger.month
        return {"team": team.name, "month": f"{year:04d}-{month:02d}", "pools": pools}

    def find_idempotent(self, user: str, key: str) -> dict[str, Any] | None:
        """The request made with this idempotency key, if any. With group commits, one
        whose commit is in flight is found in memory, so the read does not wait for it."""
        unsettled = self.src.writes.unsettled_answer(user, key)
        if unsettled is not None:
            return unsettled
        query = select(requests_table).where(
            requests_table.c.username == user, requests_table.c.idempotency_key == key
        )
        with self.src.writes.reading_committed(), self.src.writes.engine.connect() as conn:
            row = conn.execute(query).first()
        return self._request_view(row) if row else None

    def list_requests(self, user: str | None = None, limit: int = 200) -> list[dict[str, Any]]:
        with self.src.writes.engine.connect() as conn:
            query = select(requests_table).order_by(requests_table.c.created_at.desc()).limit(limit)
            if user is not None:
                query = query.where(requests_table.c.username == user)
            rows = list(conn.execute(query))
        return [self._request_view(r) for r in rows]

    def profiles_view(self, teams: tuple[str, ...], user: str = "") -> list[dict[str, Any]]:
        """Profiles of ``teams`` with each team's availability; with ``user``, also the
        admission's own answer for that user now (``decision``: a dry run of ``decide``,
        nothing stored), so the spawn form says exactly what a request would get."""
        now = self.src.clock()
        out = []
        for profile in self.src.policy.profiles_for(set(teams)):
            avail: dict[str, Any] = {}
            for team_name in teams:
                team = self.src.policy.team(team_name)
                if team is None or not self.src.policy.offers(profile, team_name):
                    continue
                quota = team.quota(profile.pool)
                if quota is None:
                    continue
                used = self.src.state.team_used(team_name, profile.pool)
                probe = Request(
                    id="probe",
                    user="",
                    team=team_name,
                    pool=profile.pool,
                    gpu=profile.gpu,
                    priority=profile.priority,
                    cpu_milli=profile.cpu_milli,
                    memory_mib=profile.memory_mib,
                    gpu_models=profile.gpu_models,
                )
                ask = profile.gpu.units_milli
                dry = None
                if user:
                    probe = replace(probe, user=user)
                    d = decide(
                        self.src.state, probe, "dry-run", self.src.facts(now, probe, retry=True)
                    )
                    dry = {
                        "outcome": d.outcome.value,
                        "reason": d.reason,
                        "code": d.code,
                        "borrowed": bool(d.grant.borrowed) if d.grant is not None else None,
                    }
                avail[team_name] = {
                    "guaranteed": from_milli(quota.guaranteed_milli),
                    "borrow_limit": from_milli(quota.borrow_limit_milli),
                    "in_use": from_milli(used),
                    "within_guarantee": used + ask <= quota.guaranteed_milli,
                    "within_borrow_limit": used + ask
                    <= quota.guaranteed_milli + quota.borrow_limit_milli,
                    "fits_now": place(self.src.state, probe) is not None,
                    **({"decision": dry} if dry is not None else {}),
                }
            gpu = profile.gpu
            out.append(
                {
                    "slug": profile.slug,
                    "display_name": profile.display_name,
                    "description": profile.description,
                    "pool": profile.pool,
                    "gpu": {
                        "count": gpu.whole,
                        "fraction": from_milli(gpu.fraction_milli),
                        "memory_mib": gpu.memory_mib,
                        "compute_pct": None
                        if gpu.compute_milli is None
                        else gpu.compute_milli / 10,
                        "describe": gpu.describe(),
                    },
                    "priority": profile.priority,
                    "cpu_milli": profile.cpu_milli,
                    "memory_mib": profile.memory_mib,
                    "image": profile.image,
                    "max_lifetime_s": profile.max_lifetime_s,
                    "teams": list(profile.teams),
                    "availability": avail,
                }
            )
        return out
