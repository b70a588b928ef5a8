"""The broker's transactional logic: one in-memory ``ClusterState`` mirrored by the database.

Every change follows the same pattern, with no ``await`` in between (so, on the tornado
loop, changes are serialised without a lock):

1. ask the pure core (``decide``) against the in-memory state;
2. write the outcome in **one** database transaction;
3. only after the commit, apply it to the in-memory state.

If the commit fails nothing is applied, so the state never holds what the database does
not. On start the state is rebuilt from the live grants in the database
(:meth:`Broker.load`), which is how a ``kill -9`` loses nothing that was answered.

Side effects that talk to the outside (stopping a hub server, preempting a batch job)
live in :mod:`.preempt`; this module only schedules them through :class:`Effects`.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from sqlalchemy import Engine, and_, bindparam, or_, select

from ..core.admission import AdmissionFacts, Decision, Outcome, decide
from ..core.ledger import Interval, gpu_hours, month_bounds, month_of
from ..core.model import UNIT, Grant, Kind, Policy, Request, from_milli
from ..core.placement import place
from ..core.state import CapacityError, ClusterState
from . import fastsql
from .db import grants_table, heartbeats_table, migrate, nodes_table, requests_table
from .serial import (
    gpu_index,
    gpus_json,
    grant_row,
    iso,
    request_to_spec,
    row_to_grant,
    slices_to_json,
    spec_to_request,
)

log = logging.getLogger("gpushare.broker")

LIVE_STATUSES = ("queued", "preempting")

# pre-built statements of the hot paths (parameters bound at execution: SQLAlchemy caches them)
_CLOSE_GRANT = (
    grants_table.update()
    .where(grants_table.c.id == bindparam("g_id"), grants_table.c.released_at.is_(None))
    .values(released_at=bindparam("g_released"), release_reason=bindparam("g_reason"))
)
_CLOSE_REQUEST = (
    requests_table.update()
    .where(requests_table.c.id == bindparam("r_id"))
    .values(status="released", updated_at=bindparam("r_updated"))
)



def _grant_and_victim_statements(
    grant: Grant | None, marks: list[tuple[str, str, str, float]], spec_json: str | None = None
) -> list[tuple[str, tuple[Any, ...]]]:
    """Fast-path statements that insert ``grant`` (if any) and mark preemption victims."""
    statements: list[tuple[str, tuple[Any, ...]]] = []
    if grant is not None:
        params = (
            fastsql.grant_params(grant_row(grant), spec_json)
            if spec_json is not None
            else fastsql.grant_params(grant_row(grant))
        )
        statements.append(("insert_grant", params))
    statements.extend(
        ("mark_victim", (for_id, why, deadline, vid)) for vid, for_id, why, deadline in marks
    )
    return statements


def request_row(
    req: Request, status: str, reason: str, code: str, grant_id: str | None,
    idempotency_key: str | None, now: float,
) -> dict[str, Any]:
    """The ``requests`` table row for ``req`` answered with ``status``."""
    return dict(
        id=req.id,
        username=req.user,
        server=req.holder,
        team=req.team,
        pool=req.pool,
        kind=req.kind.value,
        profile=req.profile,
        status=status,
        reason=reason,
        code=code,
        spec=request_to_spec(req),
        grant_id=grant_id,
        idempotency_key=idempotency_key,
        created_at=now,
        updated_at=now,
    )

class Effects(Protocol):
    """What the service asks the outside world to do (implemented in :mod:`.preempt`)."""

    def preemption_planned(
        self, request_id: str, victims: list[Grant], deadline: float
    ) -> None: ...

    def preemption_cancelled(self, request_id: str) -> None: ...

    def notice(self, notice: dict[str, Any]) -> None: ...

    def retry_soon(self, request_id: str) -> None: ...


class NoEffects:
    def preemption_planned(self, request_id: str, victims: list[Grant], deadline: float) -> None:
        pass

    def preemption_cancelled(self, request_id: str) -> None:
        pass

    def notice(self, notice: dict[str, Any]) -> None:
        pass

    def retry_soon(self, request_id: str) -> None:
        pass


class Observer(Protocol):
    def admission(self, pool: str, outcome: str, code: str) -> None: ...

    def preemption(self, reason: str, count: int) -> None: ...

    def release(self, reason: str) -> None: ...


class NoObserver:
    def admission(self, pool: str, outcome: str, code: str) -> None:
        pass

    def preemption(self, reason: str, count: int) -> None:
        pass

    def release(self, reason: str) -> None:
        pass


@dataclass
class Pending:
    """A request waiting for preemption victims to leave."""

    request: Request
    victims: set[str]
    deadline: float
    reason: str


@dataclass
class MonthLedger:
    """GPU-hours of the current UTC month per (team, pool), updated in O(1) per change.

    Closed intervals are summed once; live grants are kept as (sum of units, sum of
    units x start) so their hours up to ``now`` need no scan.
    """

    month: tuple[int, int] = (0, 0)
    start: float = 0.0
    closed: dict[tuple[str, str], float] = field(default_factory=lambda: defaultdict(float))
    live_units: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))
    live_unit_start: dict[tuple[str, str], float] = field(
        default_factory=lambda: defaultdict(float)
    )

    def add(self, grant: Grant) -> None:
        key = (grant.team, grant.pool)
        self.live_units[key] += grant.units_milli
        self.live_unit_start[key] += grant.units_milli * max(grant.granted_at, self.start)

    def remove(self, grant: Grant, ended: float) -> None:
        key = (grant.team, grant.pool)
        begin = max(grant.granted_at, self.start)
        self.live_units[key] -= grant.units_milli
        self.live_unit_start[key] -= grant.units_milli * begin
        self.closed[key] += grant.units_milli * max(0.0, ended - begin) / UNIT / 3600.0

    def hours(self, key: tuple[str, str], now: float) -> float:
        live = (
            (self.live_units.get(key, 0) * now - self.live_unit_start.get(key, 0.0)) / UNIT / 3600
        )
        return self.closed.get(key, 0.0) + max(0.0, live)


class BrokerError(Exception):
    """An error with an HTTP status for the handlers."""

    def __init__(self, status: int, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.field = field


def new_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(10)}"  # 20 random hex digits, as uuid4().hex[:20] was


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
    ) -> None:
        self.policy = policy
        self.engine = engine
        # hot-path writes through the driver (one transaction each); None: SQLAlchemy only
        self.fast: fastsql.FastWriter | None = (
            fastsql.FastWriter(engine, checkpoint_interval_s=checkpoint_interval_s)
            if raw_sql and fastsql.supported(engine)
            else None
        )
        self.clock = clock
        self.effects: Effects = effects or NoEffects()
        self.observer: Observer = observer or NoObserver()
        self.state = ClusterState(policy)
        self.gpus = gpu_index(policy)
        self.queue: dict[str, Request] = {}  # queued batch requests by id (insertion order)
        self.pending: dict[str, Pending] = {}  # preempting requests by id
        self.preempt_info: dict[str, tuple[str, float]] = {}  # victim grant -> (reason, deadline)
        self.last_heartbeat: dict[str, dict[str, Any]] = {}
        self.ledger = MonthLedger()
        self.loaded = False

    def close(self) -> None:
        """Close the fast-path connection (and its checkpoint thread)."""
        if self.fast is not None:
            self.fast.close()

    # -- start ------------------------------------------------------------------------------

    def load(self) -> list[str]:
        """Migrate the database and rebuild the state from it; return what was changed."""
        migrate(self.engine)
        changes: list[str] = []
        now = self.clock()
        self.state = ClusterState(self.policy)
        self.queue.clear()
        self.pending.clear()
        self.preempt_info.clear()
        with self.engine.begin() as conn:
            for row in conn.execute(select(nodes_table)):
                if row.name in self.state.nodes and row.cordoned:
                    self.state.cordon(row.name, True)
            rows = list(
                conn.execute(
                    select(grants_table)
                    .where(grants_table.c.released_at.is_(None))
                    .order_by(grants_table.c.granted_at, grants_table.c.id)
                )
            )
            marks: dict[str, tuple[str, str, float]] = {}
            for row in rows:
                try:
                    grant = row_to_grant(row)
                    self.state.apply(grant)
                except (CapacityError, KeyError, ValueError) as exc:
                    why = f"no longer fits the policy: {exc}"
                    self._close_grant_rows(conn, row.id, row.request_id, now, why)
                    changes.append(f"released grant {row.id} of {row.username}: {why}")
                    continue
                if row.preempt_for:
                    marks[row.id] = (
                        row.preempt_for,
                        row.preempt_reason or "",
                        row.preempt_deadline or now,
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

    def _reset_ledger(self, now: float) -> None:
        year, month = month_of(now)
        start, end = month_bounds(year, month)
        ledger = MonthLedger(month=(year, month), start=start)
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(
                    grants_table.c.id,
                    grants_table.c.team,
                    grants_table.c.pool,
                    grants_table.c.username,
                    grants_table.c.units_milli,
                    grants_table.c.granted_at,
                    grants_table.c.released_at,
                ).where(
                    grants_table.c.released_at.is_not(None),
                    grants_table.c.released_at > start,
                    grants_table.c.granted_at < end,
                )
            )
            intervals = [
                Interval(
                    r.id, r.team, r.pool, r.username, r.units_milli, r.granted_at, r.released_at
                )
                for r in rows
            ]
        for key, hours in gpu_hours(intervals, start, end, now).items():
            ledger.closed[key] = hours  # type: ignore[index]
        for grant in self.state.grants.values():
            ledger.add(grant)
        self.ledger = ledger

    def _month_hours(self, now: float) -> MonthLedger:
        if month_of(now) != self.ledger.month:
            self._reset_ledger(now)
        return self.ledger

    # -- admission --------------------------------------------------------------------------

    def facts(self, now: float, request: Request, retry: bool = False) -> AdmissionFacts:
        """What the core needs beyond the state; ``retry`` for a request decided before
        (placement then does not learn its shape a second time)."""
        ledger = self._month_hours(now)
        hours: dict[tuple[str, str], float] = {}
        key = (request.team, request.pool)
        hours[key] = ledger.hours(key, now)
        waiting: set[tuple[str, str]] = set()
        for other in self._waiting():
            if other.id == request.id or other.pool != request.pool:
                continue
            team = self.policy.team(other.team)
            quota = team.quota(other.pool) if team else None
            if quota is None:
                continue
            if (
                self.state.team_used(other.team, other.pool) + other.gpu.units_milli
                <= quota.guaranteed_milli
            ):
                waiting.add((other.team, other.pool))
        return AdmissionFacts(
            now=now, gpu_hours_used=hours, waiting_within_guarantee=frozenset(waiting),
            retry=retry,
        )

    def _waiting(self) -> Iterable[Request]:
        yield from self.queue.values()
        for pend in self.pending.values():
            yield pend.request

    def find_idempotent(self, user: str, key: str) -> dict[str, Any] | None:
        with self.engine.connect() as conn:
            row = conn.execute(
                select(requests_table).where(
                    requests_table.c.username == user, requests_table.c.idempotency_key == key
                )
            ).first()
        return self._request_view(row) if row else None

    def submit(self, req: Request, *, idempotency_key: str | None = None) -> dict[str, Any]:
        """Decide on a new request, write the outcome in one transaction, then apply it."""
        if idempotency_key:
            existing = self.find_idempotent(req.user, idempotency_key)
            if existing is not None:
                return existing
        now = self.clock()
        decision = decide(self.state, req, new_id("g"), self.facts(now, req))
        status, grant, victims, marks = self._outcome(req, decision, now)
        row = request_row(
            req, status, decision.reason, decision.code, grant.id if grant else None,
            idempotency_key, now,
        )
        if self.fast is not None:
            spec_json = fastsql.dumps(row["spec"])
            statements = [("insert_request", fastsql.request_params(row, spec_json))]
            statements += _grant_and_victim_statements(grant, marks, spec_json)
            self.fast.write(statements)
        else:
            with self.engine.begin() as conn:
                conn.execute(requests_table.insert(), row)
                if grant is not None:
                    conn.execute(grants_table.insert(), grant_row(grant))
                self._mark_victims(conn, marks)
        self._carry_out(req, decision, grant, victims, now)
        return self._view_from_decision(req, decision, status, grant, now)

    def _outcome(
        self, req: Request, decision: Decision, now: float
    ) -> tuple[str, Grant | None, list[Grant], list[tuple[str, str, str, float]]]:
        """Status, grant to apply, victims, and victim marks (id, for, why, deadline) to write.
        Checks the grant against the state before anything is written."""
        grant = decision.grant if decision.outcome is Outcome.GRANTED else None
        victims: list[Grant] = []
        if decision.outcome is Outcome.PREEMPTING:
            victims = [self.state.grants[v] for v in decision.victims]
        if grant is not None:
            self.state.check(grant)
        marks = [
            (victim.id, req.id, decision.reason, now + victim.grace_period_s)
            for victim in victims
            if victim.id not in self.state.preempting  # pending ones already count as gone
        ]
        return decision.outcome.value, grant, victims, marks

    def _carry_out(
        self, req: Request, decision: Decision, grant: Grant | None, victims: list[Grant],
        now: float,
    ) -> None:
        """Apply a written outcome to memory: the grant, the queue or the preemption."""
        self.observer.admission(req.pool, decision.outcome.value, decision.code)
        if grant is not None:
            self.state.apply(grant)
            self.ledger.add(grant)
        elif decision.outcome is Outcome.QUEUED:
            self.queue[req.id] = req
        elif decision.outcome is Outcome.PREEMPTING:
            self._start_preemption(req, decision, victims, now)

    @staticmethod
    def _mark_victims(conn: Any, marks: list[tuple[str, str, str, float]]) -> None:
        for victim_id, for_id, why, deadline in marks:
            conn.execute(
                grants_table.update()
                .where(grants_table.c.id == victim_id)
                .values(preempt_for=for_id, preempt_reason=why, preempt_deadline=deadline)
            )

    def refuse(
        self,
        req: Request,
        reason: str,
        code: str,
        idempotency_key: str | None = None,
        status: str = "refused",
    ) -> dict[str, Any]:
        """Record a request answered without the core: the user is in no team (refused), or
        it asks for no GPU at all (status ``granted``, code ``no_gpu``, no grant)."""
        now = self.clock()
        with self.engine.begin() as conn:
            conn.execute(
                requests_table.insert(),
                request_row(req, status, reason, code, None, idempotency_key, now),
            )
        self.observer.admission(req.pool, status, code)
        return self._view_from_decision(
            req, Decision(Outcome(status), reason, code), status, None, now
        )

    def list_requests(self, user: str | None = None, limit: int = 200) -> list[dict[str, Any]]:
        with self.engine.connect() as conn:
            query = select(requests_table).order_by(requests_table.c.created_at.desc()).limit(limit)
            if user is not None:
                query = query.where(requests_table.c.username == user)
            rows = list(conn.execute(query))
        return [self._request_view(r) for r in rows]

    def _start_preemption(
        self, req: Request, decision: Decision, victims: list[Grant], now: float
    ) -> None:
        fresh = [v for v in victims if v.id not in self.state.preempting]
        deadline = max((now + v.grace_period_s for v in victims), default=now)
        self.pending[req.id] = Pending(req, {v.id for v in victims}, deadline, decision.reason)
        for victim in fresh:
            self.state.preempting[victim.id] = req.id
            self.preempt_info[victim.id] = (decision.reason, now + victim.grace_period_s)
            self.effects.notice(self.notice_of(victim.id))
        self.observer.preemption(decision.code or "preempting", len(fresh))
        self.effects.preemption_planned(req.id, victims, deadline)

    # -- release ----------------------------------------------------------------------------

    def _close_grant_rows(
        self, conn: Any, grant_id: str, request_id: str, now: float, reason: str
    ) -> None:
        conn.execute(_CLOSE_GRANT, {"g_id": grant_id, "g_released": now, "g_reason": reason})
        conn.execute(_CLOSE_REQUEST, {"r_id": request_id, "r_updated": now})

    def release(
        self, grant_id: str, reason: str = "released by holder", *, drain: bool = True
    ) -> bool:
        """Release a live grant; ``False`` if it was not live (release is idempotent)."""
        grant = self.state.grants.get(grant_id)
        if grant is None:
            return False
        now = self.clock()
        if self.fast is not None:
            self.fast.write(
                [
                    ("close_grant", (now, reason, grant_id)),
                    ("close_request", (now, grant.request.id)),
                ]
            )
        else:
            with self.engine.begin() as conn:
                self._close_grant_rows(conn, grant_id, grant.request.id, now, reason)
        target = self.state.preempting.get(grant_id)
        self.state.release(grant_id)
        self.ledger.remove(grant, now)
        self.preempt_info.pop(grant_id, None)
        self.last_heartbeat.pop(grant_id, None)
        self.observer.release(reason.split(":")[0])
        if target is not None:
            pend = self.pending.get(target)
            if pend is not None:
                pend.victims.discard(grant_id)
                if not any(v in self.state.grants for v in pend.victims):
                    self.effects.retry_soon(target)
        if drain:
            self.drain_queue(grant.pool)
        return True

    def _clear_marks(self, victims: Iterable[str]) -> None:
        ids = list(victims)
        if not ids:
            return
        with self.engine.begin() as conn:
            conn.execute(
                grants_table.update()
                .where(grants_table.c.id.in_(ids))
                .values(preempt_for=None, preempt_reason=None, preempt_deadline=None)
            )
        for v in ids:
            self.state.preempting.pop(v, None)
            self.preempt_info.pop(v, None)

    # -- waiting requests -------------------------------------------------------------------

    def _transition(self, req: Request, decision: Decision, now: float) -> str:
        """Write the new outcome of a waiting request; returns the status written."""
        status, grant, victims, marks = self._outcome(req, decision, now)
        grant_id = grant.id if grant else None
        if self.fast is not None:
            statements: list[tuple[str, tuple[Any, ...]]] = [
                (
                    "transition_request",
                    (status, decision.reason, decision.code, grant_id, now, req.id),
                )
            ]
            statements += _grant_and_victim_statements(grant, marks)
            self.fast.write(statements)
        else:
            with self.engine.begin() as conn:
                conn.execute(
                    requests_table.update()
                    .where(requests_table.c.id == req.id)
                    .values(
                        status=status,
                        reason=decision.reason,
                        code=decision.code,
                        grant_id=grant_id,
                        updated_at=now,
                    )
                )
                if grant is not None:
                    conn.execute(grants_table.insert(), grant_row(grant))
                self._mark_victims(conn, marks)
        self.queue.pop(req.id, None)
        self.pending.pop(req.id, None)
        self._carry_out(req, decision, grant, victims, now)
        return status

    def retry(self, request_id: str) -> str | None:
        """Decide again on a preempting or queued request (its victims are gone)."""
        req = self.queue.get(request_id)
        if req is None and request_id in self.pending:
            pend = self.pending[request_id]
            if any(v in self.state.grants for v in pend.victims):
                return "preempting"
            req = pend.request
        if req is None:
            return None
        now = self.clock()
        decision = decide(self.state, req, new_id("g"), self.facts(now, req, retry=True))
        if decision.outcome is Outcome.QUEUED and request_id in self.queue:
            return "queued"  # unchanged: no write
        return self._transition(req, decision, now)

    def drain_queue(self, pool: str | None = None) -> list[tuple[str, str]]:
        """Retry queued requests in order (priority, then age); return what changed."""
        changed: list[tuple[str, str]] = []
        if not self.queue:
            return changed
        for req in self.ordered_queue(pool):
            if req.id not in self.queue:
                continue
            now = self.clock()
            decision = decide(self.state, req, new_id("g"), self.facts(now, req, retry=True))
            if decision.outcome is Outcome.QUEUED:
                continue
            changed.append((req.id, self._transition(req, decision, now)))
        return changed

    def ordered_queue(self, pool: str | None = None) -> list[Request]:
        prio = {p.name: p.value for p in self.policy.priority_classes}
        items = [r for r in self.queue.values() if pool is None or r.pool == pool]
        return sorted(items, key=lambda r: (-prio.get(r.priority, 0), r.created_at, r.id))

    def cancel(self, request_id: str) -> dict[str, Any] | None:
        """Cancel a queued or preempting request, or release a granted one's grant."""
        view = self.get_request(request_id)
        if view is None:
            return None
        now = self.clock()
        if request_id in self.queue or request_id in self.pending:
            pend = self.pending.get(request_id)
            with self.engine.begin() as conn:
                conn.execute(
                    requests_table.update()
                    .where(requests_table.c.id == request_id)
                    .values(
                        status="cancelled", reason="cancelled", code="cancelled", updated_at=now
                    )
                )
            self.queue.pop(request_id, None)
            self.pending.pop(request_id, None)
            if pend is not None:
                self._clear_marks(
                    [v for v in pend.victims if self.state.preempting.get(v) == request_id]
                )
                self.effects.preemption_cancelled(request_id)
        elif view["status"] == "granted" and view.get("grant_id"):
            self.release(view["grant_id"], "released: request cancelled")
        return self.get_request(request_id)

    # -- nodes ------------------------------------------------------------------------------

    def set_cordon(self, node: str, cordoned: bool) -> dict[str, Any]:
        if node not in self.state.nodes:
            raise BrokerError(404, f"unknown node {node!r}")
        now = self.clock()
        with self.engine.begin() as conn:
            updated = conn.execute(
                nodes_table.update()
                .where(nodes_table.c.name == node)
                .values(cordoned=cordoned, updated_at=now)
            ).rowcount
            if not updated:
                conn.execute(
                    nodes_table.insert().values(name=node, cordoned=cordoned, updated_at=now)
                )
        self.state.cordon(node, cordoned)
        if not cordoned:
            self.drain_queue(self.state.nodes[node].pool.name)
        live = [g.id for g in self.state.grants.values() if g.placement.node == node]
        return {"node": node, "cordoned": cordoned, "live_grants": live}

    # -- heartbeats -------------------------------------------------------------------------

    def heartbeat(
        self, grant_id: str, ts: float, gpus: list[dict[str, Any]], simulated: bool
    ) -> None:
        with self.engine.begin() as conn:
            conn.execute(
                heartbeats_table.insert(),
                dict(grant_id=grant_id, ts=ts, simulated=simulated, gpus=gpus),
            )
        self.last_heartbeat[grant_id] = {"ts": iso(ts), "gpus": gpus, "simulated": simulated}

    # -- views ------------------------------------------------------------------------------

    def notice_of(self, grant_id: str) -> dict[str, Any]:
        grant = self.state.grants[grant_id]
        reason, deadline = self.preempt_info[grant_id]
        return {
            "grant_id": grant_id,
            "user": grant.user,
            "server": grant.request.holder,
            "kind": "preemption",
            "holder_kind": grant.request.kind.value,
            "reason": reason,
            "deadline": iso(deadline),
            "deadline_ts": deadline,
            "for_request": self.state.preempting.get(grant_id),
        }

    def notices(self, user: str | None = None, grant_id: str | None = None) -> list[dict[str, Any]]:
        out = []
        for gid in list(self.preempt_info):
            if gid not in self.state.grants:
                continue
            if grant_id and gid != grant_id:
                continue
            if user and self.state.grants[gid].user != user:
                continue
            out.append(self.notice_of(gid))
        return out

    def grant_view(self, grant: Grant) -> dict[str, Any]:
        req = grant.request
        info = self.preempt_info.get(grant.id)
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
            "gpus": gpus_json(self.gpus, slices_to_json(grant.placement)),
            "units": from_milli(grant.units_milli),
            "borrowed": grant.borrowed,
            "preemptible": grant.preemptible,
            "priority": req.priority,
            "priority_value": grant.priority_value,
            "cpu_milli": req.cpu_milli,
            "memory_mib": req.memory_mib,
            "granted_at": iso(grant.granted_at),
            "grace_period_s": grant.grace_period_s,
            "released_at": None,
            "release_reason": None,
            "preemption": {"reason": info[0], "deadline": iso(info[1])} if info else None,
            "usage": self.last_heartbeat.get(grant.id),
        }

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
            "gpus": gpus_json(self.gpus, row.slices),
            "units": from_milli(row.units_milli),
            "borrowed": bool(row.borrowed),
            "preemptible": bool(row.preemptible),
            "priority": row.priority,
            "priority_value": row.priority_value,
            "cpu_milli": spec.get("cpu_milli", 0),
            "memory_mib": spec.get("memory_mib", 0),
            "granted_at": iso(row.granted_at),
            "grace_period_s": row.grace_period_s,
            "released_at": iso(row.released_at),
            "release_reason": row.release_reason,
            "preemption": None,
            "usage": None,
        }

    def get_grant(self, grant_id: str) -> dict[str, Any] | None:
        grant = self.state.grants.get(grant_id)
        if grant is not None:
            return self.grant_view(grant)
        with self.engine.connect() as conn:
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
        for grant in self.state.grants.values():
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
        if req.id not in self.queue:
            return None
        for i, other in enumerate(self.ordered_queue(req.pool), start=1):
            if other.id == req.id:
                return i
        return None

    def expected_wait(self, req: Request, now: float) -> float | None:
        pend = self.pending.get(req.id)
        if pend is not None:
            return max(0.0, pend.deadline - now)
        if req.id not in self.queue:
            return None
        # the earliest end of a grant in the pool that declared a maximum runtime
        ends = [
            g.granted_at + g.request.max_runtime_s
            for g in self.state.grants.values()
            if g.pool == req.pool and g.request.max_runtime_s
        ]
        return max(0.0, min(ends) - now) if ends else None

    def _view_from_decision(
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
            "grant_id": grant.id if grant else None,
            "grant": self.grant_view(grant) if grant else None,
            "victims": list(decision.victims) if decision.outcome is Outcome.PREEMPTING else [],
            "created_at": iso(now),
        }

    def _request_view(self, row: Any) -> dict[str, Any]:
        req = spec_to_request(row.spec)
        now = self.clock()
        grant = self.get_grant(row.grant_id) if row.grant_id else None
        pend = self.pending.get(row.id)
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
            "grant_id": row.grant_id,
            "grant": grant,
            "victims": sorted(pend.victims) if pend else [],
            "created_at": iso(row.created_at),
        }

    def get_request(self, request_id: str) -> dict[str, Any] | None:
        with self.engine.connect() as conn:
            row = conn.execute(
                select(requests_table).where(requests_table.c.id == request_id)
            ).first()
        return self._request_view(row) if row else None

    def queue_view(self) -> list[dict[str, Any]]:
        now = self.clock()
        out: list[dict[str, Any]] = []
        for req in self.ordered_queue():
            out.append(
                {
                    "request_id": req.id,
                    "user": req.user,
                    "team": req.team,
                    "pool": req.pool,
                    "status": "queued",
                    "priority": req.priority,
                    "position": self.position(req),
                    "units": from_milli(req.gpu.units_milli),
                    "created_at": iso(req.created_at),
                    "expected_wait_s": self.expected_wait(req, now),
                }
            )
        for pend in self.pending.values():
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
        return out

    def team_usage(self, team_name: str) -> dict[str, Any]:
        team = self.policy.team(team_name)
        if team is None:
            raise BrokerError(404, f"unknown team {team_name!r}")
        now = self.clock()
        ledger = self._month_hours(now)
        pools: dict[str, Any] = {}
        for pool, quota in team.quotas:
            used = self.state.team_used(team.name, pool)
            others_borrowed = sum(
                v for (t, p), v in self.state.borrowed.items() if p == pool and t != team.name
            )
            lent = min(max(0, quota.guaranteed_milli - used), others_borrowed)
            pools[pool] = {
                "guaranteed": from_milli(quota.guaranteed_milli),
                "borrow_limit": from_milli(quota.borrow_limit_milli),
                "in_use": from_milli(used),
                "borrowed": from_milli(self.state.team_borrowed(team.name, pool)),
                "lent": from_milli(lent),
                "gpu_hours_month": round(ledger.hours((team.name, pool), now), 6),
                "gpu_hours_budget": quota.gpu_hours_per_month,
                "queued": sum(
                    1 for r in self.queue.values() if r.team == team.name and r.pool == pool
                ),
            }
        year, month = ledger.month
        return {"team": team.name, "month": f"{year:04d}-{month:02d}", "pools": pools}

    def gpu_hours_between(self, start: float, end: float) -> dict[Any, float]:
        """GPU-hours per (team, pool) in any period, from the ledger intervals."""
        now = self.clock()
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(grants_table).where(
                    grants_table.c.granted_at < end,
                    or_(grants_table.c.released_at.is_(None), grants_table.c.released_at > start),
                )
            )
            intervals = [
                Interval(
                    r.id, r.team, r.pool, r.username, r.units_milli, r.granted_at, r.released_at
                )
                for r in rows
            ]
        return gpu_hours(intervals, start, end, now)

    def profiles_view(self, teams: tuple[str, ...]) -> list[dict[str, Any]]:
        out = []
        for profile in self.policy.profiles_for(set(teams)):
            avail: dict[str, Any] = {}
            for team_name in teams:
                team = self.policy.team(team_name)
                if team is None or not profile.allowed_for({team_name}):
                    continue
                quota = team.quota(profile.pool)
                if quota is None:
                    continue
                used = self.state.team_used(team_name, profile.pool)
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
                avail[team_name] = {
                    "guaranteed": from_milli(quota.guaranteed_milli),
                    "borrow_limit": from_milli(quota.borrow_limit_milli),
                    "in_use": from_milli(used),
                    "within_guarantee": used + ask <= quota.guaranteed_milli,
                    "within_borrow_limit": used + ask
                    <= quota.guaranteed_milli + quota.borrow_limit_milli,
                    "fits_now": place(self.state, probe) is not None,
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

    # -- consistency ------------------------------------------------------------------------

    def db_live_grants(self) -> list[Grant]:
        with self.engine.connect() as conn:
            rows = conn.execute(select(grants_table).where(grants_table.c.released_at.is_(None)))
            return [row_to_grant(r) for r in rows]

    def requests_by_status(self) -> dict[str, int]:
        counts: dict[str, int] = defaultdict(int)
        with self.engine.connect() as conn:
            for row in conn.execute(select(requests_table.c.status)):
                counts[row.status] += 1
        return dict(counts)

    def grants_without_request(self) -> int:
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(grants_table.c.id)
                .select_from(
                    grants_table.outerjoin(
                        requests_table,
                        and_(
                            requests_table.c.id == grants_table.c.request_id,
                            requests_table.c.grant_id == grants_table.c.id,
                        ),
                    )
                )
                .where(requests_table.c.id.is_(None))
            )
            return len(list(rows))


def make_request(
    policy: Policy, *, request_id: str, user: str, team: str, body: dict[str, Any], now: float
) -> Request:
    """Build a core ``Request`` from the API body (validated by the handler)."""
    kind = Kind(body.get("kind", "interactive"))
    return Request(
        id=request_id,
        user=user,
        team=team,
        pool=body["pool"],
        gpu=body["gpu_ask"],
        priority=body["priority"],
        kind=kind,
        holder=body.get("server", "") or "",
        profile=body.get("profile_slug", "") or "",
        cpu_milli=int(body.get("cpu_milli", 0) or 0),
        memory_mib=int(body.get("memory_mib", 0) or 0),
        gpu_models=tuple(body.get("gpu_models", ()) or ()),
        checkpointing=bool(body.get("checkpointing", False)),
        max_runtime_s=body.get("max_runtime_s"),
        created_at=now,
    )
