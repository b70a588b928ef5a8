"""Reading a month of the broker's records for a what-if: read-only, by SQLAlchemy.

Uses the broker's own table definitions (:mod:`jupyter_gpushare.broker.db`) and never writes:
a SQLite file is opened in read-only mode (``mode=ro``: not even the WAL switch the broker's
engine makes); another database is read in a transaction that is rolled back. A database
of another schema version, or with no requests in the month, is refused in one sentence
(:class:`RecordsError`).
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Engine, create_engine, inspect, select

from ..broker.db import SCHEMA_VERSION, grants_table, requests_table, schema_table
from ..broker.serial import spec_to_request
from ..core.grant_end import kind_of
from ..core.ledger import month_bounds
from .demand import Demand
from .history import GrantRow, RequestRow, demands_from, recorded_grants
from .replay import GrantRecord


class RecordsError(ValueError):
    """The database cannot be replayed (one sentence saying why)."""


@dataclass(frozen=True)
class Month:
    """One month of recorded demand and what the broker granted."""

    year: int
    month: int
    start: float
    end: float
    demands: list[Demand]
    grants: list[GrantRecord]
    requests: int


def read_only_engine(url: str) -> Engine:
    """An engine that cannot write: SQLite opened ``mode=ro``; others as they are (the
    reader only selects, in a transaction it rolls back)."""
    if url.startswith("sqlite:///") and url not in ("sqlite:///", "sqlite:///:memory:"):
        path = Path(url[len("sqlite:///"):])
        if not path.exists():
            raise RecordsError(f"there is no database file at {path}.")
        uri = f"file:{path.resolve()}?mode=ro"
        return create_engine("sqlite://", creator=lambda: sqlite3.connect(uri, uri=True))
    return create_engine(url)


def _check_schema(conn: object) -> None:
    names = inspect(conn).get_table_names()  # type: ignore[arg-type]
    if schema_table.name not in names or grants_table.name not in names:
        raise RecordsError("this database holds no jupyter-gpushare broker tables.")
    row = conn.execute(select(schema_table.c.version)).first()  # type: ignore[attr-defined]
    version = int(row[0]) if row else 0
    if version != SCHEMA_VERSION:
        raise RecordsError(
            f"the database has schema version {version}, and this what-if reads version "
            f"{SCHEMA_VERSION} only (start the broker of this version once to migrate it).")


def read_month(engine: Engine, year: int, month: int) -> Month:
    """The month's demands and grants (requests created in the month; their grants)."""
    start, end = month_bounds(year, month)
    r, g = requests_table.c, grants_table.c
    with engine.connect() as conn:
        try:
            _check_schema(conn)
            req_rows = conn.execute(
                select(r.spec, r.status, r.created_at, r.updated_at)
                .where(r.created_at >= start, r.created_at < end)
                .order_by(r.created_at, r.id)
            ).all()
            grant_rows = conn.execute(
                select(g.request_id, g.node, g.slices, g.units_milli, g.granted_at,
                       g.released_at, g.end_kind, g.release_reason, g.borrowed)
                .where(g.granted_at < end, g.request_id.in_(
                    select(r.id).where(r.created_at >= start, r.created_at < end)))
            ).all()
        finally:
            conn.rollback()
    if not req_rows:
        raise RecordsError(f"no requests were recorded in {year:04d}-{month:02d}: "
                           "there is nothing to replay.")
    requests = [RequestRow(spec_to_request(row.spec), row.status, row.created_at,
                           row.updated_at) for row in req_rows]
    grants = [
        GrantRow(row.request_id, row.node, tuple(s["uuid"] for s in row.slices),
                 row.units_milli, row.granted_at, row.released_at,
                 kind_of(row.end_kind, row.release_reason) if row.released_at is not None
                 else None, bool(row.borrowed))
        for row in grant_rows
    ]
    demands = demands_from(requests, grants, end)
    return Month(year, month, start, end, demands, recorded_grants(requests, grants, demands),
                 len(requests))
