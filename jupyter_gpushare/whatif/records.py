"""Reading a month of the broker's records for a what-if: read-only, by SQLAlchemy.

Uses the broker's own table definitions (:mod:`jupyter_gpushare.broker.store.db`) and never writes:
a SQLite file is opened in read-only mode (``mode=ro``: not even the WAL switch the broker's
engine makes); another database is read in a transaction that is rolled back. A database
of another schema version, or with no requests in the month, is refused in one sentence
(:class:`RecordsError`).
"""

from __future__ import annotations

import dataclasses
import sqlite3
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import Engine, create_engine, inspect, or_, select

from ..broker.store.db import (
    SCHEMA_VERSION,
    grant_use_table,
    grants_table,
    requests_table,
    schema_table,
)
from ..broker.store.serial import row_to_grant, spec_to_request
from ..core.grant_end import kind_of
from ..core.ledger import month_bounds
from ..core.model import Request
from .demand import Demand
from .history import GrantRow, RequestRow, demands_from, recorded_grants
from .replay import GrantRecord

WARM_LIMIT = 20_000
"""Requests before the window read to warm the shared pools' packing (see :func:`read_month`)."""

NOT_PLACED = ("quota", "reserved", "user_cap", "budget", "invalid", "queue_limit", "no_gpu")
"""Codes of requests whose decision stopped before placement (nothing was learned)."""


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
    warm: list[Request] = field(default_factory=list)  # requests before the window


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
    """The month's demands and grants: requests created in the month, and those created
    before it that were still held (their grant live at the start) or still waiting; and,
    to warm the shared pools' packing (which learns the mix of request shapes as the
    broker decides), up to :data:`WARM_LIMIT` earlier requests that reached placement."""
    start, end = month_bounds(year, month)
    r, g = requests_table.c, grants_table.c
    live_at_start = select(g.request_id).where(
        g.granted_at < start, or_(g.released_at.is_(None), g.released_at > start))
    wanted = or_(
        (r.created_at >= start) & (r.created_at < end),
        (r.created_at < start) & or_(r.updated_at >= start, r.id.in_(live_at_start)),
    )
    with engine.connect() as conn:
        try:
            _check_schema(conn)
            req_rows = conn.execute(
                select(r.spec, r.status, r.created_at, r.updated_at).where(wanted)
                .order_by(r.created_at, r.id)
            ).all()
            warm_rows = conn.execute(
                select(r.spec).where(r.created_at < start, r.code.not_in(NOT_PLACED))
                .order_by(r.created_at.desc(), r.id.desc()).limit(WARM_LIMIT)
            ).all()
            grant_rows = conn.execute(
                select(grants_table).where(g.granted_at < end,
                                           g.request_id.in_(select(r.id).where(wanted)))
            ).all()
            use_rows = _measured_use(conn, [row.id for row in grant_rows],
                                     f"{year:04d}-{month:02d}")
        finally:
            conn.rollback()
    if not any(start <= row.created_at < end for row in req_rows):
        raise RecordsError(f"no requests were recorded in {year:04d}-{month:02d}: "
                           "there is nothing to replay.")
    requests = [RequestRow(spec_to_request(row.spec), row.status, row.created_at,
                           row.updated_at) for row in req_rows]
    grants = [
        GrantRow(row.request_id, row.node, tuple(s["uuid"] for s in row.slices),
                 row.units_milli, row.granted_at, row.released_at,
                 kind_of(row.end_kind, row.release_reason) if row.released_at is not None
                 else None, bool(row.borrowed),
                 row_to_grant(row) if row.granted_at < start else None)
        for row in grant_rows
    ]
    demands = demands_from(requests, grants, end, start=start)
    demands = with_utilization(demands, use_rows,
                               {row.id: row.request_id for row in grant_rows})
    warm = [spec_to_request(row.spec) for row in reversed(warm_rows)]
    return Month(year, month, start, end, demands, recorded_grants(requests, grants, demands),
                 sum(1 for row in req_rows if start <= row.created_at < end), warm)


def _measured_use(conn: object, grant_ids: list[str],
                  month: str) -> list[tuple[str, float, int]]:
    """``(grant_id, utilization_pct_sum, samples)`` of the month's heartbeat aggregates."""
    u = grant_use_table.c
    rows: list[tuple[str, float, int]] = []
    for i in range(0, len(grant_ids), 500):  # stay under SQLite's bound-parameter limit
        chunk = grant_ids[i:i + 500]
        rows += [(r.grant_id, float(r.utilization_pct_sum), int(r.samples))
                 for r in conn.execute(  # type: ignore[attr-defined]
                     select(u.grant_id, u.utilization_pct_sum, u.samples)
                     .where(u.month == month, u.grant_id.in_(chunk)))]
    return rows


def with_utilization(demands: list[Demand], use: list[tuple[str, float, int]],
                     request_of: dict[str, str]) -> list[Demand]:
    """Each demand with the mean utilisation its grants' heartbeats measured (0..1: the sum
    of utilisation percentages over the sum of samples, all its grants and GPUs together);
    a demand with no heartbeat keeps ``None`` (unmeasured)."""
    pct: dict[str, float] = defaultdict(float)
    samples: dict[str, int] = defaultdict(int)
    for grant_id, pct_sum, n in use:
        rid = request_of.get(grant_id)
        if rid is not None and n > 0:
            pct[rid] += pct_sum
            samples[rid] += n
    out = []
    for d in demands:
        n = sum(samples.get(r.id, 0) for r in d.requests)
        if n:
            mean = sum(pct.get(r.id, 0.0) for r in d.requests) / n / 100.0
            d = dataclasses.replace(d, utilization=min(1.0, max(0.0, mean)))
        out.append(d)
    return out
