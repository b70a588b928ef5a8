"""Persistence of the broker: the engine, and (re-exported) its tables and migrations.

* SQLite by default, in WAL mode with a busy timeout so that other processes (a report,
  a second reader) can open the file while the broker writes. ``synchronous=NORMAL``
  keeps every committed transaction across a crash of the process (``kill -9``); set
  :attr:`Database.sqlite_synchronous` to ``FULL`` to survive power loss as well.
* PostgreSQL (or anything SQLAlchemy speaks) by URL.
* The tables are in :mod:`.tables`; the migrations are Alembic revisions
  (:mod:`.migrations`), run by :func:`.migrate.migrate` at start. A database newer than
  this code is refused on start.
"""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy import Engine, create_engine, event, text

from .migrate import SCHEMA_VERSION, SchemaError, migrate, schema_version
from .schema_steps import MIGRATIONS
from .tables import (
    grant_use_table,
    grants_end_index,
    grants_table,
    heartbeats_table,
    heartbeats_ts_index,
    job_events_table,
    job_notebooks_table,
    jobs_table,
    metadata,
    node_power_table,
    nodes_table,
    requests_table,
    schema_table,
    usage_table,
)

__all__ = [
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "SchemaError",
    "make_engine",
    "migrate",
    "schema_version",
    "sqlite_journal_mode",
    "metadata",
    "schema_table",
    "requests_table",
    "grants_table",
    "nodes_table",
    "heartbeats_table",
    "grant_use_table",
    "node_power_table",
    "jobs_table",
    "job_notebooks_table",
    "job_events_table",
    "usage_table",
    "heartbeats_ts_index",
    "grants_end_index",
]

log = logging.getLogger("gpushare.broker.db")


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
