"""The life of batch jobs in the broker: the loop that drives the backend, cancel, restarts.

A job is admitted as a ``Kind.BATCH`` request through the same path as a server (one
policy, one ledger); its grant lives exactly as long as its run:

* **submit**: validate (:mod:`.submit`), ask the broker (:meth:`Broker.submit`); a
  refusal stores no job; otherwise the job is written ``queued`` or ``admitted``;
* **loop** (:meth:`JobManager.tick`, every ``poll_interval_s``): a queued job whose request
  was granted becomes ``admitted``; an admitted one is started on the backend (``running``)
  (both: :mod:`.start`); running ones are polled; a preemption notice on a job's grant
  sends SIGTERM at once, the deadline SIGKILL (:class:`JobsBatchBackend`, called by the
  preemption runner) (all: :mod:`.watch`); an ended run releases its grant and settles the
  job; a preempted job is asked for again (``queued``, attempt + 1) once its grant is gone,
  and resumes from its checkpoint dir (both: :mod:`.outcome`); finished jobs are kept as
  long as the retention settings say (:mod:`.retention`);
* **restart** (:meth:`JobManager.recover`): runs still alive are reattached, runs that
  ended meanwhile are settled from their status file, the rest requeued or failed with a
  reason (:func:`~jupyter_gpushare.core.jobs.restart_verdict`, :mod:`.recovery`); nothing
  starts twice.

Backend calls (process start, polls, signals, file reads) run in a worker thread.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import TYPE_CHECKING, Any, cast

from ...backends.base import JobBackend
from ...core.jobs import JobState
from ...core.model import Grant, Kind
from ..service.preempt import BatchBackend
from .busy import BusyJobs
from .node_return import NodeReturn
from .outcome import JobOutcomes
from .recovery import recover
from .retention import TERMINAL_VALUES, JobRetention
from .settings import JobSettings
from .start import JobStarter
from .store import Job, JobStore, handle_of
from .watch import RunWatcher

if TYPE_CHECKING:
    from ..service.broker import Broker

__all__ = ["TERMINAL_VALUES", "JobManager", "JobsBatchBackend"]

log = logging.getLogger("gpushare.broker.jobs")

STOP_TRIES = 10  # cancels stop() sends, a second apart, before it gives up waiting
RETENTION_STOP_WAIT_S = 60.0  # how long stop() waits for a retention pass still in its thread


class JobManager(JobSettings):
    """Owner of batch jobs: their store, their runs on the backend and their grants; its
    collaborators start runs (:class:`~.start.JobStarter`), watch running ones
    (:class:`~.watch.RunWatcher`), write how a run ended (:class:`~.outcome.JobOutcomes`)
    and keep finished jobs as long as the settings say (:class:`~.retention.JobRetention`)."""

    def __init__(self, broker: Broker, backend: JobBackend | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.broker = broker
        backend_class = cast("type[JobBackend]", self.backend_class)
        self.backend = backend if backend is not None else backend_class.create(self)
        self.store = JobStore(broker.engine, broker.clock)
        self.wake = asyncio.Event()
        self.busy = BusyJobs()  # jobs with a backend call in flight
        self.outcomes = JobOutcomes(self)
        self.starter = JobStarter(self)
        self.watcher = RunWatcher(self)
        self.retainer = JobRetention(self)
        self._task: asyncio.Task[Any] | None = None
        self._retention_pass: asyncio.Future[Any] | None = None  # the pass in its thread
        self._stopping = False
        self.node_return = NodeReturn(broker, self.backend)  # resumes what _node_failed drained

    # -- paths ------------------------------------------------------------------------------

    def user_root(self, user: str) -> str:
        root = self.user_root_template.format(username=user)
        return os.path.realpath(os.path.expanduser(root))

    def output_file(self, job: Job) -> str:
        return os.path.join(self.user_root(job.user), job.output_path)

    # -- start and stop ---------------------------------------------------------------------

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        if hasattr(self.backend, "on_exit"):  # a run that ends wakes the loop at once
            self.backend.on_exit = lambda: loop.call_soon_threadsafe(self.wake.set)
        await self.recover()
        self.node_return.load()  # the nodes it drained before a restart wait again
        self._stopping = False
        self._task = asyncio.ensure_future(self._loop())

    async def stop(self) -> None:
        """End the loop (bounded: a cancel that races a wake-up is sent again) and close
        the backend; runs keep going, a restarted broker finds them again."""
        self._stopping = True
        task, self._task = self._task, None
        if task is not None:
            for _ in range(STOP_TRIES):
                task.cancel()
                await asyncio.wait({task}, timeout=1.0)
                if task.done():
                    break
            else:
                log.error("the job loop did not stop after %d cancels", STOP_TRIES)
        running = self._retention_pass
        if running is not None and not running.done():
            # a retention pass goes on in its thread after the loop's cancel: wait (bounded)
            # so that nothing is deleted after stop() returns
            await asyncio.wait({running}, timeout=RETENTION_STOP_WAIT_S)
        self.backend.close()

    async def _loop(self) -> None:
        last_retention = float("-inf")
        while not self._stopping:
            try:
                await self.tick()
                now = self.broker.clock()
                if now - last_retention >= max(1.0, self.retention_interval_s):
                    last_retention = now
                    # kept, so that stop() waits for a pass its thread is still doing
                    self._retention_pass = asyncio.ensure_future(
                        self.call_backend(self.retention, now)
                    )
                    await asyncio.shield(self._retention_pass)
            except Exception:
                log.exception("job loop failed")
            self.wake.clear()
            # not asyncio.wait_for: on Python 3.11 it swallows a cancel that arrives as the
            # wake-up completes (a run's exit wakes the loop just as stop() cancels it),
            # and then stop() waited for ever
            waiter = asyncio.ensure_future(self.wake.wait())
            try:
                await asyncio.wait({waiter}, timeout=self.poll_interval_s)
            finally:
                waiter.cancel()

    def retention(self, now: float) -> dict[str, list[str]]:
        """The periodic retention pass (:meth:`.retention.JobRetention.run`)."""
        return self.retainer.run(now)

    def sweep(self, now: float) -> list[str]:
        """Forget the files of jobs past ``log_retention_days``
        (:meth:`.retention.JobRetention.sweep`)."""
        return self.retainer.sweep(now)

    async def call_backend(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(None, fn, *args)

    # -- the loop ---------------------------------------------------------------------------

    def batch_grants(self) -> dict[str, Grant]:
        return {
            g.request.id: g
            for g in self.broker.state.grants.values()
            if g.request.kind is Kind.BATCH
        }

    def grant_of(self, job: Job) -> Grant | None:
        """The live batch grant of the job's current request, if any, from the broker's
        index of holders: its request is ``job.request_spec`` with the attempt's id (no
        pass over every live grant: 100,000 of them held the event loop ~30 ms per tick)."""
        rid = job.request_id
        spec = job.request_spec
        if not rid or not isinstance(spec, dict):
            return None
        key = (str(spec.get("kind", "interactive")), str(spec.get("user")),
               str(spec.get("holder", "")))  # fmt: skip
        grants = self.broker.state.grants
        for live_id in self.broker.holders.get(key, ()):
            grant = grants.get(live_id)
            if grant is not None and grant.request.id == rid and grant.request.kind is Kind.BATCH:
                return grant
        return None

    async def tick(self) -> None:
        """One pass over the live jobs (see the module docstring)."""
        running: list[Job] = []
        for job in list(self.store.live.values()):
            if job.id in self.busy:
                continue
            if job.state is JobState.QUEUED:
                self.starter.check_queued(job)
            elif job.state is JobState.ADMITTED:
                self._spawn(self.starter.start(job))
            elif job.state is JobState.PREEMPTED:
                self.outcomes.requeue_or_fail(job)
            elif job.state is JobState.RUNNING and self._still_held(job):
                running.append(job)
        if running:
            self._spawn(self.watcher.poll(running))
        if self.node_return.due():
            self._spawn(self.node_return.check(self.call_backend))

    def _still_held(self, job: Job) -> bool:
        """Whether a running job's grant lives on with no preemption notice unanswered;
        if not, its run is killed (grant gone) or sent SIGTERM (notice) in the background."""
        broker = self.broker
        if job.grant_id not in broker.state.grants:
            self._spawn(self.kill_for_lost_grant(job))
            return False
        if job.grant_id in broker.preempt_info and not job.preempt_signalled:
            reason = broker.preempt_info[job.grant_id][0]
            self._spawn(self.watcher.signal(job, f"preemption notice: {reason}"))
            return False
        return True

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        task.add_done_callback(_log_failure)

    async def kill_for_lost_grant(self, job: Job) -> None:
        """Kill the run of a job whose grant is gone
        (:meth:`.watch.RunWatcher.kill_for_lost_grant`)."""
        await self.watcher.kill_for_lost_grant(job)

    # -- preemption, from the broker's preemption runner ------------------------------------

    def job_of_grant(self, grant: Grant) -> Job | None:
        job = self.store.live.get(grant.request.holder)
        if job is None or job.grant_id != grant.id:
            return None
        return job

    async def preempt_now(self, grant: Grant, reason: str) -> None:
        """The grace period is over: SIGKILL the run and settle it as preempted."""
        await self.watcher.preempt_now(grant, reason)

    def holder_alive(self, grant: Grant) -> bool | None:
        """For reconcile: whether a batch grant's job exists and holds it."""
        job = self.store.live.get(grant.request.holder)
        if job is None:
            return False  # finished or never stored: the grant has no holder
        return job.grant_id == grant.id or job.request_id == grant.request.id

    # -- cancel -----------------------------------------------------------------------------

    async def cancel(self, job: Job) -> Job:
        """Cancel a queued job at once; a running one gets SIGTERM, then SIGKILL."""
        if job.terminal:
            return job
        if job.state is JobState.QUEUED:
            self._cancel_queued(job)
            return job
        if job.state is JobState.ADMITTED and job.id not in self.busy:
            self.starter.cancel_admitted(job)
            return job
        now = self.broker.clock()
        self.store.note(
            job,
            f"cancel asked: SIGTERM, SIGKILL after {self.cancel_grace_s:g}s",
            cancel_requested=True,
            handle=dict(job.handle or {}, cancel_at=now) if job.handle else job.handle,
        )
        handle = handle_of(job)
        if handle is not None:
            await self.call_backend(self.backend.signal, handle)
        self.wake.set()
        return job

    def _cancel_queued(self, job: Job) -> None:
        """Withdraw a queued job's request (or release the grant it got meanwhile)."""
        if job.request_id and (
            job.request_id in self.broker.queue or job.request_id in self.broker.pending
        ):
            self.broker.cancel(job.request_id)
        grant = self.grant_of(job)
        if grant is not None:
            self.broker.release(grant.id, "released: job cancelled")
        self.store.transition(job, JobState.CANCELLED, "cancelled while queued")

    # -- restart ----------------------------------------------------------------------------

    async def recover(self) -> list[str]:
        """After a start of the broker: settle, reattach or requeue every unfinished job
        (:func:`.recovery.recover`)."""
        return await recover(self)


def _log_failure(task: asyncio.Task[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("job task failed", exc_info=task.exception())


class JobsBatchBackend(BatchBackend):
    """The broker's batch backend hook for jobs: preemption at the deadline and liveness."""

    manager: JobManager | None = None

    async def preempt(self, grant: Grant, reason: str) -> None:
        if self.manager is not None:
            await self.manager.preempt_now(grant, reason)

    async def job_alive(self, grant: Grant) -> bool | None:
        if self.manager is None:
            return None
        return self.manager.holder_alive(grant)
