"""The broker's service: one in-memory ``ClusterState`` mirrored by the database.

:class:`Broker` combines the parts of the service, one concept per module:

* :mod:`.base`: the data (state, queue, pending preemptions, database handles);
* :mod:`.lifecycle`: submit, decide, write, apply; the queue, preemption, release;
* :mod:`.views`: the JSON answers (grants, requests, queue, notices, usage, profiles);
* :mod:`.ledger`: GPU-hours of the month and of any period;
* :mod:`.consistency`: memory against database;

and adds the start (:meth:`Broker.load`: the state is rebuilt from the live grants in the
database, which is how a ``kill -9`` loses nothing that was answered), node cordons and
heartbeats. Errors, ids, effects and row builders are re-exported from here.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import logging
from collections import defaultdict
from typing import Any

from sqlalchemy import event, select

from ...core.grant_end import EndKind, GrantEnd
from ...core.model import Grant, Policy, from_milli
from ...core.state import CapacityError, ClusterState
from ..errors import BrokerError
from ..store import livegrants
from ..store.commitasync import AsyncCommits
from ..store.commitloop import LoopCommits
from ..store.commitpipe import ThreadCommits
from ..store.db import grants_table, migrate, nodes_table, requests_table
from ..store.serial import (
    gpu_index,
    iso,
    make_request,
    request_row,
    spec_to_request,
)
from .base import LIVE_STATUSES, BrokerBase, Pending
from .consistency import ConsistencyMixin
from .effects import Effects, NoEffects, NoObserver, Observer
from .heartbeats import HeartbeatsMixin
from .ids import new_id
from .ledger_month import MonthLedger
from .lifecycle import LifecycleMixin

log = logging.getLogger("gpushare.broker")


class Broker(LifecycleMixin, HeartbeatsMixin, ConsistencyMixin):
    """Owner of all grants: in-memory core state plus its database mirror."""

    # -- start ------------------------------------------------------------------------------

    def load(self) -> list[str]:
        """Migrate the database and rebuild the state from it; return what was changed.

        The garbage collector is paused meanwhile: the rebuild allocates about ten objects
        per live grant and none that form cycles, and the collections that this would
        trigger scan every object alive again and again (half of the CPU time at 100,000
        grants). The caller may ``gc.freeze()`` what was loaded (``BrokerApp.gc_freeze``)."""
        enabled = gc.isenabled()
        gc.disable()
        try:
            return self._load()
        finally:
            if enabled:
                gc.enable()

    def _load(self) -> list[str]:
        migrate(self.engine)
        changes: list[str] = []
        now = self.clock()
        state = self.state
        if state.version or state.grants or state.preempting or state.policy is not self.policy:
            self.state = ClusterState(self.policy)  # else: the new one __init__ built (0.25 s)
        self.queue.clear()
        self.pending.clear()
        self.holders.clear()
        self.preempt_info.clear()
        with self.engine.begin() as conn:
            for node in conn.execute(select(nodes_table)):
                if node.name in self.state.nodes and node.cordoned:
                    self.state.cordon(node.name, True)
            rows = livegrants.fetch(conn)  # the driver's cursor: 100,000 rows on a big site
            marks: dict[str, tuple[str, str, float]] = {}
            for row, grant, unreadable in livegrants.read(rows):
                gid = row[livegrants.ID]
                why = unreadable
                if grant is not None:
                    try:
                        self.state.apply(grant)
                        self.hold(grant.request, gid)
                    except (CapacityError, KeyError, ValueError) as exc:
                        why = f"no longer fits the policy: {exc}"
                if why:
                    self._close_grant_rows(conn, gid, row[livegrants.REQUEST_ID], now, why)
                    changes.append(
                        f"released grant {gid} of {row[livegrants.USERNAME]}: {why}"
                    )
                    continue
                if row[livegrants.PREEMPT_FOR]:
                    marks[gid] = (
                        row[livegrants.PREEMPT_FOR],
                        row[livegrants.PREEMPT_REASON] or "",
                        row[livegrants.PREEMPT_DEADLINE] or now,
                    )
            waiting = list(
                conn.execute(
                    select(requests_table)
                    .where(requests_table.c.status.in_(LIVE_STATUSES))
                    .order_by(requests_table.c.created_at, requests_table.c.id)
                )
            )
        for row in waiting:
            req = spec_to_request(row.spec)
            self.hold(req, req.id)
            if row.status == "queued":
                self.queue[req.id] = req
            else:
                self.pending[req.id] = Pending(req, set(), 0.0, row.reason)
        for victim, (request_id, reason, deadline) in marks.items():
            pend = self.pending.get(request_id)
            if pend is None:
                self._clear_marks([victim])
                changes.append(f"cleared a stale preemption notice on grant {victim}")
                continue
            pend.victims.add(victim)
            pend.deadline = max(pend.deadline, deadline)
            self.state.preempting[victim] = request_id
            self.preempt_info[victim] = (reason, deadline)
        self._reset_ledger(now)
        self.load_measured()
        self.loaded = True
        for pend in list(self.pending.values()):
            victims = [self.state.grants[v] for v in pend.victims if v in self.state.grants]
            if victims:
                self.effects.preemption_planned(pend.request.id, victims, pend.deadline)
            else:
                self.effects.retry_soon(pend.request.id)
        for line in changes:
            log.warning("start: %s", line)
        return changes

    # -- commits off the loop's path ---------------------------------------------------------

    def start_commits(self, loop: asyncio.AbstractEventLoop, mode: str = "thread") -> None:
        """Commit the fast-path writes in groups from now on, on a writer thread
        (``thread``, :mod:`.commitpipe`), on ``loop`` without waiting (``async``,
        PostgreSQL only, :mod:`.commitasync`) or on ``loop`` right after the turn that queued
        them (``loop``, :mod:`.commitloop`); every SQLAlchemy transaction on the engine
        first waits for the queue to be empty."""
        if self.fast is None:
            raise ValueError("group commits need the fast path (raw_sql)")
        if self.commits is not None:
            return
        if mode == "async":
            if self.engine.dialect.name != "postgresql":
                raise ValueError(f"async commits need PostgreSQL, not {self.engine.dialect.name}")
            self.commits = AsyncCommits(self.fast, loop, self._after_failed_commit)
        elif mode == "thread":
            self.commits = ThreadCommits(self.fast, loop, self._after_failed_commit)
        elif mode == "loop":
            self.commits = LoopCommits(self.fast, loop, self._after_failed_commit)
        else:
            raise ValueError(f"unknown commit mode {mode!r} (thread, async, loop)")
        event.listen(self.engine, "begin", self._wait_for_commits)

    def _wait_for_commits(self, conn: object) -> None:
        commits = self.commits
        if commits is not None:
            commits.flush()

    def close(self) -> None:
        if self.commits is not None:
            event.remove(self.engine, "begin", self._wait_for_commits)
        super().close()

    def _after_failed_commit(self) -> None:
        """Rebuild the state from the database after a failed commit, then accept writes
        again; while the database cannot be read, try again every second."""
        commits = self.commits
        if commits is None:
            return
        try:
            with commits.bypass():
                with self.engine.connect() as conn:  # reachable? (else keep memory as is)
                    conn.exec_driver_sql("SELECT 1")
                self.load()
        except Exception as exc:
            log.error("commits: cannot rebuild the state from the database yet: %s", exc)
            commits.loop.call_later(1.0, self._after_failed_commit)
            return
        commits.resume()

    # -- nodes ------------------------------------------------------------------------------

    def set_cordon(
        self, node: str, cordoned: bool, *, broker_drain: str | None = None
    ) -> dict[str, Any]:
        """Drain (``cordoned``) or resume ``node``. ``broker_drain``: why the broker itself
        drains it (the job loop, a run was lost with it), kept in the node's row so it is
        resumed once the engine has it back (:mod:`.node_return`); every other write (an
        admin's drain or resume, the broker's resume) clears it."""
        if node not in self.state.nodes:
            raise BrokerError(404, f"unknown node {node!r}")
        now = self.clock()
        drain = broker_drain if cordoned else None
        with self.engine.begin() as conn:
            updated = conn.execute(
                nodes_table.update()
                .where(nodes_table.c.name == node)
                .values(cordoned=cordoned, updated_at=now, broker_drain=drain)
            ).rowcount
            if not updated:
                conn.execute(
                    nodes_table.insert().values(
                        name=node, cordoned=cordoned, updated_at=now, broker_drain=drain
                    )
                )
        self.state.cordon(node, cordoned)
        if not cordoned:
            self.drain_queue(self.state.nodes[node].pool.name)
        live = [g.id for g in self.state.grants.values() if g.placement.node == node]
        return {"node": node, "cordoned": cordoned, "live_grants": live}

    # -- policy changes ---------------------------------------------------------------------

    def replace_policy(self, policy: Policy, version: str = "") -> list[dict[str, Any]]:
        """Put ``policy`` in force for the live grants, the queue and new requests; return
        what happened to each grant it no longer allows (see ``docs/policy-reload.md``):

        * a grant on hardware (node, GPU) or in a pool that left the inventory, or that no
          longer fits it: released, with the reason;
        * a grant whose team, team quota in the pool, profile (or its team list) or priority
          class the policy no longer has: kept, but borrowed and preemptible, with a notice;
        * grants above a guarantee that was cut below the team's use: the newest ones are
          kept as borrowed and preemptible, with a notice, until the rest fits the guarantee.

        Borrow limits, per-user caps and budgets apply to new requests only. Runs on the
        event loop (no await); the database is written before memory changes."""
        now = self.clock()
        changes: list[dict[str, Any]] = []
        grants = sorted(self.state.grants.values(), key=lambda g: (g.granted_at, g.id))
        scratch = ClusterState(policy)
        kept: list[Grant] = []
        for grant in grants:
            try:
                scratch.apply(grant)
                kept.append(grant)
            except (CapacityError, KeyError, ValueError) as exc:
                why = f"released: the new policy has no room for it ({exc})"
                lost = grant.placement.node not in {n.name for n in policy.nodes}
                kind = EndKind.NODE_LOST if lost else EndKind.POLICY
                self.release(grant.id, why, drain=False, end=GrantEnd(kind, why))
                changes.append(_change(grant, "released", why))
        demote: dict[str, str] = {}
        for grant in kept:
            reason = _no_longer_allowed(policy, grant)
            if reason and not grant.borrowed:
                demote[grant.id] = reason
        inside: dict[tuple[str, str], list[Grant]] = defaultdict(list)
        for grant in kept:
            if not grant.borrowed and grant.id not in demote:
                inside[(grant.team, grant.pool)].append(grant)
        for (team_name, pool), members in inside.items():
            team = policy.team(team_name)
            quota = team.quota(pool) if team else None
            if quota is None:
                continue
            total = sum(g.units_milli for g in members)
            for grant in reversed(members):  # the newest become borrowed first
                if total <= quota.guaranteed_milli:
                    break
                demote[grant.id] = (
                    f"team {team_name}'s guarantee in pool {pool} is now "
                    f"{from_milli(quota.guaranteed_milli):g} GPU, below its use"
                )
                total -= grant.units_milli
        if demote:
            with self.engine.begin() as conn:
                conn.execute(
                    grants_table.update()
                    .where(grants_table.c.id.in_(list(demote)))
                    .values(borrowed=True, preemptible=True)
                )
        state = ClusterState(policy)
        for name, node in self.state.nodes.items():
            if node.cordoned and name in state.nodes:
                state.cordon(name, True)
        for grant in kept:
            if grant.id in demote:
                grant = dataclasses.replace(grant, borrowed=True, preemptible=True)
            state.apply(grant)
        for victim, request_id in self.state.preempting.items():
            if victim in state.grants:
                state.preempting[victim] = request_id
        self.policy, self.state, self.gpus = policy, state, gpu_index(policy)
        self.policy_version = version
        self.queue.reorder()
        for gid, why in demote.items():
            grant = state.grants[gid]
            notice = {
                "grant_id": gid,
                "user": grant.user,
                "server": grant.request.holder,
                "kind": "policy",
                "holder_kind": grant.request.kind.value,
                "reason": f"{why}: the grant is now borrowed (preemptible) capacity",
                "deadline": None,
                "deadline_ts": None,
                "policy_version": version,
                "at": iso(now),
            }
            self.policy_notices[gid] = notice
            self.effects.notice(notice)
            changes.append(_change(grant, "borrowed", why))
        for gid in [g for g in self.policy_notices if g not in state.grants]:
            del self.policy_notices[gid]
        for line in changes:
            log.warning(
                "policy change: grant %s of %s %s: %s",
                line["grant_id"],
                line["user"],
                line["change"],
                line["reason"],
            )
        self.drain_queue()
        return changes


def _change(grant: Grant, change: str, reason: str) -> dict[str, Any]:
    return {
        "grant_id": grant.id,
        "user": grant.user,
        "server": grant.request.holder,
        "team": grant.team,
        "pool": grant.pool,
        "change": change,
        "reason": reason,
    }


def _no_longer_allowed(policy: Policy, grant: Grant) -> str | None:
    """Why the policy would not let this grant's request in now (team, profile, priority)."""
    req = grant.request
    team = policy.team(req.team)
    if team is None:
        return f"team {req.team} is no longer in the policy"
    if team.quota(req.pool) is None:
        return f"team {req.team} no longer has a quota in pool {req.pool}"
    if policy.priority(req.priority) is None or not team.may_use_priority(req.priority):
        return f"priority class {req.priority} is no longer allowed for team {req.team}"
    if req.profile:
        profile = policy.profile(req.profile)
        if profile is None:
            return f"profile {req.profile} is no longer in the policy"
        if not profile.allowed_for({req.team}):
            return f"profile {req.profile} is no longer offered to team {req.team}"
    return None


__all__ = [
    "LIVE_STATUSES",
    "Broker",
    "BrokerBase",
    "BrokerError",
    "Effects",
    "MonthLedger",
    "NoEffects",
    "NoObserver",
    "Observer",
    "Pending",
    "make_request",
    "new_id",
    "request_row",
]
