"""The broker's data: the in-memory ``ClusterState``, waiting requests and database handles.

:class:`BrokerBase` holds what every part of the service reads and changes; the parts
themselves are mixins (:mod:`.ledger`, :mod:`.views`, :mod:`.lifecycle`,
:mod:`.consistency`) combined into :class:`~.service.Broker`.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine

from ...core.model import Policy, Request
from ...core.state import ClusterState
from ..store import fastsql
from ..store.commitpipe import CommitFailed, CommitPipeline, Statements
from ..store.serial import gpu_index
from .effects import Effects, NoEffects, NoObserver, Observer
from .ledger_month import MonthLedger
from .limits import BrokerLimits
from .usage import UseRecorder
from .waiting import WaitQueue

LIVE_STATUSES = ("queued", "preempting")

TASK_WRITES: ContextVar[tuple[int, int] | None] = ContextVar("gpushare_task_writes", default=None)
"""The first and last sequence numbers of the changes the current asyncio task (a request's
handler: tornado runs each in a task of its own) enqueued for a group commit."""


@dataclass
class Pending:
    """A request waiting for preemption victims to leave."""

    request: Request
    victims: set[str]
    deadline: float
    reason: str


class BrokerBase:
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
        # hot-path writes through the driver (one transaction each); None: SQLAlchemy only
        self.fast: fastsql.FastWriter | None = (
            fastsql.FastWriter(
                engine,
                checkpoint_interval_s=checkpoint_interval_s,
                wal_restart_bytes=wal_restart_bytes,
            )
            if raw_sql and fastsql.supported(engine)
            else None
        )
        # the group commits of those writes (None: each commits on the caller's thread)
        self.commits: CommitPipeline | None = None
        # (user, idempotency key) -> (sequence number, answer) of admissions not yet durable
        self.unsettled_keys: OrderedDict[tuple[str, str], tuple[int, dict[str, Any]]] = (
            OrderedDict()
        )
        self.clock = clock
        self.effects: Effects = effects or NoEffects()
        self.observer: Observer = observer or NoObserver()
        self.state = ClusterState(policy)
        self.gpus = gpu_index(policy)
        self.limits = limits or BrokerLimits()
        # re-deciding the queue skips requests of a shape that just stayed queued
        # (False: decide on every queued request, as before; benchmarks/broker.py --queued)
        self.drain_skips_same_shape = True
        # queued batch requests by id, in decision order per pool
        self.queue = WaitQueue(self._priority_value)
        # (kind, user, holder) -> live grant ids and waiting request ids of that holder
        self.holders: dict[tuple[str, str, str], set[str]] = {}
        self.pending: dict[str, Pending] = {}  # preempting requests by id
        self.preempt_info: dict[str, tuple[str, float]] = {}  # victim grant -> (reason, deadline)
        self.last_heartbeat: dict[str, dict[str, Any]] = {}
        self.usage = UseRecorder()  # measured use per grant, node power, GPU activity
        self.cull_notices: dict[str, dict[str, Any]] = {}  # grant -> the idle culler's warning
        self.culling: dict[str, str] = {}  # grant -> the culler's reason while it stops it
        self.heartbeat_accepted_at: dict[str, float] = {}  # grant id -> broker time
        self.ledger = MonthLedger()
        self.loaded = False
        self.policy_version = ""  # hash of the policy file's text (see .reload); "" in-process
        # grant -> the notice that a policy change made it borrowed (preemptible)
        self.policy_notices: dict[str, dict[str, Any]] = {}

    def close(self) -> None:
        """Commit what is queued, then close the fast-path connection (and its threads)."""
        stopped = True
        if self.commits is not None:
            stopped = self.commits.close()
            self.commits = None
        if self.fast is not None and stopped:
            self.fast.close()

    def write_fast(self, statements: Statements) -> int:
        """Write one change through the fast path: committed before this returns, or, with
        the group commits (:mod:`.commitpipe`), enqueued (raises before enqueueing while a
        failed commit is being recovered from, so the caller applies nothing). Returns the
        change's sequence number in the group commits (0: already committed); the changes
        of the current task (a request's handler) are remembered for :meth:`durable`."""
        assert self.fast is not None
        if self.commits is None:
            self.fast.write(statements)
            return 0
        seq = self.commits.write(statements)
        span = TASK_WRITES.get()
        TASK_WRITES.set((span[0] if span else seq, seq))
        return seq

    async def durable(self, everything: bool = False) -> None:
        """Return once every change the current task made (``everything``: every change
        enqueued so far) is committed; raises :class:`~.commitpipe.CommitFailed` if one of
        the current task's changes failed. Handlers await this before they answer."""
        commits = self.commits
        if commits is None:
            return
        span = TASK_WRITES.get()
        if everything:
            await commits.wait()
        if span is not None:
            await commits.wait(span[1])
            _raise_if_failed(commits, span)

    def ensure_durable(self) -> None:
        """:meth:`durable` for the current task's changes, blocking (for an answer sent
        without awaiting it)."""
        commits = self.commits
        span = TASK_WRITES.get()
        if commits is None or span is None:
            return
        if not commits.check(span[1]):
            commits.flush()
        _raise_if_failed(commits, span)

    def after_durable(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` once every change enqueued so far is durable (at once without the
        group commits; never if one of them fails): what the outside world is told."""
        if self.commits is None:
            callback()
        else:
            self.commits.on_durable(self.commits.enqueued, callback)

    def reading_committed(self) -> AbstractContextManager[None]:
        """A block whose database reads take what is committed, without waiting for the
        commit queue (:meth:`~.commitpipe.CommitPipeline.bypass`)."""
        return self.commits.bypass() if self.commits is not None else nullcontext()

    def unsettled_answer(self, user: str, key: str) -> dict[str, Any] | None:
        """The answer to an admission with this idempotency key whose commit is still in
        flight (the database does not have it yet); forgets those that have settled."""
        commits = self.commits
        keys = self.unsettled_keys
        if commits is None:
            return None
        while keys:
            first = next(iter(keys))
            seq = keys[first][0]
            try:
                if not commits.check(seq):
                    break
            except CommitFailed:
                pass
            del keys[first]
        hit = keys.get((user, key))
        return hit[1] if hit is not None else None

    def measured_view(self, team: str, pool: str) -> dict[str, Any] | None:
        """Measured use of a team in a pool this month (see :mod:`.heartbeats`)."""
        return None

    def _priority_value(self, name: str) -> int:
        priority = self.policy.priority(name)
        return priority.value if priority is not None else 0

    def ordered_queue(self, pool: str | None = None) -> list[Request]:
        """Queued requests in decision order: priority value, then age, then id."""
        return self.queue.ordered(pool)

    # -- holders ----------------------------------------------------------------------------

    @staticmethod
    def holder_key(req: Request) -> tuple[str, str, str]:
        return (req.kind.value, req.user, req.holder)

    def hold(self, req: Request, live_id: str) -> None:
        """Record that ``live_id`` (a grant, or a waiting request) belongs to req's holder."""
        self.holders.setdefault(self.holder_key(req), set()).add(live_id)

    def unhold(self, req: Request, live_id: str) -> None:
        key = self.holder_key(req)
        ids = self.holders.get(key)
        if ids is not None:
            ids.discard(live_id)
            if not ids:
                del self.holders[key]

    def held_by(self, kind: str, user: str, holder: str) -> set[str]:
        """Live grant ids (``g-…``) and waiting request ids (``r-…``) of one holder."""
        return set(self.holders.get((kind, user, holder), ()))


def _raise_if_failed(commits: CommitPipeline, span: tuple[int, int]) -> None:
    """A 503 if one of the changes numbered ``span`` (first, last) failed."""
    why = commits.failed_within(*span)
    if why is not None:
        raise CommitFailed(why)
