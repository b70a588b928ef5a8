"""The life of a request and its grant: submit, decide, write, apply, wait, release.

Every change follows the same pattern, with no ``await`` in between (so, on the tornado
loop, changes are serialised without a lock):

1. ask the pure core (``decide``) against the in-memory state;
2. write the outcome in **one** database transaction;
3. only after the commit, apply it to the in-memory state.

If the commit fails nothing is applied, so the state never holds what the database does
not. With group commits (:mod:`.commitpipe`, PostgreSQL by default), step 2 enqueues
the transaction instead and the handler answers once it is durable; a failed commit makes
the broker rebuild its state from the database.

Side effects that talk to the outside (stopping a hub server, preempting a batch job)
live in :mod:`.preempt`; this module only schedules them through :class:`~.effects.Effects`.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from functools import partial
from typing import Any

from sqlalchemy import bindparam

from ...core.admission import AdmissionFacts, Decision, Outcome, decide
from ...core.grant_end import EndFacts, GrantEnd, resolve
from ...core.model import Grant, Request
from ..store import fastsql
from ..store.db import grants_table, requests_table
from ..store.serial import grant_row, request_row
from .base import Pending
from .ids import new_id
from .views import ViewsMixin

# pre-built statements of the hot paths (parameters bound at execution: SQLAlchemy caches them)
_CLOSE_GRANT = (
    grants_table.update()
    .where(grants_table.c.id == bindparam("g_id"), grants_table.c.released_at.is_(None))
    .values(
        released_at=bindparam("g_released"),
        release_reason=bindparam("g_reason"),
        end_kind=bindparam("g_kind"),
        ended_by_request=bindparam("g_by_request"),
        ended_by_team=bindparam("g_by_team"),
    )
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


class LifecycleMixin(ViewsMixin):
    """Admission, waiting (queue and preemption), cancellation and release of grants."""

    def facts(self, now: float, request: Request, retry: bool = False) -> AdmissionFacts:
        """What the core needs beyond the state; ``retry`` for a request decided before
        (placement then does not learn its shape a second time)."""
        ledger = self._month_hours(now)
        hours: dict[tuple[str, str], float] = {}
        key = (request.team, request.pool)
        hours[key] = ledger.hours(key, now)
        waiting: set[tuple[str, str]] = set()
        pool = request.pool
        for team_name in self.queue.teams_waiting(pool):
            smallest = self.queue.smallest_waiting(team_name, pool, excluding=request)
            if smallest is not None and self._within_guarantee(team_name, pool, smallest):
                waiting.add((team_name, pool))
        for pend in self.pending.values():
            other = pend.request
            if other.id == request.id or other.pool != pool:
                continue
            if self._within_guarantee(other.team, pool, other.gpu.units_milli):
                waiting.add((other.team, pool))
        return AdmissionFacts(
            now=now,
            gpu_hours_used=hours,
            waiting_within_guarantee=frozenset(waiting),
            retry=retry,
        )

    def _within_guarantee(self, team_name: str, pool: str, units_milli: int) -> bool:
        team = self.policy.team(team_name)
        quota = team.quota(pool) if team else None
        if quota is None:
            return False
        return self.state.team_used(team_name, pool) + units_milli <= quota.guaranteed_milli

    def _queue_limit(self, req: Request) -> Decision | None:
        """A refusal when queueing ``req`` would pass the per-user or per-team queue limit."""
        limits = self.limits
        if limits.max_queued_per_user and (
            self.queue.per_user[req.user] >= limits.max_queued_per_user
        ):
            return Decision(
                Outcome.REFUSED,
                f"user {req.user} already has {self.queue.per_user[req.user]} queued requests "
                f"(the limit is {limits.max_queued_per_user})",
                "queue_limit",
            )
        if limits.max_queued_per_team and (
            self.queue.per_team[req.team] >= limits.max_queued_per_team
        ):
            return Decision(
                Outcome.REFUSED,
                f"team {req.team} already has {self.queue.per_team[req.team]} queued requests "
                f"(the limit is {limits.max_queued_per_team})",
                "queue_limit",
            )
        return None

    def submit(self, req: Request, *, idempotency_key: str | None = None) -> dict[str, Any]:
        """Decide on a new request, write the outcome in one transaction, then apply it."""
        if idempotency_key:
            existing = self.find_idempotent(req.user, idempotency_key)
            if existing is not None:
                return existing
        now = self.clock()
        seq = 0
        decision = decide(self.state, req, new_id("g"), self.facts(now, req))
        if decision.outcome is Outcome.QUEUED:
            decision = self._queue_limit(req) or decision
        status, grant, victims, marks = self._outcome(req, decision, now)
        row = request_row(
            req,
            status,
            decision.reason,
            decision.code,
            grant.id if grant else None,
            idempotency_key,
            now,
        )
        if self.fast is not None:
            spec_json = fastsql.dumps(row["spec"])
            statements = [("insert_request", fastsql.request_params(row, spec_json))]
            statements += _grant_and_victim_statements(grant, marks, spec_json)
            seq = self.write_fast(statements)
        else:
            with self.engine.begin() as conn:
                conn.execute(requests_table.insert(), row)
                if grant is not None:
                    conn.execute(grants_table.insert(), grant_row(grant))
                self._mark_victims(conn, marks)
        self._carry_out(req, decision, grant, victims, now)
        view = self._view_from_decision(req, decision, status, grant, now)
        if idempotency_key and seq:  # seq: enqueued for a group commit
            self.unsettled_keys[(req.user, idempotency_key)] = (seq, view)
        return view

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
        self,
        req: Request,
        decision: Decision,
        grant: Grant | None,
        victims: list[Grant],
        now: float,
    ) -> None:
        """Apply a written outcome to memory: the grant, the queue or the preemption."""
        self.observer.admission(req.pool, decision.outcome.value, decision.code)
        if grant is not None:
            self.state.apply(grant)
            self.ledger.add(grant)
            self.hold(req, grant.id)
        elif decision.outcome is Outcome.QUEUED:
            self.queue.add(req)
            self.hold(req, req.id)
        elif decision.outcome is Outcome.PREEMPTING:
            self._start_preemption(req, decision, victims, now)
            self.hold(req, req.id)

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

    def _start_preemption(
        self, req: Request, decision: Decision, victims: list[Grant], now: float
    ) -> None:
        fresh = [v for v in victims if v.id not in self.state.preempting]
        deadline = max((now + v.grace_period_s for v in victims), default=now)
        self.pending[req.id] = Pending(req, {v.id for v in victims}, deadline, decision.reason)
        for victim in fresh:
            self.state.preempting[victim.id] = req.id
            info = (decision.reason, now + victim.grace_period_s)
            self.after_durable(partial(self._announce_preemption, victim.id, req.id, info))
        self.observer.preemption(decision.code or "preempting", len(fresh))
        self.effects.preemption_planned(req.id, victims, deadline)

    def _announce_preemption(
        self, victim_id: str, request_id: str, info: tuple[str, float]
    ) -> None:
        """Tell a victim (its notice, and the job runner's signal) once the preemption is
        durable, and only if it is still planned."""
        if self.state.preempting.get(victim_id) != request_id:
            return
        self.preempt_info[victim_id] = info
        self.effects.notice(self.notice_of(victim_id))

    # -- release ----------------------------------------------------------------------------

    def _close_grant_rows(
        self, conn: Any, grant_id: str, request_id: str, now: float, reason: str,
        end: GrantEnd | None = None,
    ) -> None:
        end = end or resolve(reason, EndFacts(now, now))
        conn.execute(_CLOSE_GRANT, {
            "g_id": grant_id, "g_released": now, "g_reason": end.reason or reason,
            "g_kind": end.kind.value, "g_by_request": end.by_request, "g_by_team": end.by_team,
        })
        conn.execute(_CLOSE_REQUEST, {"r_id": request_id, "r_updated": now})

    def grant_end(
        self, grant: Grant, reason: str, now: float, end: GrantEnd | None = None
    ) -> GrantEnd:
        """How ``grant`` ends now (:func:`~jupyter_gpushare.core.grant_end.resolve`, with
        what the broker knows: its preemption, the culler, the profile's lifetime)."""
        target = self.state.preempting.get(grant.id)
        pend = self.pending.get(target) if target is not None else None
        why = self.preempt_info.get(grant.id, (pend.reason if pend else "", 0.0))[0]
        profile = self.policy.profile(grant.request.profile) if grant.request.profile else None
        facts = EndFacts(
            now=now,
            granted_at=grant.granted_at,
            max_lifetime_s=profile.max_lifetime_s if profile is not None else None,
            preempting_for=target,
            preempting_team=pend.request.team if pend is not None else None,
            preempting_why=f"preempted: {why}" if why else "",
            culling_why=self.culling.get(grant.id),
        )
        return resolve(reason, facts, end)

    def release(
        self,
        grant_id: str,
        reason: str = "released by holder",
        *,
        drain: bool = True,
        end: GrantEnd | None = None,
    ) -> bool:
        """Release a live grant; ``False`` if it was not live (release is idempotent).
        The grant's end record (kind, by whom) is written with it: ``end`` where the
        caller knows it, else :meth:`grant_end` decides from ``reason`` and the state."""
        grant = self.state.grants.get(grant_id)
        if grant is None:
            return False
        now = self.clock()
        ended = self.grant_end(grant, reason, now, end)
        text = ended.reason or reason
        if self.fast is not None:
            self.write_fast(
                [
                    ("close_grant", (now, text, ended.kind.value, ended.by_request,
                                     ended.by_team, grant_id)),
                    ("close_request", (now, grant.request.id)),
                ]
            )
        else:
            with self.engine.begin() as conn:
                self._close_grant_rows(conn, grant_id, grant.request.id, now, text, ended)
        target = self.state.preempting.get(grant_id)
        self.state.release(grant_id)
        self.unhold(grant.request, grant_id)
        self.ledger.remove(grant, now)
        self.preempt_info.pop(grant_id, None)
        self.culling.pop(grant_id, None)
        self.last_heartbeat.pop(grant_id, None)
        self.heartbeat_accepted_at.pop(grant_id, None)
        self.observer.release(ended.kind.value)
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
            self.write_fast(statements)
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
        self.unhold(req, req.id)
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
        """Decide again on queued requests in order (priority, then age); return what changed.

        Requests of one shape (:func:`~.waiting.shape_of`: all but user, id and age) get the
        same answer from the core, the per-user cap aside. So only the first request of each
        shape is decided, in queue order; a shape whose first stays queued is done; after
        any change the heads are taken again. A release costs one decision per distinct
        shape waiting in the pool (plus one per request it lets through), not a pass over
        the queue."""
        changed: list[tuple[str, str]] = []
        if not self.queue:
            return changed
        for name in [pool] if pool is not None else self.queue.pools():
            if self.drain_skips_same_shape:
                self._drain_by_shape(name, changed)
            else:
                self._drain_every(name, changed)
        return changed

    def _drain_by_shape(self, pool: str, changed: list[tuple[str, str]]) -> None:
        queue = self.queue
        while True:
            capped: set[tuple[str, int]] = set()
            heap: list[tuple[Any, Any]] = []
            for shape in queue.shapes(pool):
                head = queue.first_of(pool, shape, capped)
                if head is not None:
                    heap.append((queue.key(head.id), shape))
            heapq.heapify(heap)
            moved = False
            while heap:
                key, shape = heapq.heappop(heap)
                req = queue.get(key[2])
                if req is None:
                    continue
                now = self.clock()
                decision = decide(self.state, req, new_id("g"), self.facts(now, req, retry=True))
                if decision.outcome is Outcome.QUEUED:
                    if decision.code == "user_cap":  # others of this shape may still fit
                        capped.add((req.user, req.gpu.units_milli))
                        nxt = queue.first_of(pool, shape, capped, after=key)
                        if nxt is not None:
                            heapq.heappush(heap, (queue.key(nxt.id), shape))
                    continue
                changed.append((req.id, self._transition(req, decision, now)))
                moved = True
                break  # the state changed: take the heads again
            if not moved:
                return

    def _drain_every(self, pool: str, changed: list[tuple[str, str]]) -> None:
        """A decision per queued request (the behaviour before shapes; for comparison)."""
        for req in self.ordered_queue(pool):
            if req.id not in self.queue:
                continue
            now = self.clock()
            decision = decide(self.state, req, new_id("g"), self.facts(now, req, retry=True))
            if decision.outcome is not Outcome.QUEUED:
                changed.append((req.id, self._transition(req, decision, now)))

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
            req = self.queue.pop(request_id, None) or (pend.request if pend else None)
            self.pending.pop(request_id, None)
            if req is not None:
                self.unhold(req, request_id)
            if pend is not None:
                self._clear_marks(
                    [v for v in pend.victims if self.state.preempting.get(v) == request_id]
                )
                self.effects.preemption_cancelled(request_id)
        elif view["status"] == "granted" and view.get("grant_id"):
            self.release(view["grant_id"], "released: request cancelled")
        return self.get_request(request_id)
