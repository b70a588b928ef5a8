"""The DDL of schema versions 1..6, as functions of a connection.

Each Alembic revision ``0001``..``0006`` (:mod:`.migrations.versions`) runs one of them, so a
database the broker migrated by hand before Alembic and one Alembic builds end identical. The
tables are created as they are now (``checkfirst``), and the later steps add a column only where
it is missing, as the hand-written migrations did. :data:`MIGRATIONS` lists them for code that
builds a database of an older version (tests of the upgrades).
"""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import Column, Connection, inspect, select, text

from .tables import (
    grant_use_table,
    grants_end_index,
    grants_table,
    heartbeats_table,
    heartbeats_ts_index,
    job_events_table,
    job_notebooks_table,
    jobs_table,
    node_power_table,
    nodes_table,
    requests_table,
    usage_table,
)


def initial(conn: Connection) -> None:
    for table in (requests_table, grants_table, nodes_table, heartbeats_table):
        table.create(conn, checkfirst=True)


def jobs(conn: Connection) -> None:
    for table in (jobs_table, job_notebooks_table, job_events_table):
        table.create(conn, checkfirst=True)


def grant_use(conn: Connection) -> None:
    grant_use_table.create(conn, checkfirst=True)
    node_power_table.create(conn, checkfirst=True)


def usage(conn: Connection) -> None:
    usage_table.create(conn, checkfirst=True)
    heartbeats_ts_index.create(conn, checkfirst=True)


def add_missing_column(conn: Connection, table_name: str, column: Column) -> None:  # type: ignore[type-arg]
    """``ALTER TABLE ... ADD COLUMN`` unless the table has it (a table created since has)."""
    if column.name not in {c["name"] for c in inspect(conn).get_columns(table_name)}:
        kind = column.type.compile(dialect=conn.dialect)
        conn.execute(text(f"ALTER TABLE {table_name} ADD COLUMN {column.name} {kind}"))


def node_broker_drain(conn: Connection) -> None:
    add_missing_column(conn, nodes_table.name, nodes_table.c.broker_drain)


def job_idempotency(conn: Connection) -> None:
    """jobs: the submission's idempotency key, unique per user."""
    add_missing_column(conn, jobs_table.name, jobs_table.c.idempotency_key)
    next(i for i in jobs_table.indexes if i.name == "uq_gpushare_jobs_idem").create(
        conn, checkfirst=True
    )


def grant_end(conn: Connection) -> None:
    """The end record of grants; old closed rows get the kind their reason text says
    (``preempted: ...`` and the like) and, if preempted, the request (and its team) their
    preemption mark named."""
    from ...core.grant_end import classify

    g = grants_table.c
    for column in (g.end_kind, g.ended_by_request, g.ended_by_team):
        add_missing_column(conn, grants_table.name, column)
    grants_end_index.create(conn, checkfirst=True)
    rows = conn.execute(
        select(g.id, g.release_reason, g.preempt_for).where(
            g.released_at.is_not(None), g.end_kind.is_(None)
        )
    ).all()
    teams = (
        dict(conn.execute(select(requests_table.c.id, requests_table.c.team)).all())
        if any(r.preempt_for for r in rows)
        else {}
    )
    for gid, reason, preempt_for in rows:
        kind = classify(reason)
        by = preempt_for if kind.value == "preempted" else None
        conn.execute(
            grants_table.update()
            .where(g.id == gid)
            .values(
                end_kind=kind.value,
                ended_by_request=by,
                ended_by_team=teams.get(by) if by else None,
            )
        )


MIGRATIONS: list[tuple[int, str, Callable[[Connection], None]]] = [
    (1, "initial schema: requests, grants (ledger), nodes, heartbeats", initial),
    (2, "batch jobs: jobs, their notebook snapshots and state history", jobs),
    (3, "measured use per grant and GPU, power per node and hour", grant_use),
    (4, "measured use per team, pool and month; heartbeats by time", usage),
    (5, "nodes: the broker's own drain after a run was lost with the node", node_broker_drain),
    (6, "grants: one record of how each grant ended (kind, by whom)", grant_end),
]
"""(version, what it adds, its DDL): the schema steps from before Alembic, one revision each."""

NO_DOWNGRADE = (
    "the broker's schema is not downgraded: restore the database's backup and run the "
    "jupyter-gpushare release that wrote it"
)
