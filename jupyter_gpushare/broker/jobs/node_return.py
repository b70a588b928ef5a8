"""Nodes the job loop drained after a run was lost with them, resumed once the engine has
them back in service.

A backend that reports a run lost with its node (``RunStatus.node_failed``, e.g. Slurm's
``NODE_FAIL``) makes the job loop drain that node (:meth:`~.outcome.JobOutcomes._node_failed`), with
the reason in the node's ``broker_drain`` column of ``gpushare_nodes``. This remembers each
node the loop drained so, with the ``updated_at`` its drain wrote. While any wait, it asks
the backend every ``backend.node_return_interval_s`` which of them are back
(:meth:`~jupyter_gpushare.backends.base.JobBackend.nodes_in_service`, in a worker thread)
and resumes those whose row is still that drain. A node an admin drained, resumed or
drained again since (any write to its row, which clears ``broker_drain``) is the admin's:
it is forgotten and never resumed here. The record is the database's: on start
(:meth:`NodeReturn.load`) the nodes still drained with a ``broker_drain`` wait again, so a
restart of the broker leaves nothing for an admin to resume by hand. Bounded by the
policy's nodes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from sqlalchemy import select

from ...backends.base import JobBackend
from ..errors import BrokerError
from ..store.db import nodes_table

if TYPE_CHECKING:
    from ..service.broker import Broker

log = logging.getLogger("gpushare.broker.jobs")


class NodeReturn:
    """See the module docstring."""

    def __init__(self, broker: Broker, backend: JobBackend) -> None:
        self.broker = broker
        self.backend = backend
        self._drained: dict[str, float] = {}  # node -> updated_at of the broker's drain
        self._next = 0.0
        self._busy = False

    @property
    def waiting(self) -> list[str]:
        """The nodes drained by the job loop that wait for the engine."""
        return sorted(self._drained)

    def _row(self, node: str) -> Any:
        with self.broker.engine.connect() as conn:
            return conn.execute(
                select(
                    nodes_table.c.cordoned, nodes_table.c.updated_at, nodes_table.c.broker_drain
                ).where(nodes_table.c.name == node)
            ).first()

    @staticmethod
    def _ours(row: Any) -> bool:
        """Whether a node's row is (still) the broker's own drain."""
        return row is not None and bool(row.cordoned) and row.broker_drain is not None

    def drained(self, node: str) -> None:
        """The job loop has just drained ``node`` because a run was lost with it."""
        row = self._row(node)
        if self._ours(row):
            self._drained[node] = float(row.updated_at)

    def load(self) -> list[str]:
        """On start: the nodes the broker drained before (still drained, with their
        ``broker_drain``, in the policy) wait for the engine again; returns them."""
        with self.broker.engine.connect() as conn:
            rows = list(
                conn.execute(
                    select(
                        nodes_table.c.name, nodes_table.c.updated_at, nodes_table.c.broker_drain
                    ).where(nodes_table.c.cordoned, nodes_table.c.broker_drain.is_not(None))
                )
            )
        found = []
        for row in rows:
            if row.name in self.broker.state.nodes:
                self._drained[row.name] = float(row.updated_at)
                found.append(row.name)
                log.warning(
                    "node %s: drained by the broker before its restart (%s); resumed "
                    "once the %s backend has it back",
                    row.name,
                    row.broker_drain,
                    self.backend.name,
                )
        return found

    def due(self) -> bool:
        return bool(self._drained) and not self._busy and time.monotonic() >= self._next

    async def check(self, call: Callable[..., Awaitable[Any]]) -> list[str]:
        """Ask the backend (``call`` runs it in a worker thread) and resume the nodes it
        has back that are still the job loop's drain; returns them."""
        self._busy = True
        try:
            back = set(await call(self.backend.nodes_in_service, self.waiting))
        except Exception as exc:  # noqa: BLE001 - asked again next time
            log.warning(
                "could not ask the %s backend about drained nodes: %s", self.backend.name, exc
            )
            back = set()
        finally:
            self._busy = False
            self._next = time.monotonic() + max(0.1, float(self.backend.node_return_interval_s))
        resumed = []
        for node, stamp in list(self._drained.items()):
            row = self._row(node)
            if not self._ours(row) or float(row.updated_at) != stamp:
                del self._drained[node]  # an admin resumed or drained it since: theirs
                log.info(
                    "node %s: drained or resumed by an admin since the broker drained "
                    "it; left to the admin",
                    node,
                )
                continue
            if node not in back:
                continue
            del self._drained[node]
            try:
                self.broker.set_cordon(node, False)
            except BrokerError as exc:  # no longer in the policy
                log.info("node %s not resumed: %s", node, exc)
                continue
            log.warning(
                "node %s resumed: the %s backend has it back in service (the broker "
                "had drained it after a run was lost with it)",
                node,
                self.backend.name,
            )
            resumed.append(node)
        return resumed
