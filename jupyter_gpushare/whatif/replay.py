"""The what-if simulator: recorded demand replayed through the core, in simulated time.

Pure (no I/O, no clock): :func:`replay` takes a policy and a list of
:class:`~.demand.Demand` and returns a :class:`ReplayResult`. It drives the core exactly
as the broker does (:mod:`jupyter_gpushare.broker.service.lifecycle` and the preemption runner),
decision for decision, from an event heap:

* **arrival**: ``decide`` with the broker's admission facts (GPU-hours of the month, teams
  waiting inside their guarantee in the pool, including requests waiting for preemption
  victims); the broker's queue limits turn a queued answer into a refusal;
* **granted**: the grant holds its GPUs for the demand's work (a job that resumes after a
  preemption: what is left of it) and is then released; a release re-decides the pool's
  queue in the broker's order (priority, age; one decision per shape waiting);
* **queued**: waits in the queue; decided again at each release in its pool; a request
  the record shows cancelled gives up after the same wait (``patience_s``);
* **preempting**: the victims are marked; at the deadline (the longest grace period) those
  still there are released as preempted, and the request is decided again; a victim
  that ends by itself earlier makes the request be decided again at once;
* **preempted**: a batch job is requeued after the recorded (else the default) delay and
  holds what is left of its work if it checkpoints, all of it again if not; an interactive
  server is stopped and the rest of its session is lost demand;
* **refused**: an interactive request asked again in the record (same user and server
  within the retry window) is asked again at the same offset; otherwise its work is lost
  demand.

Events at the same instant run releases first, then preemption deadlines, cancellations
and arrivals (arrivals in request-id order), as the broker's loop would; except that a
grant whose hold ends at the very deadline of the preemption that marks it is left to the
deadline (the record shows such a grant preempted: its hold *is* the time to preemption).

What can differ from the broker (timing of reconcile, culling, node loss, the idle
culler's own decisions) is listed in ``docs/whatif.md``.

The parts live next to this module: the records and the result (:mod:`.replay_records`), the
month's GPU-hours (:mod:`.replay_ledger`) and the admission facts (:mod:`.replay_facts`, a
part the replay holds); here is the event loop with its arrivals, decisions, releases and
preemptions.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from ..core.admission import Decision, Outcome, decide
from ..core.grant_end import EndKind
from ..core.model import Grant, Kind, Policy, Request
from ..core.placement import place
from ..core.state import CapacityError, ClusterState
from .demand import Demand, sort_demands
from .queue import ReplayQueue
from .replay_facts import ReplayFacts
from .replay_ledger import _Ledger
from .replay_records import (
    DemandOutcome,
    GrantRecord,
    QueueLimits,
    ReplayResult,
    _Live,
    _Pending,
)

__all__ = [
    "DemandOutcome",
    "GrantRecord",
    "QueueLimits",
    "Replay",
    "ReplayResult",
    "replay",
]

RELEASE, DEADLINE, CANCEL, ARRIVE = 0, 1, 2, 3


class Replay:
    """One replay of ``demands`` under ``policy`` (see the module's docstring)."""

    def __init__(
        self,
        policy: Policy,
        demands: Sequence[Demand],
        *,
        limits: QueueLimits | None = None,
        requeue_delay_s: float = 60.0,
        budgets: bool | None = None,
        warm: Sequence[Request] = (),
    ) -> None:
        self.policy = policy
        self.demands = sort_demands(demands)
        self.requeue_delay_s = requeue_delay_s
        self.state = ClusterState(policy)
        self.queue = ReplayQueue(self._priority_value)
        self.pending: dict[str, _Pending] = {}
        self.deadlines: dict[str, float] = {}
        self.live: dict[str, _Live] = {}  # grant id -> what holds it
        self.remaining: dict[str, float] = {}  # demand id -> work left after a preemption
        self.waiting: dict[str, tuple[Demand, int]] = {}  # request id -> demand, attempt
        self.outcomes: dict[str, DemandOutcome] = {}
        self.grants: list[GrantRecord] = []
        self.heap: list[tuple[float, int, str, int, str]] = []
        self.seq = 0
        self.now = 0.0
        self.retry_soon: list[str] = []
        self.next_id = 0
        self.decisions = 0
        self.by_id = {d.id: d for d in self.demands}
        self.ledger = _Ledger()
        self.admission = ReplayFacts(
            policy,
            self.state,
            self.queue,
            self.ledger,
            self.pending,
            limits=limits or QueueLimits(),
            budgets=budgets,
        )
        self._warm(warm)

    def _warm(self, requests: Sequence[Request]) -> None:
        """Let the shared pools' packing learn the shapes of requests made before the window,
        as the broker's did when it decided them (the placements found are dropped)."""
        for req in requests:
            pool = self.policy.pool(req.pool)
            if pool is not None and pool.shares_gpus and not req.gpu.is_empty:
                place(self.state, req, observe=True)

    # -- the event loop -----------------------------------------------------------------------

    def run(self) -> ReplayResult:
        for d in self.demands:
            self.outcomes[d.id] = DemandOutcome(
                d.id,
                d.team,
                d.pool,
                d.first.kind.value,
                d.units_milli,
                d.arrival,
                d.work_s,
                utilization=d.utilization,
            )
            if d.placed is None or not self._place_carried(d, d.placed):
                self._arrival(d, 0, d.enters)
        while self.heap:
            t, kind, _, _, key = heapq.heappop(self.heap)
            self.now = t
            if kind == RELEASE:
                if key in self.live and not self._stopped_at_deadline(key):
                    self.release(key, EndKind.RELEASED)
            elif kind == DEADLINE:
                if self.deadlines.get(key) == t:
                    self._deadline(key)
            elif kind == CANCEL:
                self._cancel(key)
            else:
                demand_id, attempt = key.split("\x00")
                self._arrive(self.by_id[demand_id], int(attempt))
            self._run_retries()
        return ReplayResult(self.policy, self.grants, list(self.outcomes.values()), self.decisions)

    def _push(self, t: float, kind: int, key: str, tie: str = "") -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, kind, tie, self.seq, key))

    def _arrival(self, demand: Demand, k: int, t: float) -> None:
        """Attempt ``k`` of ``demand`` arrives at ``t``; arrivals at one instant are taken in
        request-id order (a preemption requeues several jobs at once)."""
        self._push(t, ARRIVE, f"{demand.id}\x00{k}", demand.attempt(k, t).id)

    def _run_retries(self) -> None:
        while self.retry_soon:
            rid = self.retry_soon.pop(0)
            self.deadlines.pop(rid, None)
            self.retry(rid)

    def _stopped_at_deadline(self, grant_id: str) -> bool:
        target = self.state.preempting.get(grant_id)
        return target is not None and self.deadlines.get(target) == self.now

    def _gid(self) -> str:
        self.next_id += 1
        return f"w{self.next_id}"

    def _decide(self, req: Request, retry: bool) -> Decision:
        self.decisions += 1
        facts = self.admission.facts(self.now, req, retry)
        return decide(self.state, req, self._gid(), facts)

    def _priority_value(self, name: str) -> int:
        priority = self.policy.priority(name)
        return priority.value if priority is not None else 0

    # -- arrivals and decisions ---------------------------------------------------------------

    def _arrive(self, demand: Demand, k: int) -> None:
        req = demand.attempt(k, self.now)
        out = self.outcomes[demand.id]
        out.attempts += 1
        decision = self._decide(req, retry=False)
        if decision.outcome is Outcome.QUEUED:
            decision = self.admission.queue_limit(req) or decision
        self.waiting[req.id] = (demand, k)
        self._carry_out(req, decision)
        if decision.outcome in (Outcome.QUEUED, Outcome.PREEMPTING) and demand.patience_s:
            # counted from the request's age: one waiting when the window began keeps it
            self._push(max(self.now, req.created_at + demand.patience_s), CANCEL, req.id)

    def _carry_out(self, req: Request, decision: Decision) -> None:
        outcome = decision.outcome
        if outcome is Outcome.GRANTED:
            assert decision.grant is not None
            self._apply(req, decision.grant)
        elif outcome is Outcome.QUEUED:
            self.queue.add(req)
        elif outcome is Outcome.PREEMPTING:
            self._start_preemption(req, decision)
        else:
            self._refused(req)

    def _apply(self, req: Request, grant: Grant) -> None:
        self.state.apply(grant)
        demand, k = self.waiting.pop(req.id)
        out = self.outcomes[demand.id]
        if out.first_granted_at is None:
            out.first_granted_at = self.now
        work = self._work_left(demand)
        record = GrantRecord(
            req.id,
            demand.id,
            req.team,
            req.pool,
            req.kind.value,
            grant.units_milli,
            grant.placement.node,
            tuple(s.gpu_uuid for s in grant.placement.slices),
            self.now,
            borrowed=grant.borrowed,
        )
        self.grants.append(record)
        self.ledger.live[req.id] = record
        self.live[grant.id] = _Live(demand, k, work, record)
        self._push(self.now + work, RELEASE, grant.id)

    def _place_carried(self, demand: Demand, grant: Grant) -> bool:
        """Put a grant live when the window began back on its GPUs; ``False`` if this
        policy has no room for it there (it is then decided again, as a new request)."""
        try:
            self.state.apply(grant)
        except (CapacityError, KeyError, ValueError):
            return False
        req = grant.request
        out = self.outcomes[demand.id]
        out.first_granted_at = grant.granted_at
        out.attempts += 1
        record = GrantRecord(
            req.id,
            demand.id,
            req.team,
            req.pool,
            req.kind.value,
            grant.units_milli,
            grant.placement.node,
            tuple(s.gpu_uuid for s in grant.placement.slices),
            grant.granted_at,
            borrowed=grant.borrowed,
        )
        self.grants.append(record)
        self.ledger.live[req.id] = record
        self.live[grant.id] = _Live(demand, 0, demand.work_s, record)
        self._push(grant.granted_at + demand.work_s, RELEASE, grant.id)
        return True

    def _work_left(self, demand: Demand) -> float:
        """Seconds of work the demand's next grant holds for (less after a resumed preemption)."""
        return self.remaining.get(demand.id, demand.work_s)

    def _refused(self, req: Request) -> None:
        demand, k = self.waiting.pop(req.id)
        out = self.outcomes[demand.id]
        nxt = demand.retry_at(k + 1)
        if req.kind is Kind.INTERACTIVE and nxt is not None:
            self._arrival(demand, k + 1, max(nxt, self.now))
            return
        out.status = "refused"
        out.lost_s = self._work_left(demand)

    def _start_preemption(self, req: Request, decision: Decision) -> None:
        victims = [self.state.grants[v] for v in decision.victims]
        fresh = [v for v in victims if v.id not in self.state.preempting]
        deadline = max((self.now + v.grace_period_s for v in victims), default=self.now)
        self.pending[req.id] = _Pending(req, {v.id for v in victims}, deadline, decision.reason)
        self.admission.pending_changed()
        for victim in fresh:
            self.state.preempting[victim.id] = req.id
        self.deadlines[req.id] = deadline
        self._push(deadline, DEADLINE, req.id)

    def retry(self, request_id: str) -> None:
        """The broker's ``retry``: decide again on a queued or preempting request."""
        req = self.queue.get(request_id)
        if req is None and request_id in self.pending:
            pend = self.pending[request_id]
            if any(v in self.state.grants for v in pend.victims):
                return
            req = pend.request
        if req is None:
            return
        decision = self._decide(req, retry=True)
        if decision.outcome is Outcome.QUEUED and request_id in self.queue:
            return
        self._transition(req, decision)

    def _transition(self, req: Request, decision: Decision) -> None:
        self.queue.pop(req.id)
        if self.pending.pop(req.id, None) is not None:
            self.admission.pending_changed()
        self._carry_out(req, decision)

    def drain_queue(self, pool: str) -> None:
        """The broker's ``drain_queue``: first the preempting requests whose victims are all
        gone (``_ripe_preemptions``), then the first request of each shape, in order."""
        ripe = [
            rid
            for rid, pend in self.pending.items()
            if pend.request.pool == pool and not any(v in self.state.grants for v in pend.victims)
        ]
        for rid in sorted(ripe, key=lambda r: self.pending[r].request.created_at):
            if rid in self.pending:
                self.deadlines.pop(rid, None)
                self.retry(rid)
        queue = self.queue
        while True:
            capped: set[tuple[str, int]] = set()
            heap = []
            for shape in queue.shapes(pool):
                head = queue.first_of(pool, shape, capped)
                if head is not None:
                    heap.append((queue.keys[head.id], shape))
            heapq.heapify(heap)
            moved = False
            while heap:
                key, shape = heapq.heappop(heap)
                req = queue.get(key[2])
                if req is None:
                    continue
                decision = self._decide(req, retry=True)
                if decision.outcome is Outcome.QUEUED:
                    if decision.code == "user_cap":
                        capped.add((req.user, req.gpu.units_milli))
                        nxt = queue.first_of(pool, shape, capped, after=key)
                        if nxt is not None:
                            heapq.heappush(heap, (queue.keys[nxt.id], shape))
                    continue
                self._transition(req, decision)
                moved = True
                break
            if not moved:
                return

    # -- releases, preemption deadlines, cancellations ---------------------------------------

    def release(self, grant_id: str, end: EndKind, *, drain: bool = True) -> None:
        """The broker's ``release``: free the grant; tell a waiting preemptor; drain."""
        live = self.live.pop(grant_id)
        target = self.state.preempting.get(grant_id)
        grant = self.state.release(grant_id)
        record = live.record
        record.released_at = self.now
        record.end = (EndKind.PREEMPTED if target is not None else end).value
        self.ledger.close(record)
        out = self.outcomes[live.demand.id]
        if end is EndKind.PREEMPTED:
            self._preempted(live, out)
        elif out.status == "waiting":
            out.status = "served"
        if target is not None:
            pend = self.pending.get(target)
            if pend is not None:
                pend.victims.discard(grant_id)
                if not any(v in self.state.grants for v in pend.victims):
                    self.retry_soon.append(target)
        if drain:
            self.drain_queue(grant.pool)

    def _preempted(self, live: _Live, out: DemandOutcome) -> None:
        demand = live.demand
        held = self.now - live.record.granted_at
        out.preemptions += 1
        if demand.first.kind is not Kind.BATCH:
            out.status = "lost_preempted"
            out.lost_s = max(0.0, live.work_left - held)
            return
        if demand.first.checkpointing:
            self.remaining[demand.id] = max(0.0, live.work_left - held)
        delay = demand.requeue_delay(live.attempt, self.requeue_delay_s)
        self._arrival(demand, live.attempt + 1, self.now + delay)

    def _deadline(self, request_id: str) -> None:
        """The preemption runner's ``execute``: stop the victims still there, decide again."""
        self.deadlines.pop(request_id, None)
        pend = self.pending.get(request_id)
        if pend is None:
            return
        for vid in sorted(pend.victims):
            if vid in self.state.grants:
                self.release(vid, EndKind.PREEMPTED, drain=False)
        self.retry(request_id)
        self.drain_queue(pend.request.pool)

    def _cancel(self, request_id: str) -> None:
        """The user gave up waiting (the record shows the request cancelled)."""
        if request_id not in self.queue and request_id not in self.pending:
            return
        pend = self.pending.pop(request_id, None)
        self.admission.pending_changed()
        self.queue.pop(request_id)
        self.deadlines.pop(request_id, None)
        if pend is not None:
            for v in pend.victims:
                if self.state.preempting.get(v) == request_id:
                    self.state.preempting.pop(v, None)
        demand, _ = self.waiting.pop(request_id)
        out = self.outcomes[demand.id]
        out.status = "gave_up"
        out.lost_s = self._work_left(demand)


def replay(policy: Policy, demands: Sequence[Demand], **options: object) -> ReplayResult:
    """Replay ``demands`` under ``policy``; see :class:`Replay` for the options."""
    return Replay(policy, demands, **options).run()  # type: ignore[arg-type]
