"""The broker's data: the in-memory ``ClusterState``, waiting requests and database handles.

:class:`BrokerBase` holds what every part of the service reads and changes; the parts
themselves are mixins (:mod:`.ledger`, :mod:`.views`, :mod:`.lifecycle`,
:mod:`.consistency`) combined into :class:`~.service.Broker`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine

from ..core.model import Policy, Request
from ..core.state import ClusterState
from . import fastsql
from .effects import Effects, NoEffects, NoObserver, Observer
from .ledger_month import MonthLedger
from .serial import gpu_index
from .usage import UseRecorder

LIVE_STATUSES = ("queued", "preempting")


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
        self.usage = UseRecorder()  # measured use per grant, node power, GPU activity
        self.cull_notices: dict[str, dict[str, Any]] = {}  # grant -> the idle culler's warning
        self.ledger = MonthLedger()
        self.loaded = False

    def close(self) -> None:
        """Close the fast-path connection (and its checkpoint thread)."""
        if self.fast is not None:
            self.fast.close()

    def ordered_queue(self, pool: str | None = None) -> list[Request]:
        prio = {p.name: p.value for p in self.policy.priority_classes}
        items = [r for r in self.queue.values() if pool is None or r.pool == pool]
        return sorted(items, key=lambda r: (-prio.get(r.priority, 0), r.created_at, r.id))
