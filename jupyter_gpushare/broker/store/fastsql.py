"""The broker's hot-path writes through the DB-API driver directly (SQLite and PostgreSQL).

SQLAlchemy Core costs about 0.3 ms per statement in Python (compiling the cache key, bind
processors, the connection and transaction objects); the admission and release paths write
two or three rows, so this module sends pre-written SQL through one dedicated driver
connection instead. Every call of :meth:`FastWriter.write` is still **one durable
transaction**, committed before it returns:

* SQLite (``sqlite3``): ``BEGIN`` … ``COMMIT`` on a connection in autocommit mode, with the
  engine's pragmas (WAL, busy timeout, ``synchronous``). Automatic WAL checkpoints are moved
  off the event loop to a background thread (``PRAGMA wal_checkpoint(PASSIVE)``, once a
  second by default: the first commit after a complete checkpoint restarts the WAL and syncs
  its header, a ~4 ms stall, so checkpoints are kept rare); a checkpoint only copies
  committed pages into the database file, so this changes nothing about what a ``kill -9``
  keeps. A passive checkpoint never lets SQLite start the WAL over while commits come back
  to back (a new commit always lands behind it), so once the WAL passes
  ``wal_restart_bytes`` the thread follows it with two more passive passes and
  ``wal_checkpoint(RESTART)`` (busy timeout :data:`RESTART_BUSY_MS`, so a long reader makes
  it give up rather than hold the writers), and the next commit writes from the WAL's start.
  That commit waits for the sync of the new WAL header, on the event loop: 30-130 ms with a
  64-256 MiB WAL and 3.6 s with 1 GiB on a loaded disk, so it is off by default
  (``wal_restart_bytes = 0``; ``BrokerApp.sqlite_wal_restart_mib``) and meant for bulk loads.
* PostgreSQL (``psycopg2``): statements are prepared once per connection (``PREPARE``), and
  the ``EXECUTE``s of one change travel as **one** simple query
  (``stmt; stmt; …``) on an autocommit connection, which PostgreSQL runs as a single implicit
  transaction and commits (with ``synchronous_commit`` as configured) before answering: one
  round trip per admission instead of three.

Other dialects and in-memory SQLite fall back to the SQLAlchemy path (:func:`supported`).
The rows written are the same as through SQLAlchemy (JSON columns as JSON text, booleans
as the driver adapts them); ``tests/test_broker_fastsql.py`` checks both paths agree.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sqlite3
import threading
import time
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Engine

log = logging.getLogger("gpushare.broker.db")

PING_AFTER_IDLE_S = 1.0
"""PostgreSQL: a connection idle this long is asked ``SELECT 1`` before a change is sent on it
(one round trip; a busy broker never pays it)."""
RESTART_BUSY_MS = 5
"""How long the checkpointer's ``RESTART`` step waits for the writer and for readers."""

CATCH_UP_PASSES = 2
"""Passive checkpoints run back to back before a ``RESTART`` (see :meth:`checkpoint`)."""

REQUEST_COLUMNS = (
    "id",
    "username",
    "server",
    "team",
    "pool",
    "kind",
    "profile",
    "status",
    "reason",
    "code",
    "spec",
    "grant_id",
    "idempotency_key",
    "created_at",
    "updated_at",
)
GRANT_COLUMNS = (
    "id",
    "request_id",
    "username",
    "server",
    "team",
    "pool",
    "profile",
    "kind",
    "node",
    "slices",
    "units_milli",
    "borrowed",
    "preemptible",
    "priority",
    "priority_value",
    "grace_period_s",
    "spec",
    "granted_at",
)
_JSON_COLUMNS = {"spec", "slices"}


def _insert(table: str, columns: Sequence[str]) -> str:
    return f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})"


# statements in qmark style; PostgreSQL gets them with %s (see FastWriter.__init__)
SQL = {
    "insert_request": _insert("gpushare_requests", REQUEST_COLUMNS),
    "insert_grant": _insert("gpushare_grants", GRANT_COLUMNS),
    "close_grant": "UPDATE gpushare_grants SET released_at = ?, release_reason = ?, "
    "end_kind = ?, ended_by_request = ?, ended_by_team = ? "
    "WHERE id = ? AND released_at IS NULL",
    "close_request": "UPDATE gpushare_requests SET status = 'released', updated_at = ? "
    "WHERE id = ?",
    "mark_victim": "UPDATE gpushare_grants SET preempt_for = ?, preempt_reason = ?, "
    "preempt_deadline = ? WHERE id = ?",
    "transition_request": "UPDATE gpushare_requests SET status = ?, reason = ?, code = ?, "
    "grant_id = ?, updated_at = ? WHERE id = ?",
}


def dumps(value: Any) -> str:
    """JSON text as SQLAlchemy's JSON type writes it."""
    return json.dumps(value)


def request_params(row: dict[str, Any], spec_json: str | None = None) -> tuple[Any, ...]:
    """Parameters of ``insert_request`` from a request row dict (``spec`` as a dict)."""
    return tuple(
        (spec_json if spec_json is not None else dumps(row[c])) if c == "spec" else row[c]
        for c in REQUEST_COLUMNS
    )


def grant_params(row: dict[str, Any], spec_json: str | None = None) -> tuple[Any, ...]:
    """Parameters of ``insert_grant`` from :func:`.serial.grant_row`."""
    out = []
    for c in GRANT_COLUMNS:
        value = row[c]
        if c == "spec" and spec_json is not None:
            value = spec_json
        elif c in _JSON_COLUMNS:
            value = dumps(value)
        out.append(value)
    return tuple(out)


def prepare_statements() -> str:
    """PostgreSQL: the ``PREPARE`` of every statement of :data:`SQL`, as one query (once per
    connection; :meth:`FastWriter.query` then sends ``EXECUTE``s)."""
    prepared = []
    for name, text in SQL.items():
        n = iter(range(1, 1000))
        numbered = "".join(f"${next(n)}" if ch == "?" else ch for ch in text)
        prepared.append(f"PREPARE gpushare_{name} AS {numbered}")
    return "; ".join(prepared)


def supported(engine: Engine) -> bool:
    """Whether :class:`FastWriter` can write for ``engine`` (else use SQLAlchemy)."""
    name, driver = engine.dialect.name, engine.dialect.driver
    if name == "sqlite":
        database = engine.url.database or ""
        return driver == "pysqlite" and database not in ("", ":memory:")
    return name == "postgresql" and driver == "psycopg2"


class FastWriter:
    """One dedicated driver connection for the broker's hot-path transactions."""

    def __init__(
        self,
        engine: Engine,
        *,
        checkpoint_interval_s: float = 1.0,
        wal_restart_bytes: int = 0,
    ) -> None:
        if not supported(engine):
            raise ValueError(f"no fast path for {engine.dialect.name}+{engine.dialect.driver}")
        self.engine = engine
        self.sqlite = engine.dialect.name == "sqlite"
        if self.sqlite:
            self.sql = dict(SQL)
        else:
            # server-side prepared statements (PREPARE once per connection, then EXECUTE):
            # PostgreSQL skips parsing and planning on every admission
            self.sql = {
                k: f"EXECUTE gpushare_{k} ({', '.join(['%s'] * v.count('?'))})"
                for k, v in SQL.items()
            }
        self.checkpoint_interval_s = checkpoint_interval_s
        self.wal_restart_bytes = wal_restart_bytes
        self.wal_restarts = 0
        self._used_at = float("inf")  # when a write last went through (monotonic)
        self._raw: Any = None  # SQLAlchemy's proxy (detached from the pool)
        self._conn: Any = None  # the driver connection
        self._cur: Any = None
        self.commits = 0
        self._checkpointer: threading.Thread | None = None
        self._stop = threading.Event()

    # -- connection ---------------------------------------------------------------------

    def _connect(self) -> Any:
        raw = self.engine.raw_connection()  # runs the engine's connect hooks (pragmas)
        conn: Any = raw.driver_connection
        raw.detach()  # ours alone from now on; closed by close()
        if self.sqlite:
            conn.isolation_level = None  # we issue BEGIN / COMMIT ourselves
            if self.checkpoint_interval_s > 0:
                conn.execute("PRAGMA wal_autocheckpoint=0")
                self._start_checkpointer()
        else:
            conn.rollback()
            conn.autocommit = True  # a multi-statement query is then one implicit transaction
            with conn.cursor() as cur:
                cur.execute(prepare_statements())
        self._raw, self._conn, self._cur = raw, conn, conn.cursor()
        return conn

    def _drop(self) -> None:
        raw, self._raw, self._conn, self._cur = self._raw, None, None, None
        if raw is not None:
            with contextlib.suppress(Exception):  # already broken
                raw.close()

    def close(self) -> None:
        self._stop.set()
        if self._checkpointer is not None:
            self._checkpointer.join(5)
            self._checkpointer = None
        self._drop()

    # -- writes -------------------------------------------------------------------------

    def write(self, statements: Sequence[tuple[str, tuple[Any, ...]]]) -> None:
        """Run ``statements`` (name, parameters) as one transaction, committed on return."""
        if not statements:
            return
        conn = self._conn if self._conn is not None else self._connect()
        cur = self._cur
        sql = self.sql
        if self.sqlite:
            try:
                conn.execute("BEGIN")
                for name, params in statements:
                    cur.execute(sql[name], params)
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
        else:
            if time.monotonic() - self._used_at > PING_AFTER_IDLE_S:
                conn, cur = self._alive(conn), self._cur
            text, params = self.query(statements)
            try:
                cur.execute(text, params)
            except BaseException:
                # the server rolled the implicit transaction back; a broken connection is
                # replaced on the next write (this change fails, as it would with SQLAlchemy)
                if conn.closed:
                    self._drop()
                raise
        self.commits += 1
        self._used_at = time.monotonic()

    def _alive(self, conn: Any) -> Any:
        """PostgreSQL: ``conn`` if it answers ``SELECT 1``, else a new connection. After a
        while idle the server may have closed it (restarted, an idle timeout): nothing of a
        change is sent on a connection that failed this, so none is lost or sent twice."""
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT 1")
            return conn
        except Exception:  # noqa: BLE001 - any failure: replace it (a failed reconnect raises)
            log.info("commits: the connection did not answer after %.0f s idle; a new one",
                     time.monotonic() - self._used_at)
            self._drop()
            return self._connect()

    def query(
        self, statements: Sequence[tuple[str, tuple[Any, ...]]]
    ) -> tuple[str, tuple[Any, ...]]:
        """PostgreSQL: ``statements`` as one simple query (``EXECUTE …; EXECUTE …``) and its
        parameters, for a connection that ran :func:`prepare_statements`."""
        sql = self.sql
        if len(statements) == 1:
            return sql[statements[0][0]], statements[0][1]
        text = "; ".join(sql[name] for name, _ in statements)
        return text, tuple(p for _, ps in statements for p in ps)

    # -- SQLite WAL checkpoints off the event loop ----------------------------------------

    def _start_checkpointer(self) -> None:
        if self._checkpointer is not None:
            return
        self._stop.clear()
        thread = threading.Thread(target=self._checkpoint_loop, name="gpushare-wal", daemon=True)
        self._checkpointer = thread
        thread.start()

    def _checkpoint_loop(self) -> None:
        database = self.engine.url.database or ""
        timeout = 30.0
        conn = sqlite3.connect(database, timeout=timeout, check_same_thread=False)
        conn.isolation_level = None
        frame = int(conn.execute("PRAGMA page_size").fetchone()[0]) + 24  # WAL frame header
        done = 0
        try:
            while not self._stop.wait(self.checkpoint_interval_s):
                if self.commits == done:
                    continue
                done = self.commits
                try:
                    self.checkpoint(conn, frame)
                except sqlite3.Error as exc:  # busy or locked: try again next time
                    log.debug("WAL checkpoint skipped: %s", exc)
            conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        except sqlite3.Error as exc:
            log.warning("WAL checkpointer stopped: %s", exc)
        finally:
            conn.close()

    def checkpoint(self, conn: sqlite3.Connection, frame_bytes: int) -> None:
        """One passive checkpoint on ``conn`` (not the writer's connection), then, when the
        WAL is past ``wal_restart_bytes``, a restart (the next commit starts it over)."""
        _busy, frames, _copied = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        if not self.wal_restart_bytes or frames * frame_bytes <= self.wal_restart_bytes:
            return
        # the restart makes writers wait while it copies what the passive pass left (what
        # was committed during it): catch up with passive passes first, each copying what
        # came during the one before, so that the restart copies almost nothing
        for _ in range(CATCH_UP_PASSES):
            conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        timeout_ms = int(conn.execute("PRAGMA busy_timeout").fetchone()[0])
        conn.execute(f"PRAGMA busy_timeout={RESTART_BUSY_MS}")
        try:
            busy = conn.execute("PRAGMA wal_checkpoint(RESTART)").fetchone()[0]
        finally:
            conn.execute(f"PRAGMA busy_timeout={timeout_ms}")
        if not busy:
            self.wal_restarts += 1
