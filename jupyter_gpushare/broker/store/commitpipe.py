"""Group commits: the hot-path writes are queued in order and committed without the event
loop waiting for them.

Without it, every admission waits on the event loop for its commit (:class:`~.fastsql.
FastWriter`), which on PostgreSQL is a round trip to the server: 0.3 ms on average and
2-3 ms at the 99th percentile on a loaded machine, during which no other request is read.
With it, a change is still decided, written and applied in one step on the loop, but
"written" means *queued*:

1. the core decides against the in-memory state;
2. the change's statements are **enqueued** (:meth:`CommitPipeline.write`), which returns
   at once with the change's sequence number; if the pipeline is broken it raises instead,
   and nothing is applied;
3. the change is applied to memory at once, so the next decision sees it (decisions stay
   serialised on the loop with no lock, exactly as before);
4. the handler **answers only once the change is durable** (:meth:`CommitPipeline.wait`):
   a client is never told about a grant that a ``kill -9`` could lose.

What waits in the queue is committed as **one** transaction (group commit, at most
:data:`MAX_GROUP` changes): under load one round trip serves many admissions. Changes are
committed in the order they were enqueued, so the database goes through the same states
as memory, only later. Three committers share this bookkeeping: :class:`ThreadCommits`, a
writer thread (any database of the fast path); :class:`~.commitasync.AsyncCommits`,
which sends the groups from the event loop itself over PostgreSQL's non-blocking protocol
(no thread, no hand-offs of the interpreter lock: the default on PostgreSQL); and
:class:`~.commitloop.LoopCommits`, which commits on the loop once per turn (SQLite's
default: its commit is a write to a local file, but one commit per turn writes the pages
the turn's changes share only once).

Three rules keep every other write consistent with the queue:

* **Any SQLAlchemy transaction on the broker's engine first waits for the queue to be
  empty** (a ``begin`` listener, :meth:`CommitPipeline.flush`): a cancel never updates a row
  whose insert is still queued, a read finds every change already answered (idempotency
  keys), and a job's row is never durable before its grant's.
* **A failed commit fails every change not yet durable**: their waiters get a 503, new
  writes and every SQLAlchemy transaction are refused (503) until the broker has rebuilt
  its state from the database (:meth:`~.service.Broker.load`, scheduled on the loop by the
  pipeline), after which the pipeline resumes. Memory never keeps what the database does
  not, and nothing durable is built on a lost change (a job's row on its lost grant).
* **A request is answered for its own changes** (:data:`~.base.TASK_WRITES`, per asyncio
  task): it waits for them, and gets a 503 if any of them failed, even when later changes
  of others committed after the recovery.

The cost: a database transaction on the loop (a heartbeat, a request's poll) waits for the
commit in flight, if any, before its own (about one round trip more than before).

What another client may see: a GET answered from memory can show a change whose commit is
still in flight (for about one round trip). A crash in that window loses the change; its
own client was not answered, and retries with its idempotency key. What the broker tells
the outside world on its own (a preemption's notice to its victims) waits for the commit
(:meth:`CommitPipeline.on_durable`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ctypes
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from ..errors import BrokerError
from .fastsql import FastWriter

log = logging.getLogger("gpushare.broker.db")

MAX_GROUP = 256
"""The most changes one group commit carries (a bound on one transaction's size)."""

FAILURES_KEPT = 64
"""How many failed ranges of sequence numbers are remembered (failures are rare)."""

Statements = Sequence[tuple[str, tuple[Any, ...]]]


class CommitFailed(BrokerError):
    """The database did not take a change: nothing of it was kept (HTTP 503)."""

    def __init__(self, cause: BaseException | str) -> None:
        super().__init__(
            503,
            f"the database did not take this change, so nothing was kept: {cause}",
            code="db_unavailable",
            headers={"Retry-After": "1"},
        )


class CommitPipeline:
    """Changes queued in order, committed in groups; what the loop waits on and checks.

    This class holds the bookkeeping (sequence numbers, failures, waiters); a subclass
    commits: :class:`ThreadCommits` on a writer thread (any database of the fast path),
    :class:`~.commitasync.AsyncCommits` on the event loop itself with PostgreSQL's
    non-blocking protocol, :class:`~.commitloop.LoopCommits` on the event loop once per
    turn. ``on_failure`` is called on the event loop after a failed
    commit; it must rebuild the broker's state from the database and then call
    :meth:`resume`.
    """

    def __init__(
        self,
        writer: FastWriter,
        loop: asyncio.AbstractEventLoop,
        on_failure: Callable[[], None],
        *,
        max_group: int = MAX_GROUP,
    ) -> None:
        self.writer = writer
        self.loop = loop
        self.on_failure = on_failure
        self.max_group = max_group
        self._lock = threading.Condition()
        self._queue: collections.deque[tuple[int, Statements]] = collections.deque()
        self.enqueued = 0  # the last sequence number handed out
        self.durable = 0  # the last change of the last group committed (failures: _failed)
        self._failed: collections.deque[tuple[int, int, str]] = collections.deque(
            maxlen=FAILURES_KEPT
        )
        self.broken: str | None = None  # why writes are refused (until resume)
        self.groups = 0  # group commits done
        self.in_flight = 0  # changes of the group being committed
        self.largest_group = 0
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._after: list[tuple[int, Callable[[], None]]] = []  # see on_durable (loop only)
        self._wake_scheduled = False
        self._stopping = False
        self._local = threading.local()
        self._start()

    # -- the loop's side ----------------------------------------------------------------

    def write(self, statements: Statements) -> int:
        """Enqueue one change (one transaction's statements); return its sequence number.
        Raises :class:`CommitFailed` (nothing enqueued) while the pipeline is broken."""
        with self._lock:
            if self.broken is not None:
                raise CommitFailed(self.broken)
            if self._stopping:
                raise CommitFailed("the broker is stopping")
            self.enqueued += 1
            self._queue.append((self.enqueued, statements))
            seq = self.enqueued
        self._kick()
        return seq

    def check(self, seq: int) -> bool:
        """Whether change ``seq`` is durable; raises :class:`CommitFailed` if it failed."""
        with self._lock:
            why = self._failure(seq, seq)
            if why is not None:
                raise CommitFailed(why)
            return seq <= self.durable

    async def wait(self, seq: int | None = None) -> None:
        """Return once change ``seq`` (default: every change enqueued so far) is durable;
        raise :class:`CommitFailed` if its commit failed."""
        seq = self.enqueued if seq is None else seq
        if self.check(seq):
            return
        # no race with the committer: a commit after check() schedules _wake, which runs on
        # this loop after the append below
        future: asyncio.Future[None] = self.loop.create_future()
        self._waiters.append((seq, future))
        await future

    def on_durable(self, seq: int, callback: Callable[[], None]) -> None:
        """Call ``callback`` on the loop once change ``seq`` is durable (now, if it is);
        never, if it fails."""
        try:
            if self.check(seq):
                callback()
                return
        except CommitFailed:
            return
        self._after.append((seq, callback))

    def flush(self) -> None:
        """Block until every change enqueued so far is committed; raise
        :class:`CommitFailed` while a failed commit is being recovered from, so that no
        transaction is built on changes that were lost (SQLAlchemy transactions call this
        first). A no-op inside :meth:`bypass` (and on the writer thread). It waits as long
        as the database takes, as a commit on the loop did."""
        if getattr(self._local, "skip", False) or self._on_committer():
            return
        self._drain()
        if self.broken is not None:
            raise CommitFailed(self.broken)

    def failed_within(self, first: int, last: int) -> str | None:
        """Why a change numbered ``first`` to ``last`` failed, if one did."""
        with self._lock:
            return self._failure(first, last)

    def _failure(self, first: int, last: int) -> str | None:
        """Why a change in ``first..last`` failed, if one did (the lock held)."""
        for low, high, why in self._failed:
            if low <= last and first <= high:
                return why
        return None

    @contextlib.contextmanager
    def bypass(self) -> Iterator[None]:
        """Within this block, this thread's SQLAlchemy transactions neither wait for the
        queue nor fail while it is broken (a read of durable rows whose caller looks at the
        changes still queued itself; the rebuild after a failed commit)."""
        self._local.skip = True
        try:
            yield
        finally:
            self._local.skip = False

    def _settled(self, seq: int) -> bool:
        return self.durable >= seq or self._failure(seq, seq) is not None

    @property
    def backlog(self) -> int:
        """Changes applied in memory whose commit is queued or under way."""
        return len(self._queue) + self.in_flight

    def resume(self) -> None:
        """Accept writes again (after the state was rebuilt from the database)."""
        with self._lock:
            self.broken = None
        log.warning("commits: state rebuilt from the database; writes accepted again")

    def close(self, timeout: float = 30.0) -> bool:
        """Commit what is queued, then stop; ``False`` if a commit is still under way after
        ``timeout`` (its connection must then be left alone)."""
        raise NotImplementedError

    # -- what a committer provides ------------------------------------------------------

    def _start(self) -> None:
        """Get ready to commit (the end of ``__init__``)."""
        raise NotImplementedError

    def _kick(self) -> None:
        """A change was enqueued (called on the loop, the lock not held)."""
        raise NotImplementedError

    def _drain(self) -> None:
        """Block until every change enqueued so far is durable or failed."""
        raise NotImplementedError

    def _on_committer(self) -> bool:
        """Whether the caller is the committer itself (its own transactions never wait)."""
        return False

    def _call_on_loop(self, callback: Callable[[], None]) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed (the broker stopped)
            self.loop.call_soon_threadsafe(callback)

    # -- shared by the committers -------------------------------------------------------

    def _take_group(self) -> list[tuple[int, Statements]]:
        """The next group: up to ``max_group`` changes from the queue's head (lock held)."""
        group: list[tuple[int, Statements]] = []
        while self._queue and len(group) < self.max_group:
            group.append(self._queue.popleft())
        self.in_flight = len(group)
        return group

    def _committed(self, group: list[tuple[int, Statements]]) -> None:
        """``group`` is durable: advance, and have the loop resolve its waiters."""
        with self._lock:
            self.durable = group[-1][0]
            self.in_flight = 0
            self.groups += 1
            self.largest_group = max(self.largest_group, len(group))
            self._lock.notify_all()
        self._announce()

    def _announce(self) -> None:
        """Have the loop resolve the waiters (from the committer: once per burst)."""
        with self._lock:
            schedule = not self._wake_scheduled and not self.loop.is_closed()
            self._wake_scheduled = self._wake_scheduled or schedule
        if schedule:
            self._call_on_loop(self._wake)

    def _fail(self, first: int, exc: BaseException) -> None:
        """The commit of the group starting at ``first`` failed: it fails, with every change
        queued behind it; writes are refused until the loop has rebuilt the state."""
        why = f"{type(exc).__name__}: {exc}".strip()[:500]
        log.error("commits: a group commit failed (%s); changes %d.. fail", why, first)
        with self._lock:
            last = self.enqueued
            self._queue.clear()
            self.in_flight = 0
            self._failed.append((first, last, why))
            self.broken = why
            self._lock.notify_all()
        self._call_on_loop(self._failed_on_loop)

    def _wake(self) -> None:
        """Resolve the waiters whose change is now durable or failed (on the loop)."""
        self._wake_scheduled = False
        if self._after:
            self._run_after()
        self._resolve_waiters()

    def _resolve_waiters(self) -> None:
        if not self._waiters:
            return
        keep: list[tuple[int, asyncio.Future[None]]] = []
        for seq, future in self._waiters:
            if future.done():
                continue
            try:
                durable = self.check(seq)
            except CommitFailed as exc:
                future.set_exception(exc)
                continue
            if durable:
                future.set_result(None)
            else:
                keep.append((seq, future))
        self._waiters = keep

    def _run_after(self) -> None:
        due, self._after = self._after, []
        for seq, callback in due:
            try:
                durable = self.check(seq)
            except CommitFailed:
                continue  # its change was lost: what it would announce did not happen
            if not durable:
                self._after.append((seq, callback))
                continue
            try:
                callback()
            except Exception:
                log.exception("commits: a callback after a commit failed")

    def _failed_on_loop(self) -> None:
        self._wake()
        self.on_failure()


class OnLoopCommits(CommitPipeline):
    """What the committers that commit on the event loop itself share
    (:class:`~.commitasync.AsyncCommits`, :class:`~.commitloop.LoopCommits`): they are built
    on the loop, only the loop touches their connection, a worker thread's blocking flush
    waits for the loop to commit, and waiters are resolved where the commit ends."""

    def _start(self) -> None:
        self._loop_thread = threading.get_ident()  # built on the loop (BrokerApp.start_async)

    def _on_loop(self) -> bool:
        return threading.get_ident() == self._loop_thread

    def _drain(self) -> None:
        target = self.enqueued
        if not self._on_loop():
            # a transaction on a worker thread (run_in_executor): the loop commits the queue
            with self._lock:
                self._lock.wait_for(lambda: self._settled(target))
            return
        self._drain_on_loop(target)

    def _drain_on_loop(self, target: int) -> None:
        """Commit on the loop, blocking, until change ``target`` is durable or failed."""
        raise NotImplementedError

    def _announce(self) -> None:
        # on the loop already: resolve the waiters now (their tasks run on the loop's next
        # turn, one turn sooner than through a callback); what waits to tell the outside
        # world (on_durable) runs in a callback of its own, outside the committer's code
        self._resolve_waiters()
        if self._after and not self._wake_scheduled:
            self._wake_scheduled = True
            self._call_on_loop(self._wake)


class ThreadCommits(CommitPipeline):
    """One writer thread that commits queued changes in order, in groups (any database of
    the fast path; it holds the interpreter lock while it builds and sends a group)."""

    def _start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="gpushare-commit", daemon=True)
        self._thread.start()

    def _kick(self) -> None:
        with self._lock:
            self._lock.notify()

    def _on_committer(self) -> bool:
        return threading.current_thread() is self._thread

    def _drain(self) -> None:
        with self._lock:
            target = self.enqueued
            self._lock.wait_for(lambda: self._settled(target))

    def close(self, timeout: float = 30.0) -> bool:
        with self._lock:
            self._stopping = True
            self._lock.notify()
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.error("commits: the writer thread is still committing after %.0f s", timeout)
            return False
        return True

    def _next_group(self) -> list[tuple[int, Statements]] | None:
        with self._lock:
            self._lock.wait_for(lambda: bool(self._queue) or self._stopping)
            if not self._queue:
                return None  # stopping, nothing left
            return self._take_group()

    def _run(self) -> None:
        name_this_thread(b"gpushare-commit")
        while True:
            group = self._next_group()
            if group is None:
                return
            statements = [s for _, change in group for s in change]
            try:
                self.writer.write(statements)
            except BaseException as exc:  # the whole group, and all behind it, fail
                self._fail(group[0][0], exc)
                continue
            self._committed(group)


def name_this_thread(name: bytes) -> None:
    """Give the calling thread a name the system shows (``top -H``, ``/proc/PID/task/TID/comm``;
    Linux only, at most 15 bytes; elsewhere nothing happens)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(15, ctypes.c_char_p(name[:15]), 0, 0, 0)  # PR_SET_NAME
