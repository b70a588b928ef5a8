"""The broker's writes: its database handles and the group commits of the hot path.

:class:`Writes` owns the SQLAlchemy engine's fast path (:class:`~..store.fastsql.FastWriter`,
one transaction per change through the driver), the commit pipeline that groups those
changes (:mod:`..store.commitpipe`; ``None`` until :meth:`Writes.start`), and the answers to
admissions whose commit is still in flight (found by idempotency key before the database
has them). It knows nothing of grants or requests: the lifecycle hands it statements.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from contextvars import ContextVar
from typing import Any

from sqlalchemy import Engine, event

from ..store import fastsql
from ..store.commitasync import AsyncCommits
from ..store.commitloop import LoopCommits
from ..store.commitpipe import CommitFailed, CommitPipeline, Statements, ThreadCommits

TASK_WRITES: ContextVar[tuple[int, int] | None] = ContextVar("gpushare_task_writes", default=None)
"""The first and last sequence numbers of the changes the current asyncio task (a request's
handler: tornado runs each in a task of its own) enqueued for a group commit."""


class Writes:
    """The database handles of the broker and the group commits of its fast-path writes."""

    def __init__(
        self,
        engine: Engine,
        *,
        raw_sql: bool = True,
        checkpoint_interval_s: float = 1.0,
        wal_restart_bytes: int = 0,
    ) -> None:
        self.engine = engine
        # hot-path writes through the driver (one transaction each); None: SQLAlchemy only
        self.fast: fastsql.FastWriter | None = (
            fastsql.FastWriter(
                engine,
                checkpoint_interval_s=checkpoint_interval_s,
                wal_restart_bytes=wal_restart_bytes,
            )
            if raw_sql and fastsql.supported(engine)
            else None
        )
        # the group commits of those writes (None: each commits on the caller's thread)
        self.commits: CommitPipeline | None = None
        # the last database probe of /health (database_problem)
        self._probe: asyncio.Future[str | None] | None = None
        self._probed_at = float("-inf")
        self._probe_answer: str | None = None
        # (user, idempotency key) -> (sequence number, answer) of admissions not yet durable
        self.unsettled_keys: OrderedDict[tuple[str, str], tuple[int, dict[str, Any]]] = (
            OrderedDict()
        )

    async def database_problem(self, timeout_s: float = 3.0) -> str | None:
        """What is wrong with the database now (writes refused after a failed commit, no
        answer to ``SELECT 1``, no answer within ``timeout_s``), else ``None``. The probe
        runs on a worker thread, at most one at a time, its answer kept for a second."""
        refused = self.refused_because
        if refused is not None:
            return refused
        now = time.monotonic()
        if now - self._probed_at < 1.0 and self._probe is None:
            return self._probe_answer
        if self._probe is None:
            self._probe = asyncio.ensure_future(asyncio.to_thread(self._select_one))
        try:
            answer = await asyncio.wait_for(asyncio.shield(self._probe), timeout_s)
        except asyncio.TimeoutError:
            return f"the database did not answer SELECT 1 within {timeout_s:.0f} s"
        self._probe, self._probed_at, self._probe_answer = None, time.monotonic(), answer
        return answer

    def database_failed(self, why: str) -> None:
        """A request found the database unreachable: ``/health`` says so until its next
        probe (a second from now) finds it answering."""
        self._probed_at, self._probe_answer = time.monotonic(), why

    def _select_one(self) -> str | None:
        """``SELECT 1`` on a connection of the pool (not waiting for the commit queue)."""
        try:
            bypass = self.commits.bypass() if self.commits is not None else nullcontext()
            with bypass, self.engine.connect() as conn:
                conn.exec_driver_sql("SELECT 1")
        except Exception as exc:  # noqa: BLE001 - any failure is the answer
            first = str(exc).splitlines()[0] if str(exc) else repr(exc)
            return f"{type(exc).__name__}: {first}"
        return None

    @property
    def refused_because(self) -> str | None:
        """Why writes are refused now (a failed commit not yet recovered from: the database
        cannot be reached or the state is being rebuilt from it), else ``None``."""
        return self.commits.broken if self.commits is not None else None

    # -- group commits ----------------------------------------------------------------------

    def start(
        self,
        loop: asyncio.AbstractEventLoop,
        mode: str,
        after_failure: Callable[[], None],
    ) -> None:
        """Commit the fast-path writes in groups from now on, on a writer thread
        (``thread``, :mod:`..store.commitpipe`), on ``loop`` without waiting (``async``,
        PostgreSQL only, :mod:`..store.commitasync`) or on ``loop`` right after the turn that
        queued them (``loop``, :mod:`..store.commitloop`); every SQLAlchemy transaction on
        the engine first waits for the queue to be empty. ``after_failure`` runs on the loop
        after a failed commit (the broker rebuilds its state, then calls ``resume``)."""
        if self.fast is None:
            raise ValueError("group commits need the fast path (raw_sql)")
        if self.commits is not None:
            return
        if mode == "async":
            if self.engine.dialect.name != "postgresql":
                raise ValueError(f"async commits need PostgreSQL, not {self.engine.dialect.name}")
            self.commits = AsyncCommits(self.fast, loop, after_failure)
        elif mode == "thread":
            self.commits = ThreadCommits(self.fast, loop, after_failure)
        elif mode == "loop":
            self.commits = LoopCommits(self.fast, loop, after_failure)
        else:
            raise ValueError(f"unknown commit mode {mode!r} (thread, async, loop)")
        event.listen(self.engine, "begin", self._wait_for_commits)

    def _wait_for_commits(self, conn: object) -> None:
        commits = self.commits
        if commits is not None:
            commits.flush()

    def close(self) -> None:
        """Commit what is queued, then close the fast-path connection (and its threads)."""
        stopped = True
        if self.commits is not None:
            event.remove(self.engine, "begin", self._wait_for_commits)
            stopped = self.commits.close()
            self.commits = None
        if self.fast is not None and stopped:
            self.fast.close()

    # -- one change ---------------------------------------------------------------------------

    def write(self, statements: Statements) -> int:
        """Write one change through the fast path: committed before this returns, or, with
        the group commits, enqueued (raises before enqueueing while a failed commit is being
        recovered from, so the caller applies nothing). Returns the change's sequence number
        in the group commits (0: already committed); the changes of the current task (a
        request's handler) are remembered for :meth:`durable`."""
        assert self.fast is not None
        if self.commits is None:
            self.fast.write(statements)
            return 0
        seq = self.commits.write(statements)
        span = TASK_WRITES.get()
        TASK_WRITES.set((span[0] if span else seq, seq))
        return seq

    async def durable(self, everything: bool = False) -> None:
        """Return once every change the current task made (``everything``: every change
        enqueued so far) is committed; raises :class:`~..store.commitpipe.CommitFailed` if
        one of the current task's changes failed. Handlers await this before they answer."""
        commits = self.commits
        if commits is None:
            return
        span = TASK_WRITES.get()
        if everything:
            await commits.wait()
        if span is not None:
            await commits.wait(span[1])
            _raise_if_failed(commits, span)

    def ensure_durable(self) -> None:
        """:meth:`durable` for the current task's changes, blocking (for an answer sent
        without awaiting it)."""
        commits = self.commits
        span = TASK_WRITES.get()
        if commits is None or span is None:
            return
        if not commits.check(span[1]):
            commits.flush()
        _raise_if_failed(commits, span)

    def after_durable(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` once every change enqueued so far is durable (at once without the
        group commits; never if one of them fails): what the outside world is told."""
        if self.commits is None:
            callback()
        else:
            self.commits.on_durable(self.commits.enqueued, callback)

    def reading_committed(self) -> AbstractContextManager[None]:
        """A block whose database reads take what is committed, without waiting for the
        commit queue (:meth:`~..store.commitpipe.CommitPipeline.bypass`)."""
        return self.commits.bypass() if self.commits is not None else nullcontext()

    # -- answers in flight --------------------------------------------------------------------

    def unsettled_answer(self, user: str, key: str) -> dict[str, Any] | None:
        """The answer to an admission with this idempotency key whose commit is still in
        flight (the database does not have it yet); forgets those that have settled."""
        commits = self.commits
        keys = self.unsettled_keys
        if commits is None:
            return None
        while keys:
            first = next(iter(keys))
            seq = keys[first][0]
            try:
                if not commits.check(seq):
                    break
            except CommitFailed:
                pass
            del keys[first]
        hit = keys.get((user, key))
        return hit[1] if hit is not None else None


def _raise_if_failed(commits: CommitPipeline, span: tuple[int, int]) -> None:
    """A 503 if one of the changes numbered ``span`` (first, last) failed."""
    why = commits.failed_within(*span)
    if why is not None:
        raise CommitFailed(why)
