"""Persistence of the broker: SQLAlchemy 2 Core tables, engine setup and migrations.

* SQLite by default, in WAL mode with a busy timeout so that other processes (a report,
  a second reader) can open the file while the broker writes. ``synchronous=NORMAL``
  keeps every committed transaction across a crash of the process (``kill -9``); set
  :attr:`Database.sqlite_synchronous` to ``FULL`` to survive power loss as well.
* PostgreSQL (or anything SQLAlchemy speaks) by URL.
* Migrations: the table ``gpushare_schema`` holds one row with the schema version;
  :data:`MIGRATIONS` is an ordered list of functions, each run in its own transaction.
  A database newer than this code is refused on start.

The ``gpushare_grants`` table is also the GPU-hour ledger: a grant row is an interval
``[granted_at, released_at)`` (``released_at`` is NULL while the grant lives), and rows
are never deleted.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    Column,
    Connection,
    Engine,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    create_engine,
    event,
    inspect,
    select,
    text,
)

log = logging.getLogger("gpushare.broker.db")

metadata = MetaData()

schema_table = Table(
    "gpushare_schema",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("version", Integer, nullable=False),
)

requests_table = Table(
    "gpushare_requests",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("username", String(255), nullable=False),
    Column("server", String(255), nullable=False, default=""),
    Column("team", String(255), nullable=False),
    Column("pool", String(255), nullable=False),
    Column("kind", String(16), nullable=False),
    Column("profile", String(255), nullable=False, default=""),
    Column("status", String(16), nullable=False),
    Column("reason", Text, nullable=False, default=""),
    Column("code", String(64), nullable=False, default=""),
    Column("spec", JSON, nullable=False),
    Column("grant_id", String(64), nullable=True),
    Column("idempotency_key", String(255), nullable=True),
    Column("created_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
    UniqueConstraint("username", "idempotency_key", name="uq_gpushare_request_idem"),
    Index("ix_gpushare_requests_status", "status"),
    Index("ix_gpushare_requests_user", "username"),
)

grants_table = Table(
    "gpushare_grants",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("request_id", String(64), nullable=False, unique=True),
    Column("username", String(255), nullable=False),
    Column("server", String(255), nullable=False, default=""),
    Column("team", String(255), nullable=False),
    Column("pool", String(255), nullable=False),
    Column("profile", String(255), nullable=False, default=""),
    Column("kind", String(16), nullable=False),
    Column("node", String(255), nullable=False),
    Column("slices", JSON, nullable=False),
    Column("units_milli", Integer, nullable=False),
    Column("borrowed", Boolean, nullable=False),
    Column("preemptible", Boolean, nullable=False),
    Column("priority", String(255), nullable=False),
    Column("priority_value", Integer, nullable=False),
    Column("grace_period_s", Integer, nullable=False),
    Column("spec", JSON, nullable=False),
    Column("granted_at", Float, nullable=False),
    Column("released_at", Float, nullable=True),
    Column("release_reason", Text, nullable=True),
    Column("preempt_for", String(64), nullable=True),
    Column("preempt_reason", Text, nullable=True),
    Column("preempt_deadline", Float, nullable=True),
    # schema 6: how the grant ended (jupyter_gpushare.core.grant_end): the kind from a
    # closed set, and for a preemption the request and team it was taken for; NULL while
    # the grant lives
    Column("end_kind", String(16), nullable=True),
    Column("ended_by_request", String(64), nullable=True),
    Column("ended_by_team", String(255), nullable=True),
    Index("ix_gpushare_grants_live", "released_at"),
    Index("ix_gpushare_grants_user", "username"),
    Index("ix_gpushare_grants_period", "team", "pool", "granted_at"),
)

nodes_table = Table(
    "gpushare_nodes",
    metadata,
    Column("name", String(255), primary_key=True),
    Column("cordoned", Boolean, nullable=False),
    Column("updated_at", Float, nullable=False),
    # schema 5: why the broker itself drained the node (a run was lost with it, e.g. Slurm's
    # NODE_FAIL), so it resumes the node once the engine has it back, across its restarts;
    # NULL: no drain, or an admin's (any other write clears it)
    Column("broker_drain", Text, nullable=True),
)

heartbeats_table = Table(
    "gpushare_heartbeats",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("grant_id", String(64), nullable=False),
    Column("ts", Float, nullable=False),
    Column("simulated", Boolean, nullable=False),
    Column("gpus", JSON, nullable=False),
    Index("ix_gpushare_heartbeats_grant", "grant_id", "ts"),
)

grant_use_table = Table(
    "gpushare_grant_use",
    metadata,
    Column("grant_id", String(64), primary_key=True),
    Column("gpu_uuid", String(255), primary_key=True),
    Column("month", String(7), primary_key=True),  # YYYY-MM (UTC) of the heartbeats
    Column("samples", Integer, nullable=False),
    Column("utilization_pct_sum", Float, nullable=False),
    Column("memory_used_mib_sum", Float, nullable=False),
    Column("last_ts", Float, nullable=False),
)
"""Measured use of each grant on each GPU per month, summed from its heartbeats (kept for
good: the monthly report reads it; see :mod:`.usage`)."""

node_power_table = Table(
    "gpushare_node_power",
    metadata,
    Column("node", String(255), primary_key=True),
    Column("hour_start", Float, primary_key=True),
    Column("samples", Integer, nullable=False),
    Column("watts_sum", Float, nullable=False),
    Column("watts_max", Float, nullable=False),
)
"""Power of each node's reporting GPUs, per hour: samples of the node's total, their sum and
their maximum (see :mod:`.usage`)."""


# -- batch jobs (schema 2) -------------------------------------------------------------------

jobs_table = Table(
    "gpushare_jobs",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("username", String(255), nullable=False),
    Column("team", String(255), nullable=False),
    Column("server", String(255), nullable=False, default=""),
    Column("name", String(255), nullable=False),
    Column("path", Text, nullable=False, default=""),
    Column("profile", String(255), nullable=False, default=""),
    Column("pool", String(255), nullable=False),
    Column("priority", String(255), nullable=False),
    Column("request_spec", JSON, nullable=False),  # the batch request, asked again on requeue
    Column("parameters", JSON, nullable=False),
    Column("max_runtime_s", Integer, nullable=False),
    Column("checkpoint", Boolean, nullable=False),
    Column("backend", String(64), nullable=False),
    Column("output_path", Text, nullable=False),
    Column("state", String(16), nullable=False),
    Column("reason", Text, nullable=False, default=""),
    Column("attempt", Integer, nullable=False),
    Column("request_id", String(64), nullable=True),
    Column("grant_id", String(64), nullable=True),
    Column("handle", JSON, nullable=True),
    Column("error", JSON, nullable=True),
    Column("gpu_hours", Float, nullable=False, default=0.0),  # closed attempts
    Column("preempt_signalled", Boolean, nullable=False, default=False),
    Column("cancel_requested", Boolean, nullable=False, default=False),
    Column("created_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
    Column("started_at", Float, nullable=True),
    Column("ended_at", Float, nullable=True),
    Index("ix_gpushare_jobs_state", "state"),
    Index("ix_gpushare_jobs_user", "username", "created_at"),
)

job_notebooks_table = Table(
    "gpushare_job_notebooks",
    metadata,
    Column("job_id", String(64), primary_key=True),
    Column("notebook", Text, nullable=False),  # the snapshot taken at submit time (JSON)
    Column("size", Integer, nullable=False),
)

job_events_table = Table(
    "gpushare_job_events",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("job_id", String(64), nullable=False),
    Column("ts", Float, nullable=False),
    Column("from_state", String(16), nullable=True),
    Column("to_state", String(16), nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("reason", Text, nullable=False, default=""),
    Index("ix_gpushare_job_events_job", "job_id", "id"),
)


usage_table = Table(
    "gpushare_usage_month",
    metadata,
    Column("team", String(255), primary_key=True),
    Column("pool", String(255), primary_key=True),
    Column("month", String(7), primary_key=True),  # YYYY-MM (UTC)
    Column("samples", Integer, nullable=False),
    Column("utilization_pct_sum", Float, nullable=False),
    Column("memory_used_mib_sum", Float, nullable=False),
    Column("last_ts", Float, nullable=False),
)
"""Measured use from heartbeats, summed per team, pool and month (kept for good, while the
heartbeat detail rows are deleted after ``BrokerLimits.heartbeat_retention_s``)."""

heartbeats_ts_index = Index("ix_gpushare_heartbeats_ts", heartbeats_table.c.ts)
grants_end_index = Index(
    "ix_gpushare_grants_end", grants_table.c.end_kind, grants_table.c.released_at
)


# -- migrations -----------------------------------------------------------------------------


def _m1_initial(conn: Connection) -> None:
    for table in (requests_table, grants_table, nodes_table, heartbeats_table):
        table.create(conn, checkfirst=True)


def _m2_jobs(conn: Connection) -> None:
    for table in (jobs_table, job_notebooks_table, job_events_table):
        table.create(conn, checkfirst=True)


def _m3_grant_use(conn: Connection) -> None:
    grant_use_table.create(conn, checkfirst=True)
    node_power_table.create(conn, checkfirst=True)


def _m4_usage(conn: Connection) -> None:
    usage_table.create(conn, checkfirst=True)
    heartbeats_ts_index.create(conn, checkfirst=True)


def _m5_node_broker_drain(conn: Connection) -> None:
    # a database made since has the column already (schema 1 creates the table as it is now)
    if "broker_drain" not in {c["name"] for c in inspect(conn).get_columns(nodes_table.name)}:
        kind = nodes_table.c.broker_drain.type.compile(dialect=conn.dialect)
        conn.execute(text(f"ALTER TABLE {nodes_table.name} ADD COLUMN broker_drain {kind}"))


def _m6_grant_end(conn: Connection) -> None:
    """The end record of grants; old closed rows get the kind their reason text says
    (``preempted: ...`` and the like) and, if preempted, the request (and its team) their
    preemption mark named."""
    from ...core.grant_end import classify

    g = grants_table.c
    have = {c["name"] for c in inspect(conn).get_columns(grants_table.name)}
    for column in (g.end_kind, g.ended_by_request, g.ended_by_team):
        if column.name not in have:
            kind = column.type.compile(dialect=conn.dialect)
            conn.execute(text(f"ALTER TABLE {grants_table.name} ADD COLUMN {column.name} {kind}"))
    grants_end_index.create(conn, checkfirst=True)
    rows = conn.execute(
        select(g.id, g.release_reason, g.preempt_for)
        .where(g.released_at.is_not(None), g.end_kind.is_(None))
    ).all()
    teams = dict(conn.execute(select(requests_table.c.id, requests_table.c.team)).all()) if any(
        r.preempt_for for r in rows
    ) else {}
    for gid, reason, preempt_for in rows:
        kind = classify(reason)
        by = preempt_for if kind.value == "preempted" else None
        conn.execute(
            grants_table.update().where(g.id == gid).values(
                end_kind=kind.value,
                ended_by_request=by,
                ended_by_team=teams.get(by) if by else None,
            )
        )


MIGRATIONS: list[tuple[int, str, Callable[[Connection], None]]] = [
    (1, "initial schema: requests, grants (ledger), nodes, heartbeats", _m1_initial),
    (2, "batch jobs: jobs, their notebook snapshots and state history", _m2_jobs),
    (3, "measured use per grant and GPU, power per node and hour", _m3_grant_use),
    (4, "measured use per team, pool and month; heartbeats by time", _m4_usage),
    (5, "nodes: the broker's own drain after a run was lost with the node", _m5_node_broker_drain),
    (6, "grants: one record of how each grant ended (kind, by whom)", _m6_grant_end),
]
SCHEMA_VERSION = MIGRATIONS[-1][0]


class SchemaError(RuntimeError):
    """The database was written by a newer version of the broker."""


def schema_version(conn: Connection) -> int:
    schema_table.create(conn, checkfirst=True)
    row = conn.execute(select(schema_table.c.version).where(schema_table.c.id == 1)).first()
    return int(row[0]) if row else 0


def migrate(engine: Engine) -> list[int]:
    """Bring the database to :data:`SCHEMA_VERSION`; return the versions applied."""
    applied: list[int] = []
    with engine.begin() as conn:
        current = schema_version(conn)
    if current > SCHEMA_VERSION:
        raise SchemaError(
            f"database schema version {current} is newer than this broker's "
            f"{SCHEMA_VERSION}; upgrade jupyter-gpushare"
        )
    for version, description, func in MIGRATIONS:
        if version <= current:
            continue
        with engine.begin() as conn:
            # re-read inside the transaction: another process may have migrated meanwhile
            if schema_version(conn) >= version:
                continue
            log.info("migrating database to schema %d: %s", version, description)
            func(conn)
            if version == 1:
                conn.execute(schema_table.insert().values(id=1, version=version))
            else:
                conn.execute(
                    schema_table.update().where(schema_table.c.id == 1).values(version=version)
                )
        applied.append(version)
    return applied


# -- engine ---------------------------------------------------------------------------------


def make_engine(
    url: str,
    *,
    sqlite_synchronous: str = "NORMAL",
    busy_timeout_ms: int = 30000,
    echo: bool = False,
) -> Engine:
    """An engine for ``url``; SQLite files get WAL, a busy timeout and foreign keys."""
    kwargs: dict[str, Any] = {"echo": echo, "future": True}
    if url.startswith("sqlite"):
        kwargs["connect_args"] = {"timeout": busy_timeout_ms / 1000, "check_same_thread": False}
    else:
        kwargs["pool_pre_ping"] = True
    engine = create_engine(url, **kwargs)
    if url.startswith("sqlite"):
        memory = url in ("sqlite://", "sqlite:///:memory:")

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            if not memory:
                cur.execute("PRAGMA journal_mode=WAL")
            cur.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
            cur.execute(f"PRAGMA synchronous={sqlite_synchronous}")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

    return engine


def sqlite_journal_mode(engine: Engine) -> str:
    with engine.connect() as conn:
        return str(conn.execute(text("PRAGMA journal_mode")).scalar())
