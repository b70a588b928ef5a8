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

import logging
from typing import Any

from sqlalchemy import select

from ..core.state import CapacityError, ClusterState
from .base import LIVE_STATUSES, BrokerBase, Pending
from .consistency import ConsistencyMixin
from .db import grants_table, migrate, nodes_table, requests_table
from .effects import Effects, NoEffects, NoObserver, Observer
from .errors import BrokerError
from .heartbeats import HeartbeatsMixin
from .ids import new_id
from .ledger_month import MonthLedger
from .lifecycle import LifecycleMixin
from .serial import make_request, request_row, row_to_grant, spec_to_request

log = logging.getLogger("gpushare.broker")


class Broker(LifecycleMixin, HeartbeatsMixin, ConsistencyMixin):
    """Owner of all grants: in-memory core state plus its database mirror."""

    # -- start ------------------------------------------------------------------------------

    def load(self) -> list[str]:
        """Migrate the database and rebuild the state from it; return what was changed."""
        migrate(self.engine)
        changes: list[str] = []
        now = self.clock()
        self.state = ClusterState(self.policy)
        self.queue.clear()
        self.pending.clear()
        self.holders.clear()
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
                    self.hold(grant.request, grant.id)
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
