"""Consistency checks between the broker's memory and its database (tests, metrics)."""

from __future__ import annotations

from collections import defaultdict

from sqlalchemy import Engine, and_, select

from ...core.model import Grant
from ..store.db import grants_table, requests_table
from ..store.serial import grant_reader


class ConsistencyChecks:
    """Counts and live grants read back from the database (what memory is checked against);
    owns no state."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def db_live_grants(self) -> list[Grant]:
        with self.engine.connect() as conn:
            rows = conn.execute(select(grants_table).where(grants_table.c.released_at.is_(None)))
            read = grant_reader(tuple(rows.keys()))
            return [read(r) for r in rows]

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
