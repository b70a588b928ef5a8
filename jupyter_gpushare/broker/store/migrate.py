"""Schema migrations through Alembic, run at start as before (:func:`migrate`) and by
``jupyter-gpushare upgrade-db``.

The revisions live in :mod:`.migrations` (``versions/revNNNN_*.py``; revision ``NNNN`` makes
schema version NNNN). Before Alembic the broker kept its version in the one-row table
``gpushare_schema`` (versions 1..6, migrated by hand); a database it wrote is stamped with the
revision of that version and goes on from there. Every revision still writes that row, in its
own transaction, so an older broker refuses a database newer than itself as it always did.

One transaction per revision: a revision that fails leaves the database at the one before. On
PostgreSQL that holds for DDL too; on SQLite the migration's connection emits ``BEGIN`` itself
(the sqlite3 module would not before DDL), so a failing ``CREATE``/``ALTER`` rolls back as
well. On PostgreSQL a session advisory lock keeps two brokers starting at once from migrating
together.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext, MigrationInfo
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, event, inspect, select, text

from .tables import schema_table

log = logging.getLogger("gpushare.broker.db")

SCRIPT_LOCATION = Path(__file__).with_name("migrations")
"""The Alembic environment (``env.py``) and its ``versions/`` folder, inside the package."""

_REVISION_FILE = re.compile(r"^rev(\d{4})_\w+\.py$")
_PG_LOCK_KEY = 0x6770_7368  # "gpsh": the advisory lock of the broker's migrations


def revision_of(version: int) -> str:
    """The Alembic revision id that makes schema ``version`` (``6`` -> ``"0006"``)."""
    return f"{version:04d}"


def versions_in(script_location: Path = SCRIPT_LOCATION) -> list[int]:
    """The schema versions the revision files of ``script_location`` make, in order."""
    names = os.listdir(script_location / "versions")
    return sorted(int(m.group(1)) for name in names if (m := _REVISION_FILE.match(name)))


SCHEMA_VERSION = versions_in()[-1]
"""The schema version this code writes (its head revision)."""


class SchemaError(RuntimeError):
    """The database was written by a newer version of the broker."""


def schema_version(conn: Connection) -> int:
    """The version in ``gpushare_schema`` (0: none yet); creates the table if missing."""
    schema_table.create(conn, checkfirst=True)
    return _recorded_version(conn) or 0


def _recorded_version(conn: Connection) -> int | None:
    """The version in ``gpushare_schema``; None without the table, 0 without its row."""
    if not inspect(conn).has_table(schema_table.name):
        return None
    row = conn.execute(select(schema_table.c.version).where(schema_table.c.id == 1)).first()
    return int(row[0]) if row else 0


def _alembic_revision(conn: Connection) -> str | None:
    """The revision in Alembic's version table, read directly (Alembic's own reader logs two
    INFO lines at every broker start); None without the table or its row."""
    if not inspect(conn).has_table("alembic_version"):
        return None
    rows = conn.execute(text("SELECT version_num FROM alembic_version")).scalars().all()
    if len(rows) > 1:  # several heads: Alembic's reader says what is wrong
        return MigrationContext.configure(conn).get_current_revision()
    return str(rows[0]) if rows else None


def record_version(conn: Connection, step: MigrationInfo, applied: list[int]) -> None:
    """After a revision ran (in its transaction): write its version to ``gpushare_schema``,
    log it and add it to ``applied``. Stamps (an old database's version) are not recorded."""
    if step.is_stamp or not step.up_revision_id:
        return
    version = int(step.up_revision_id)
    schema_table.create(conn, checkfirst=True)
    updated = conn.execute(
        schema_table.update().where(schema_table.c.id == 1).values(version=version)
    )
    if updated.rowcount == 0:
        conn.execute(schema_table.insert().values(id=1, version=version))
    doc = str(getattr(step.up_revision, "doc", ""))  # (a Script: the revision file's docstring)
    log.info("migrated database to schema %d: %s", version, doc)
    applied.append(version)


def describe(version: int, script_location: Path = SCRIPT_LOCATION) -> str:
    """The one line a revision says of itself (its docstring's first line)."""
    script = ScriptDirectory(str(script_location))
    revision = script.get_revision(revision_of(version))
    return revision.doc if revision is not None else ""


def current_version(engine: Engine) -> int:
    """The schema version of the database (0: empty), by Alembic's revision or the old row."""
    with engine.connect() as conn:
        revision = _alembic_revision(conn)
        recorded = _recorded_version(conn) or 0
    return int(revision) if revision and revision.isdigit() else recorded


def _config(conn: Connection, script_location: Path) -> Config:
    config = Config()
    config.set_main_option("script_location", str(script_location).replace("%", "%%"))
    config.attributes["connection"] = conn
    return config


@contextmanager
def _sqlite_transactional_ddl(conn: Connection) -> Iterator[None]:
    """SQLite: ``BEGIN`` at each transaction's start, so DDL rolls back with the rest."""
    driver: Any = conn.connection.driver_connection
    saved = driver.isolation_level
    driver.isolation_level = None  # the sqlite3 module begins nothing itself

    def begin(connection: Connection) -> None:
        connection.exec_driver_sql("BEGIN")

    event.listen(conn, "begin", begin)
    try:
        yield
    finally:
        event.remove(conn, "begin", begin)
        if conn.in_transaction():
            conn.rollback()
        driver.isolation_level = saved


@contextmanager
def _pg_migration_lock(conn: Connection) -> Iterator[None]:
    conn.exec_driver_sql(f"SELECT pg_advisory_lock({_PG_LOCK_KEY})")
    conn.commit()
    try:
        yield
    finally:
        try:
            if conn.in_transaction():
                conn.rollback()
            conn.exec_driver_sql(f"SELECT pg_advisory_unlock({_PG_LOCK_KEY})")
            conn.commit()
        except Exception:  # the connection is gone: never give a locked one back to the pool
            conn.invalidate()
            raise


@contextmanager
def _migration_session(conn: Connection) -> Iterator[None]:
    if conn.dialect.name == "sqlite":
        with _sqlite_transactional_ddl(conn):
            yield
    elif conn.dialect.name == "postgresql":
        with _pg_migration_lock(conn):
            yield
    else:
        yield


def schema_at_head(engine: Engine) -> bool:
    """Whether the database is at this code's head revision (read only: a warm standby
    checks while the running broker owns the database)."""
    with engine.connect() as conn:
        recorded = _recorded_version(conn)
        revision = _alembic_revision(conn)
        conn.rollback()
    return recorded == SCHEMA_VERSION and revision == revision_of(SCHEMA_VERSION)


def migrate(engine: Engine, *, script_location: Path | None = None) -> list[int]:
    """Bring the database to the head revision (:data:`SCHEMA_VERSION`); return the schema
    versions applied, in order. A database from before Alembic is first stamped with the
    revision of its ``gpushare_schema`` version. A database newer than this code (a version or
    revision it does not know) raises :class:`SchemaError` and is left as it is.

    ``script_location``: another Alembic environment (tests)."""
    location = script_location or SCRIPT_LOCATION
    known = versions_in(location)
    with engine.connect() as conn, _migration_session(conn):
        recorded = _recorded_version(conn) or 0
        revision = _alembic_revision(conn)
        conn.commit()
        unknown = revision is not None and revision not in map(revision_of, known)
        if recorded > known[-1] or unknown:
            current = int(revision) if revision and revision.isdigit() else recorded
            raise SchemaError(
                f"database schema version {max(current, recorded)} is newer than this broker's "
                f"{known[-1]}; upgrade jupyter-gpushare"
            )
        if recorded == known[-1] and revision == revision_of(known[-1]):
            return []  # at the head: nothing for Alembic to do (and nothing to log)
        config = _config(conn, location)
        if revision is None and recorded:
            log.info(
                "database at schema %d from before Alembic: stamped %s",
                recorded,
                revision_of(recorded),
            )
            command.stamp(config, revision_of(recorded))
        command.upgrade(config, "head")
        applied: list[int] = config.attributes.get("applied", [])
        return list(applied)
