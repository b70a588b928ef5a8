"""The broker's service: one in-memory ``ClusterState`` mirrored by the database.

:class:`Broker` holds the parts of the service, each owning its state (:mod:`.parts` says
which owns what), one concept per module:

* :mod:`.lifecycle`: submit, decide, write, apply; the queue, preemption, release (what
  the broker itself does: functions over its parts, called by the methods below);
* :mod:`.writes`: the database handles and the group commits (``broker.writes``);
* :mod:`.ledger`: GPU-hours of the month and of any period (``broker.ledger``);
* :mod:`.heartbeats`: heartbeats and measured use (``broker.heartbeats``);
* :mod:`.waiting` and :mod:`.holders`: the queue, preempting requests, each holder's ids;
* :mod:`.views`: the JSON answers (``broker.views``);
* :mod:`.consistency`: memory against database (``broker.checks``);
* :mod:`.policy_change`: a new policy put in force;

and does the start (:meth:`Broker.load`: the state is rebuilt from the live grants in the
database, which is how a ``kill -9`` loses nothing that was answered) and node cordons.
Errors, ids, effects and row builders are re-exported from here.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from sqlalchemy import Engine, select

from ...core.admission import AdmissionFacts
from ...core.grant_end import GrantEnd
from ...core.model import Grant, Policy, Request
from ...core.state import CapacityError, ClusterState
from ..errors import BrokerError
from ..store import fastsql, livegrants
from ..store.commitpipe import CommitPipeline
from ..store.db import migrate, nodes_table, requests_table
from ..store.serial import gpu_index, make_request, request_row, spec_to_request
from . import change_rows, lifecycle, policy_change
from .consistency import ConsistencyChecks
from .effects import Effects, NoEffects, NoObserver, Observer
from .heartbeats import HeartbeatBounds, Heartbeats
from .holders import Holders
from .ids import new_id
from .ledger import Ledger
from .ledger_month import MonthLedger
from .limits import BrokerLimits
from .usage import UseRecorder
from .views import Views
from .waiting import LIVE_STATUSES, Pending, WaitQueue
from .writes import Writes

log = logging.getLogger("gpushare.broker")


class Broker:
    """Owner of all grants: in-memory core state plus its database mirror."""

    def __init__(
        self,
        policy: Policy,
        engine: Engine,
        *,
        clock: Callable[[], float] = time.time,
        effects: Effects | None = None,
        observer: Observer | None = None,
        raw_sql: bool = True,
        checkpoint_interval_s: float = 1.0,
        wal_restart_bytes: int = 0,
        limits: BrokerLimits | None = None,
    ) -> None:
        self.policy = policy
        self.engine = engine
        self.clock = clock
        self.effects: Effects = effects or NoEffects()
        self.observer: Observer = observer or NoObserver()
        self.limits = limits or BrokerLimits()
        # the state and the policy in force (the lifecycle and a policy change replace them)
        self.state = ClusterState(policy)
        self.gpus = gpu_index(policy)
        self.policy_version = ""  # hash of the policy file's text (see .reload); "" in-process
        self.loaded = False
        # re-deciding the queue skips requests of a shape that just stayed queued
        # (False: decide on every queued request, as before; benchmarks/broker.py --queued)
        self.drain_skips_same_shape = True
        # the lifecycle's: waiting requests and preemptions
        self.queue = WaitQueue(self._priority_value)  # queued batch requests, decision order
        self.pending: dict[str, Pending] = {}  # preempting requests by id
        self.preempt_info: dict[str, tuple[str, float]] = {}  # victim grant -> (reason, deadline)
        self.holders = Holders()  # (kind, user, holder) -> live grant and waiting request ids
        # notices given to live grants, and the idle culler's grants being stopped
        self.policy_notices: dict[str, dict[str, Any]] = {}  # grant -> made borrowed by policy
        self.cull_notices: dict[str, dict[str, Any]] = {}  # grant -> the idle culler's warning
        self.culling: dict[str, str] = {}  # grant -> the culler's reason while it stops it
        # collaborators, each owning its state
        self.writes = Writes(
            engine,
            raw_sql=raw_sql,
            checkpoint_interval_s=checkpoint_interval_s,
            wal_restart_bytes=wal_restart_bytes,
        )
        self.ledger = Ledger(engine, clock)
        self.heartbeats = Heartbeats(engine, clock, self.limits)
        self.checks = ConsistencyChecks(engine)
        self.views = Views(self)

    def _priority_value(self, name: str) -> int:
        priority = self.policy.priority(name)
        return priority.value if priority is not None else 0

    # -- the public interface: the lifecycle (lifecycle.py) -----------------------------------

    def submit(self, req: Request, *, idempotency_key: str | None = None) -> dict[str, Any]:
        return lifecycle.submit(self, req, idempotency_key=idempotency_key)

    def refuse(
        self,
        req: Request,
        reason: str,
        code: str,
        idempotency_key: str | None = None,
        status: str = "refused",
    ) -> dict[str, Any]:
        return lifecycle.refuse(self, req, reason, code, idempotency_key, status)

    def release(
        self,
        grant_id: str,
        reason: str = "released by holder",
        *,
        drain: bool = True,
        end: GrantEnd | None = None,
    ) -> bool:
        return lifecycle.release(self, grant_id, reason, drain=drain, end=end)

    def retry(self, request_id: str) -> str | None:
        return lifecycle.retry(self, request_id)

    def drain_queue(self, pool: str | None = None) -> list[tuple[str, str]]:
        return lifecycle.drain_queue(self, pool)

    def cancel(self, request_id: str) -> dict[str, Any] | None:
        return lifecycle.cancel(self, request_id)

    def facts(self, now: float, request: Request, retry: bool = False) -> AdmissionFacts:
        return lifecycle.facts(self, now, request, retry)

    def replace_policy(self, policy: Policy, version: str = "") -> list[dict[str, Any]]:
        return policy_change.replace_policy(self, policy, version)

    def ordered_queue(self, pool: str | None = None) -> list[Request]:
        return self.queue.ordered(pool)

    def held_by(self, kind: str, user: str, holder: str) -> set[str]:
        return self.holders.held_by(kind, user, holder)

    # -- the public interface: views (views.py), ledger, heartbeats, checks -------------------

    def get_grant(self, grant_id: str, durable: bool = False) -> dict[str, Any] | None:
        return self.views.get_grant(grant_id, durable)

    def grant_view(self, grant: Grant) -> dict[str, Any]:
        return self.views.grant_view(grant)

    def list_grants(
        self,
        *,
        user: str | None = None,
        team: str | None = None,
        pool: str | None = None,
        node: str | None = None,
    ) -> list[dict[str, Any]]:
        return self.views.list_grants(user=user, team=team, pool=pool, node=node)

    def get_request(self, request_id: str, durable: bool = False) -> dict[str, Any] | None:
        return self.views.get_request(request_id, durable)

    def list_requests(self, user: str | None = None, limit: int = 200) -> list[dict[str, Any]]:
        return self.views.list_requests(user, limit)

    def find_idempotent(self, user: str, key: str) -> dict[str, Any] | None:
        return self.views.find_idempotent(user, key)

    def position(self, req: Request) -> int | None:
        return self.views.position(req)

    def expected_wait(self, req: Request, now: float) -> float | None:
        return self.views.expected_wait(req, now)

    def queue_view(self, limit: int | None = None, offset: int = 0) -> list[dict[str, Any]]:
        return self.views.queue_view(limit, offset)

    def notices(self, user: str | None = None, grant_id: str | None = None) -> list[dict[str, Any]]:
        return self.views.notices(user, grant_id)

    def team_usage(self, team_name: str) -> dict[str, Any]:
        return self.views.team_usage(team_name)

    def profiles_view(self, teams: tuple[str, ...], user: str = "") -> list[dict[str, Any]]:
        return self.views.profiles_view(teams, user)

    def month_hours(self, now: float) -> MonthLedger:
        """The month's running GPU-hours per (team, pool) (rebuilt at a new month)."""
        return self.ledger.month_at(now, self.state.grants)

    def gpu_hours_between(self, start: float, end: float) -> dict[Any, float]:
        return self.ledger.gpu_hours_between(start, end)

    def heartbeat(
        self,
        grant_id: str,
        ts: float | None,
        gpus: list[dict[str, Any]],
        simulated: bool,
        kernel_activity: float | None = None,
    ) -> None:
        self.heartbeats.accept(
            self.state.grants, self.gpus, grant_id, ts, gpus, simulated, kernel_activity
        )

    def measured_view(self, team: str, pool: str) -> dict[str, Any] | None:
        return self.heartbeats.measured_view(team, pool)

    def db_live_grants(self) -> list[Grant]:
        return self.checks.db_live_grants()

    # -- the public interface: writes (writes.py) ---------------------------------------------

    async def durable(self, everything: bool = False) -> None:
        await self.writes.durable(everything)

    def ensure_durable(self) -> None:
        self.writes.ensure_durable()

    def reading_committed(self) -> AbstractContextManager[None]:
        return self.writes.reading_committed()

    def unsettled_answer(self, user: str, key: str) -> dict[str, Any] | None:
        return self.writes.unsettled_answer(user, key)

    # -- attributes callers read, where their owner keeps them --------------------------------

    @property
    def fast(self) -> fastsql.FastWriter | None:
        return self.writes.fast

    @property
    def commits(self) -> CommitPipeline | None:
        return self.writes.commits

    @property
    def usage(self) -> UseRecorder:
        return self.heartbeats.usage

    @property
    def last_heartbeat(self) -> dict[str, dict[str, Any]]:
        return self.heartbeats.last

    @property
    def heartbeat_bounds(self) -> HeartbeatBounds:
        return self.heartbeats.bounds

    @heartbeat_bounds.setter
    def heartbeat_bounds(self, bounds: HeartbeatBounds) -> None:
        self.heartbeats.bounds = bounds

    # -- start --------------------------------------------------------------------------------

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
                        self.holders.hold(grant.request, gid)
                    except (CapacityError, KeyError, ValueError) as exc:
                        why = f"no longer fits the policy: {exc}"
                if why:
                    change_rows.close_grant_rows(conn, gid, row[livegrants.REQUEST_ID], now, why)
                    changes.append(f"released grant {gid} of {row[livegrants.USERNAME]}: {why}")
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
            self.holders.hold(req, req.id)
            if row.status == "queued":
                self.queue[req.id] = req
            else:
                self.pending[req.id] = Pending(req, set(), 0.0, row.reason)
        for victim, (request_id, reason, deadline) in marks.items():
            pend = self.pending.get(request_id)
            if pend is None:
                lifecycle.clear_marks(self, [victim])
                changes.append(f"cleared a stale preemption notice on grant {victim}")
                continue
            pend.victims.add(victim)
            pend.deadline = max(pend.deadline, deadline)
            self.state.preempting[victim] = request_id
            self.preempt_info[victim] = (reason, deadline)
        self.ledger.reset(now, self.state.grants.values())
        self.heartbeats.load_measured()
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
        """Commit the fast-path writes in groups from now on (:meth:`.writes.Writes.start`);
        after a failed commit the state is rebuilt from the database."""
        self.writes.start(loop, mode, self._after_failed_commit)

    def close(self) -> None:
        """Commit what is queued, then close the fast-path connection (and its threads)."""
        self.writes.close()

    def _after_failed_commit(self) -> None:
        """Rebuild the state from the database after a failed commit, then accept writes
        again; while the database cannot be read, try again every second."""
        commits = self.writes.commits
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
            lifecycle.drain_queue(self, self.state.nodes[node].pool.name)
        live = [g.id for g in self.state.grants.values() if g.placement.node == node]
        return {"node": node, "cordoned": cordoned, "live_grants": live}

    # -- policy changes ---------------------------------------------------------------------


__all__ = [
    "LIVE_STATUSES",
    "Broker",
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
