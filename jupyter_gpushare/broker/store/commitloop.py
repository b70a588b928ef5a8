"""Group commits made by the event loop itself, right after the turn that queued them (SQLite).

SQLite commits in the broker's own process: there is no round trip to hide, but each commit
writes every page its transaction touched to the WAL, a system call or two per page. With
100,000 live grants a change's commit took 0.26-0.31 ms of the loop's CPU; committed one at
a time, at 500 server restarts per second (a release and an admission each) that was 26-31 %
of the broker's core (``py-spy``: ``COMMIT`` 31 % and the statements 11 % of its samples),
and a loop that busy queues the requests behind it. Changes made in the same turn of the
loop share pages (the tables' last pages, the upper levels of the indices), and a restart's
two changes are made in the same turn: one commit for all of them costs less than one each
(measured: a group of 2.4 changes on average 0.48-0.56 ms; in the closed loop, where groups
are large, 0.53 ms of broker CPU per admission instead of 0.74-0.81).

:class:`LoopCommits` therefore commits on the loop, without a thread:

* a change is enqueued (:meth:`~.commitpipe.CommitPipeline.write`) and applied in memory;
  the first change of a turn schedules one callback (``call_soon``);
* that callback runs once the loop has finished the callbacks that were ready with it (the
  requests read in the same turn), and commits everything queued as **one** transaction
  (at most :data:`~.commitpipe.MAX_GROUP` changes, then the next group at once);
* the waiters are then resolved and their handlers answer on the next turn; a failed commit
  fails the group and everything behind it, exactly as with the other committers (503 to
  their clients, state rebuilt from the database).

:meth:`flush` (every SQLAlchemy transaction of the broker calls it first) commits what is
queued at once when called on the loop; on a worker thread it waits for the loop to do it.
Only the loop touches the writer's connection.
"""

from __future__ import annotations

from .commitpipe import OnLoopCommits


class LoopCommits(OnLoopCommits):
    """Group commits by the event loop, at the end of the turn that queued them."""

    def _start(self) -> None:
        super()._start()
        self._scheduled = False  # a _commit_queued callback is on the loop's ready queue

    def _kick(self) -> None:
        if not self._on_loop():  # a write from a worker thread
            self._call_on_loop(self._kick)
        elif self.loop.is_closed():  # the broker's loop is gone (its last writes, on stop)
            self._commit_queued()
        elif not self._scheduled:
            self._scheduled = True
            self.loop.call_soon(self._commit_queued)

    def _commit_queued(self) -> None:
        """Commit everything queued, in groups of at most ``max_group`` (on the loop)."""
        self._scheduled = False
        while self._queue and self.broken is None:
            with self._lock:
                group = self._take_group()
            try:
                self.writer.write([s for _, change in group for s in change])
            except Exception as exc:  # the whole group, and all behind it, fail
                self._fail(group[0][0], exc)
                return
            self._committed(group)

    def _drain_on_loop(self, target: int) -> None:
        self._commit_queued()

    def close(self, timeout: float = 30.0) -> bool:
        with self._lock:
            self._stopping = True
        if self._on_loop() or not self.loop.is_running():
            self._commit_queued()
        return True
