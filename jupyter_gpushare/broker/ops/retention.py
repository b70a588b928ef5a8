"""Retention of request rows: what clients make the broker store is not kept for good.

Every ``POST /requests`` leaves a row, refused and CPU-only ones too. A periodic pass
deletes the rows nobody needs any more:

* finished rows without a grant (refused, cancelled, CPU-only) older than
  ``BrokerLimits.request_retention_days``;
* of those, the oldest beyond ``BrokerLimits.max_request_rows_per_user`` per user.

Never deleted: a queued or preempting row (a live request, also any the broker holds in
memory), and any row that names a grant or that a grant names (the ledger's: grants are
kept, and each keeps its request). Each pass deletes at most ``request_prune_batch`` rows,
so it never stalls the loop; passes repeat until nothing is left to delete.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from sqlalchemy import and_, delete, exists, func, select
from sqlalchemy.exc import SQLAlchemyError

from ..service.waiting import LIVE_STATUSES
from ..store.db import grants_table, requests_table

if TYPE_CHECKING:
    from ..service.broker import Broker

log = logging.getLogger("gpushare.broker.retention")
DAY = 86400.0


def _deletable() -> Any:
    """The condition of a row retention may delete (see the module's docstring)."""
    r, g = requests_table.c, grants_table.c
    return and_(
        r.status.not_in(LIVE_STATUSES),
        r.grant_id.is_(None),
        ~exists().where(g.request_id == r.id),
    )


class RequestRetention:
    """Deletes old request rows (see the module's docstring); ``run`` is the periodic task."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.deleted_total = 0

    @property
    def limits(self) -> Any:
        return self.broker.limits

    def _held(self) -> set[str]:
        """Requests the broker holds in memory (queued, preempting): never deleted, even
        where the row already reads otherwise."""
        return set(self.broker.queue) | set(self.broker.pending)

    def prune_once(self) -> int:
        """One pass: delete at most ``request_prune_batch`` rows; how many were deleted."""
        batch = max(1, int(self.limits.request_prune_batch))
        ids = self._expired(batch)
        if len(ids) < batch:
            ids += self._beyond_count(batch - len(ids), set(ids))
        held = self._held()
        ids = [i for i in ids if i not in held]
        if not ids:
            return 0
        r = requests_table.c
        with self.broker.engine.begin() as conn:
            deleted = conn.execute(
                delete(requests_table).where(r.id.in_(ids), _deletable())
            ).rowcount
        self.deleted_total += deleted
        return int(deleted)

    def _expired(self, limit: int) -> list[str]:
        days = float(self.limits.request_retention_days)
        if days <= 0:
            return []
        cutoff = self.broker.clock() - days * DAY
        r = requests_table.c
        with self.broker.engine.connect() as conn:
            return list(conn.execute(
                select(r.id).where(_deletable(), r.updated_at < cutoff)
                .order_by(r.updated_at).limit(limit)
            ).scalars())

    def _beyond_count(self, limit: int, skip: set[str]) -> list[str]:
        keep = int(self.limits.max_request_rows_per_user)
        if keep <= 0:
            return []
        r = requests_table.c
        out: list[str] = []
        with self.broker.engine.connect() as conn:
            over = conn.execute(
                select(r.username).where(_deletable()).group_by(r.username)
                .having(func.count() > keep).limit(100)
            ).scalars().all()
            for user in over:
                if len(out) >= limit:
                    break
                rows = conn.execute(
                    select(r.id).where(_deletable(), r.username == user)
                    .order_by(r.updated_at.desc(), r.id.desc())
                    .offset(keep).limit(limit - len(out) + len(skip))
                ).scalars()
                out += [i for i in rows if i not in skip][: limit - len(out)]
        return out

    def prune(self) -> int:
        """Passes until nothing is left to delete (tests, the command line)."""
        total = 0
        while True:
            deleted = self.prune_once()
            total += deleted
            if deleted < max(1, int(self.limits.request_prune_batch)):
                return total

    async def run(self) -> None:
        """The periodic task: a pass every ``request_prune_interval_s``, then more passes
        (yielding in between) while each one deleted a full batch."""
        while True:
            await asyncio.sleep(max(1.0, float(self.limits.request_prune_interval_s)))
            deleted = 0
            try:
                while True:
                    n = self.prune_once()
                    deleted += n
                    if n < max(1, int(self.limits.request_prune_batch)):
                        break
                    await asyncio.sleep(0)
            except SQLAlchemyError as exc:  # the database is busy or away: next time
                log.warning("request retention: pass failed (%s); retrying later", exc)
            if deleted:
                log.info("request retention: deleted %d old request rows", deleted)
