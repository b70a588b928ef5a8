"""Group commits sent by the event loop itself, without waiting (PostgreSQL).

:class:`~.commitpipe.ThreadCommits` moves the commit's round trip off the loop onto a
thread, but on a broker that has one core the thread does not add a core: it adds two
hand-offs of the interpreter lock, a wake-up of the thread and one of the loop per group
(measured at 500 admissions/s on one core: 14-17 % of the core in the thread, 10-14
context switches per admission between the two threads, the loop waiting for its core
14-17 % of the time). PostgreSQL's protocol does not need
a thread to avoid waiting: psycopg2's asynchronous connections send a query and return, and
tell when the answer is in through their socket, which the loop watches like any other.

:class:`AsyncCommits` therefore keeps everything on the loop:

* a change is enqueued (:meth:`~.commitpipe.CommitPipeline.write`); if no group is in
  flight, the queue is sent at once as **one** query (``EXECUTE …; EXECUTE …``, prepared
  statements on an autocommit connection, which PostgreSQL runs as one implicit transaction
  and commits before it answers), and the loop goes on serving requests;
* when the answer arrives (the socket is readable), the group is durable: its waiters are
  resolved and whatever queued meanwhile goes as the next group (group commit, at most
  :data:`~.commitpipe.MAX_GROUP` changes);
* an error (the server restarted, a constraint) fails the group and everything behind it,
  exactly as on the thread (503 to their clients, state rebuilt from the database); the
  connection is closed and a new one opened for the next group.

What must block still blocks, as with the thread: :meth:`flush` (every SQLAlchemy
transaction of the broker calls it first) waits on the socket until the queue is committed
(on a worker thread, such as a read in ``run_in_executor``, it waits for the loop to commit
it instead). Only the loop touches the connection.
Opening the connection (at start, and after a failure) also blocks, for at most
:data:`CONNECT_TIMEOUT_S`.
"""

from __future__ import annotations

import select
import time
from typing import Any

from .commitpipe import OnLoopCommits, Statements, log
from .fastsql import prepare_statements

CONNECT_TIMEOUT_S = 10.0
"""How long opening the writer's connection (and preparing its statements) may take."""

_POLL_OK, _POLL_READ, _POLL_WRITE = 0, 1, 2  # psycopg2.extensions.POLL_*


class AsyncCommits(OnLoopCommits):
    """Group commits on the event loop through a non-blocking psycopg2 connection; opens
    it at once (blocking, at most :data:`CONNECT_TIMEOUT_S`)."""

    def _start(self) -> None:
        super()._start()
        self._group: list[tuple[int, Statements]] | None = None  # the one in flight
        self._conn: Any = None
        self._cur: Any = None
        self._watched: int | None = None  # _POLL_READ or _POLL_WRITE: what the loop waits for
        self._fd = -1
        self._open()

    # -- the connection -----------------------------------------------------------------

    def _open(self) -> None:
        import psycopg2

        engine = self.writer.engine
        cargs, cparams = engine.dialect.create_connect_args(engine.url)
        deadline = time.monotonic() + CONNECT_TIMEOUT_S
        conn = psycopg2.connect(*cargs, **cparams, async_=True)
        try:
            _wait(conn, deadline)
            cur = conn.cursor()
            cur.execute(prepare_statements())
            _wait(conn, deadline)
        except BaseException:
            conn.close()
            raise
        self._conn, self._cur, self._fd = conn, cur, conn.fileno()
        # watched for as long as it is open (two system calls per group saved): readable
        # with no group in flight means the server said something of its own (it closes)
        self.loop.add_reader(self._fd, self._ready)
        self._watched = _POLL_READ

    def _close(self) -> None:
        self._unwatch()
        conn, self._conn, self._cur = self._conn, None, None
        if conn is not None:
            try:
                conn.close()
            except Exception as exc:  # already broken
                log.debug("commits: closing the writer's connection: %s", exc)

    # -- sending and answers ------------------------------------------------------------

    def _kick(self) -> None:
        if not self._on_loop():  # a write from a worker thread
            self._call_on_loop(self._kick)
        elif self._send():
            self._advance(block=False)

    def _send(self) -> bool:
        """Send the queue as the next group, unless one is in flight; whether one was sent."""
        if self._group is not None or not self._queue or self.broken is not None:
            return False
        with self._lock:
            group = self._take_group()
        try:
            if self._conn is None:
                self._open()
            text, params = self.writer.query([s for _, change in group for s in change])
            self._cur.execute(text, params)
        except Exception as exc:
            self._lost(group, exc)
            return False
        self._group = group
        return True

    def _advance(self, *, block: bool) -> None:
        """Read what the server sent; once the group's answer is complete, finish it and
        send the next. Without ``block``, the loop is asked to call again when the socket
        is ready; with it, wait here (:meth:`_drain`)."""
        while self._group is not None:
            try:
                state = self._conn.poll()
            except Exception as exc:
                group, self._group = self._group, None
                self._lost(group, exc)
                return
            if state == _POLL_OK:
                group, self._group = self._group, None
                self._committed(group)
                self._send()  # what queued meanwhile: polled on the next turn
                continue
            if not block:
                self._watch(state)
                return
            readable = [self._fd] if state == _POLL_READ else []
            writable = [self._fd] if state == _POLL_WRITE else []
            select.select(readable, writable, [])
        if self._conn is not None:
            self._watch(_POLL_READ)

    def _ready(self) -> None:
        if self._group is not None:
            self._advance(block=False)
            return
        try:  # nothing in flight: read what came (a notice, the server closing)
            self._conn.poll()
        except Exception as exc:
            log.warning("commits: the writer's connection was lost (%s); a new one next", exc)
            self._close()

    def _watch(self, state: int) -> None:
        if self._watched == state:
            return
        self._unwatch()
        if state == _POLL_READ:
            self.loop.add_reader(self._fd, self._ready)
        else:
            self.loop.add_writer(self._fd, self._ready)
        self._watched = state

    def _unwatch(self) -> None:
        if self._watched == _POLL_READ:
            self.loop.remove_reader(self._fd)
        elif self._watched == _POLL_WRITE:
            self.loop.remove_writer(self._fd)
        self._watched = None

    def _lost(self, group: list[tuple[int, Statements]], exc: BaseException) -> None:
        """``group``'s commit failed: fail it and all behind it; a fresh connection next."""
        self._close()
        self._fail(group[0][0], exc)

    # -- blocking -----------------------------------------------------------------------

    def _drain_on_loop(self, target: int) -> None:
        while not self._settled(target):
            if self._group is None and not self._send():
                break  # nothing left to send (it failed: settled)
            self._advance(block=True)

    def close(self, timeout: float = 30.0) -> bool:
        with self._lock:
            self._stopping = True
        try:
            if self.broken is None:
                self._drain()
        except Exception as exc:
            log.error("commits: the last group did not commit on stop: %s", exc)
        self._close()
        return True


def _wait(conn: Any, deadline: float) -> None:
    """Block until ``conn``'s operation in progress (connect, a query) is done."""
    while True:
        state = conn.poll()
        if state == _POLL_OK:
            return
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the database did not answer in time")
        fd = conn.fileno()
        readable = [fd] if state == _POLL_READ else []
        select.select(readable, [fd] if state == _POLL_WRITE else [], [], left)
