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

The functions here work on the broker's parts (:class:`~.parts.BrokerParts`); the
:class:`~.broker.Broker` calls them for its public methods (``submit``, ``release``, ...).

Side effects that talk to the outside (stopping a hub server, preempting a batch job)
live in :mod:`.preempt`; this module only schedules them through :class:`~.effects.Effects`.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Iterable
from functools import partial
from typing import Any

from ...core.admission import AdmissionFacts, Decision, Outcome, decide
from ...core.grant_end import EndFacts, GrantEnd, resolve
from ...core.model import Grant, Request
from ..store import fastsql
from ..store.db import grants_table, requests_table
from ..store.serial import grant_row, request_row
from . import change_rows
from .ids import new_id
from .parts import BrokerParts
from .waiting import Pending


def facts(b: BrokerParts, now: float, request: Request, retry: bool = False) -> AdmissionFacts:
    """What the core needs beyond the state; ``retry`` for a request decided before
    (placement then does not learn its shape a second time)."""
    ledger = b.ledger.month_at(now, b.state.grants)
    hours: dict[tuple[str, str], float] = {}
    key = (request.team, request.pool)
    hours[key] = ledger.hours(key, now)
    waiting: set[tuple[str, str]] = set()
    pool = request.pool
    for team_name in b.queue.teams_waiting(pool):
        smallest = b.queue.smallest_waiting(team_name, pool, excluding=request)
        if smallest is not None and _within_guarantee(b, team_name, pool, smallest):
            waiting.add((team_name, pool))
    for pend in b.pending.values():
        other = pend.request
        if other.id == request.id or other.pool != pool:
            continue
        if _within_guarantee(b, other.team, pool, other.gpu.units_milli):
            waiting.add((other.team, pool))
    return AdmissionFacts(
        now=now,
        gpu_hours_used=hours,
        waiting_within_guarantee=frozenset(waiting),
        retry=retry,
    )


def _within_guarantee(b: BrokerParts, team_name: str, pool: str, units_milli: int) -> bool:
    team = b.policy.team(team_name)
    quota = team.quota(pool) if team else None
    if quota is None:
        return False
    return b.state.team_used(team_name, pool) + units_milli <= quota.guaranteed_milli


def _queue_limit(b: BrokerParts, req: Request) -> Decision | None:
    """A refusal when queueing ``req`` would pass the per-user or per-team queue limit."""
    limits = b.limits
    if limits.max_queued_per_user and (b.queue.per_user[req.user] >= limits.max_queued_per_user):
        return Decision(
            Outcome.REFUSED,
            f"user {req.user} already has {b.queue.per_user[req.user]} queued requests "
            f"(the limit is {limits.max_queued_per_user})",
            "queue_limit",
        )
    if limits.max_queued_per_team and (b.queue.per_team[req.team] >= limits.max_queued_per_team):
        return Decision(
            Outcome.REFUSED,
            f"team {req.team} already has {b.queue.per_team[req.team]} queued requests "
            f"(the limit is {limits.max_queued_per_team})",
            "queue_limit",
        )
    return None


def timed_decide(b: BrokerParts, req: Request, known: AdmissionFacts) -> Decision:
    """The core's decision on ``req``; its CPU time (this thread's, so a garbage collection
    that began inside counts too) goes to the observer."""
    began = time.thread_time()
    decision = decide(b.state, req, new_id("g"), known)
    b.observer.decision(req.pool, time.thread_time() - began)
    return decision


def submit(b: BrokerParts, req: Request, *, idempotency_key: str | None = None) -> dict[str, Any]:
    """Decide on a new request, write the outcome in one transaction, then apply it."""
    if idempotency_key:
        existing = b.views.find_idempotent(req.user, idempotency_key)
        if existing is not None:
            return existing
    now = b.clock()
    seq = 0
    decision = timed_decide(b, req, facts(b, now, req))
    if decision.outcome is Outcome.QUEUED:
        decision = _queue_limit(b, req) or decision
    status, grant, victims, marks = _outcome(b, req, decision, now)
    row = request_row(
        req,
        status,
        decision.reason,
        decision.code,
        grant.id if grant else None,
        idempotency_key,
        now,
    )
    writes = b.writes
    if writes.fast is not None:
        spec_json = fastsql.dumps(row["spec"])
        statements = [("insert_request", fastsql.request_params(row, spec_json))]
        statements += change_rows.grant_and_victim_statements(grant, marks, spec_json)
        seq = writes.write(statements)
    else:
        with writes.engine.begin() as conn:
            conn.execute(requests_table.insert(), row)
            if grant is not None:
                conn.execute(grants_table.insert(), grant_row(grant))
            change_rows.mark_victims(conn, marks)
    _carry_out(b, req, decision, grant, victims, now)
    view = b.views.from_decision(req, decision, status, grant, now)
    if idempotency_key and seq:  # seq: enqueued for a group commit
        writes.unsettled_keys[(req.user, idempotency_key)] = (seq, view)
    return view


def _outcome(
    b: BrokerParts, req: Request, decision: Decision, now: float
) -> tuple[str, Grant | None, list[Grant], list[tuple[str, str, str, float]]]:
    """Status, grant to apply, victims, and victim marks (id, for, why, deadline) to write.
    Checks the grant against the state before anything is written."""
    grant = decision.grant if decision.outcome is Outcome.GRANTED else None
    victims: list[Grant] = []
    if decision.outcome is Outcome.PREEMPTING:
        victims = [b.state.grants[v] for v in decision.victims]
    if grant is not None:
        b.state.check(grant)
    marks = [
        (victim.id, req.id, decision.reason, now + victim.grace_period_s)
        for victim in victims
        if victim.id not in b.state.preempting  # pending ones already count as gone
    ]
    return decision.outcome.value, grant, victims, marks


def _carry_out(
    b: BrokerParts,
    req: Request,
    decision: Decision,
    grant: Grant | None,
    victims: list[Grant],
    now: float,
) -> None:
    """Apply a written outcome to memory: the grant, the queue or the preemption."""
    b.observer.admission(req.pool, decision.outcome.value, decision.code)
    if grant is not None:
        b.state.apply(grant)
        b.ledger.add(grant)
        b.holders.hold(req, grant.id)
    elif decision.outcome is Outcome.QUEUED:
        b.queue.add(req)
        b.holders.hold(req, req.id)
    elif decision.outcome is Outcome.PREEMPTING:
        _start_preemption(b, req, decision, victims, now)
        b.holders.hold(req, req.id)


def refuse(
    b: BrokerParts,
    req: Request,
    reason: str,
    code: str,
    idempotency_key: str | None = None,
    status: str = "refused",
) -> dict[str, Any]:
    """Record a request answered without the core: the user is in no team (refused), or
    it asks for no GPU at all (status ``granted``, code ``no_gpu``, no grant)."""
    now = b.clock()
    with b.writes.engine.begin() as conn:
        conn.execute(
            requests_table.insert(),
            request_row(req, status, reason, code, None, idempotency_key, now),
        )
    b.observer.admission(req.pool, status, code)
    return b.views.from_decision(req, Decision(Outcome(status), reason, code), status, None, now)


def _start_preemption(
    b: BrokerParts, req: Request, decision: Decision, victims: list[Grant], now: float
) -> None:
    fresh = [v for v in victims if v.id not in b.state.preempting]
    deadline = max((now + v.grace_period_s for v in victims), default=now)
    b.pending[req.id] = Pending(req, {v.id for v in victims}, deadline, decision.reason)
    for victim in fresh:
        b.state.preempting[victim.id] = req.id
        info = (decision.reason, now + victim.grace_period_s)
        b.writes.after_durable(partial(_announce_preemption, b, victim.id, req.id, info))
    b.observer.preemption(decision.code or "preempting", len(fresh))
    b.effects.preemption_planned(req.id, victims, deadline)


def _announce_preemption(
    b: BrokerParts, victim_id: str, request_id: str, info: tuple[str, float]
) -> None:
    """Tell a victim (its notice, and the job runner's signal) once the preemption is
    durable, and only if it is still planned."""
    if b.state.preempting.get(victim_id) != request_id:
        return
    b.preempt_info[victim_id] = info
    b.effects.notice(b.views.notice_of(victim_id))


# -- release ----------------------------------------------------------------------------


def grant_end(
    b: BrokerParts, grant: Grant, reason: str, now: float, end: GrantEnd | None = None
) -> GrantEnd:
    """How ``grant`` ends now (:func:`~jupyter_gpushare.core.grant_end.resolve`, with
    what the broker knows: its preemption, the culler, the profile's lifetime)."""
    target = b.state.preempting.get(grant.id)
    pend = b.pending.get(target) if target is not None else None
    why = b.preempt_info.get(grant.id, (pend.reason if pend else "", 0.0))[0]
    profile = b.policy.profile(grant.request.profile) if grant.request.profile else None
    facts = EndFacts(
        now=now,
        granted_at=grant.granted_at,
        max_lifetime_s=profile.max_lifetime_s if profile is not None else None,
        preempting_for=target,
        preempting_team=pend.request.team if pend is not None else None,
        preempting_why=f"preempted: {why}" if why else "",
        culling_why=b.culling.get(grant.id),
    )
    return resolve(reason, facts, end)


def release(
    b: BrokerParts,
    grant_id: str,
    reason: str = "released by holder",
    *,
    drain: bool = True,
    end: GrantEnd | None = None,
) -> bool:
    """Release a live grant; ``False`` if it was not live (release is idempotent).
    The grant's end record (kind, by whom) is written with it: ``end`` where the
    caller knows it, else :meth:`grant_end` decides from ``reason`` and the state."""
    grant = b.state.grants.get(grant_id)
    if grant is None:
        return False
    now = b.clock()
    ended = grant_end(b, grant, reason, now, end)
    text = ended.reason or reason
    if b.writes.fast is not None:
        b.writes.write(
            [
                (
                    "close_grant",
                    (now, text, ended.kind.value, ended.by_request, ended.by_team, grant_id),
                ),
                ("close_request", (now, grant.request.id)),
            ]
        )
    else:
        with b.writes.engine.begin() as conn:
            change_rows.close_grant_rows(conn, grant_id, grant.request.id, now, text, ended)
    target = b.state.preempting.get(grant_id)
    b.state.release(grant_id)
    b.holders.unhold(grant.request, grant_id)
    b.ledger.remove(grant, now)
    b.preempt_info.pop(grant_id, None)
    b.culling.pop(grant_id, None)
    b.heartbeats.forget(grant_id)
    b.observer.release(ended.kind.value)
    if target is not None:
        pend = b.pending.get(target)
        if pend is not None:
            pend.victims.discard(grant_id)
            if not any(v in b.state.grants for v in pend.victims):
                b.effects.retry_soon(target)
    if drain:
        drain_queue(b, grant.pool)
    return True


def clear_marks(b: BrokerParts, victims: Iterable[str]) -> None:
    ids = list(victims)
    if not ids:
        return
    with b.writes.engine.begin() as conn:
        conn.execute(
            grants_table.update()
            .where(grants_table.c.id.in_(ids))
            .values(preempt_for=None, preempt_reason=None, preempt_deadline=None)
        )
    for v in ids:
        b.state.preempting.pop(v, None)
        b.preempt_info.pop(v, None)


# -- waiting requests -------------------------------------------------------------------


def _transition(b: BrokerParts, req: Request, decision: Decision, now: float) -> str:
    """Write the new outcome of a waiting request; returns the status written."""
    status, grant, victims, marks = _outcome(b, req, decision, now)
    grant_id = grant.id if grant else None
    if b.writes.fast is not None:
        statements: list[tuple[str, tuple[Any, ...]]] = [
            (
                "transition_request",
                (status, decision.reason, decision.code, grant_id, now, req.id),
            )
        ]
        statements += change_rows.grant_and_victim_statements(grant, marks)
        b.writes.write(statements)
    else:
        with b.writes.engine.begin() as conn:
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
            change_rows.mark_victims(conn, marks)
    b.queue.pop(req.id, None)
    b.pending.pop(req.id, None)
    b.holders.unhold(req, req.id)
    _carry_out(b, req, decision, grant, victims, now)
    return status


def retry(b: BrokerParts, request_id: str) -> str | None:
    """Decide again on a preempting or queued request (its victims are gone)."""
    req = b.queue.get(request_id)
    if req is None and request_id in b.pending:
        pend = b.pending[request_id]
        if any(v in b.state.grants for v in pend.victims):
            return "preempting"
        req = pend.request
    if req is None:
        return None
    now = b.clock()
    decision = timed_decide(b, req, facts(b, now, req, retry=True))
    if decision.outcome is Outcome.QUEUED and request_id in b.queue:
        return "queued"  # unchanged: no write
    return _transition(b, req, decision, now)


def drain_queue(b: BrokerParts, pool: str | None = None) -> list[tuple[str, str]]:
    """Decide again on queued requests in order (priority, then age); return what changed.

    Requests of one shape (:func:`~.waiting.shape_of`: all but user, id and age) get the
    same answer from the core, the per-user cap aside. So only the first request of each
    shape is decided, in queue order; a shape whose first stays queued is done; after
    any change the heads are taken again. A release costs one decision per distinct
    shape waiting in the pool (plus one per request it lets through), not a pass over
    the queue."""
    changed = _ripe_preemptions(b, pool)
    if not b.queue:
        return changed
    for name in [pool] if pool is not None else b.queue.pools():
        if b.drain_skips_same_shape:
            _drain_by_shape(b, name, changed)
        else:
            _drain_every(b, name, changed)
    return changed


def _ripe_preemptions(b: BrokerParts, pool: str | None) -> list[tuple[str, str]]:
    """Decide again, before the queue, on each preempting request of ``pool`` whose victims
    are all gone: the capacity was freed for it. (A release schedules that retry for later,
    ``retry_soon``; a drain right after the release would otherwise hand the freed GPUs to
    a queued request, even one of the same team that came later, and the request the
    preemption was for would wait for the next release.)"""
    ripe = [
        rid
        for rid, pend in b.pending.items()
        if (pool is None or pend.request.pool == pool)
        and not any(v in b.state.grants for v in pend.victims)
    ]
    changed = []
    for rid in sorted(ripe, key=lambda r: b.pending[r].request.created_at):
        if rid in b.pending:
            status = retry(b, rid)
            if status is not None:
                changed.append((rid, status))
    return changed


def _drain_by_shape(b: BrokerParts, pool: str, changed: list[tuple[str, str]]) -> None:
    queue = b.queue
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
            now = b.clock()
            decision = timed_decide(b, req, facts(b, now, req, retry=True))
            if decision.outcome is Outcome.QUEUED:
                if decision.code == "user_cap":  # others of this shape may still fit
                    capped.add((req.user, req.gpu.units_milli))
                    nxt = queue.first_of(pool, shape, capped, after=key)
                    if nxt is not None:
                        heapq.heappush(heap, (queue.key(nxt.id), shape))
                continue
            changed.append((req.id, _transition(b, req, decision, now)))
            moved = True
            break  # the state changed: take the heads again
        if not moved:
            return


def _drain_every(b: BrokerParts, pool: str, changed: list[tuple[str, str]]) -> None:
    """A decision per queued request (the behaviour before shapes; for comparison)."""
    for req in b.queue.ordered(pool):
        if req.id not in b.queue:
            continue
        now = b.clock()
        decision = timed_decide(b, req, facts(b, now, req, retry=True))
        if decision.outcome is not Outcome.QUEUED:
            changed.append((req.id, _transition(b, req, decision, now)))


def cancel(b: BrokerParts, request_id: str) -> dict[str, Any] | None:
    """Cancel a queued or preempting request, or release a granted one's grant."""
    view = b.views.get_request(request_id)
    if view is None:
        return None
    now = b.clock()
    if request_id in b.queue or request_id in b.pending:
        pend = b.pending.get(request_id)
        with b.writes.engine.begin() as conn:
            conn.execute(
                requests_table.update()
                .where(requests_table.c.id == request_id)
                .values(status="cancelled", reason="cancelled", code="cancelled", updated_at=now)
            )
        req = b.queue.pop(request_id, None) or (pend.request if pend else None)
        b.pending.pop(request_id, None)
        if req is not None:
            b.holders.unhold(req, request_id)
        if pend is not None:
            clear_marks(b, [v for v in pend.victims if b.state.preempting.get(v) == request_id])
            b.effects.preemption_cancelled(request_id)
    elif view["status"] == "granted" and view.get("grant_id"):
        release(b, view["grant_id"], "released: request cancelled")
    return b.views.get_request(request_id)
