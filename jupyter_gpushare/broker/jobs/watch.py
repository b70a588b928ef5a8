"""Watching running batch jobs: polls, bounds, signals and kills.

Every pass of the job loop polls the running runs at once (one worker-thread call); for each:

* a run that ended is settled (:meth:`~.outcome.JobOutcomes.settle`), and each pool whose
  runs ended decides on its queue once;
* a run the engine still holds in its own queue says why (an event per new reason);
* a run over a size bound (``max_log_bytes``, ``max_output_bytes``) is killed and trimmed;
  one over ``max_runtime_s`` is killed; a cancelled one is killed ``cancel_grace_s`` after
  its SIGTERM;
* a preemption notice on a run's grant sends SIGTERM, the deadline SIGKILL
  (:meth:`RunWatcher.preempt_now`); a run whose grant is gone is killed.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from typing import TYPE_CHECKING

from ...backends.base import RunHandle, RunStatus
from ...core.jobs import JobState
from ...core.model import Grant
from ...userfiles import human_bytes
from .store import Job, handle_of

if TYPE_CHECKING:
    from .manager_view import JobManagerView

log = logging.getLogger("gpushare.broker.jobs")

KILL_POLLS = 50  # polls, 0.1 s apart, for a preempted run to end after its SIGKILL


class RunWatcher:
    """Watches the running runs of a :class:`~.runner.JobManager`'s jobs."""

    def __init__(self, manager: JobManagerView) -> None:
        self.manager = manager

    async def poll(self, jobs: list[Job]) -> None:
        """Poll ``jobs``' runs: settle those that ended, enforce bounds on the others."""
        m = self.manager
        with m.busy.holding(*(job.id for job in jobs)):
            polled = await m.call_backend(self._poll_all, jobs)
        now = m.broker.clock()
        pools: set[str] = set()
        for job, (status, over) in zip(jobs, polled, strict=True):
            if job.state is not JobState.RUNNING:
                continue
            if status.alive or status.alive is None:
                await self._still_running(job, status, over, now)
                continue
            m.outcomes.settle(job, status, drain=False)
            pools.add(job.pool)
        for pool in sorted(pools):  # one pass over the queue for all the runs that ended
            m.broker.drain_queue(pool)

    async def _still_running(
        self, job: Job, status: RunStatus, over: str | None, now: float
    ) -> None:
        self._engine_queue(job, status, now)
        if over and job.handle is not None and not job.handle.get("over_bound"):
            await self._stop_over_bound(job, over)
            return
        await self._enforce_limits(job, now)

    def _engine_queue(self, job: Job, status: RunStatus, now: float) -> None:
        """A run the engine still holds in its own queue (e.g. a Job Kueue has not admitted,
        a Slurm job PENDING): an event says why, once per new reason, and so does the job's
        reason; its runtime clock starts when the engine lets it run (the grant, and its
        GPU-hours, run from the broker's admission)."""
        store, handle = self.manager.store, job.handle
        if handle is None:
            return
        if status.queued:
            text = (status.reason or "waiting in the engine's queue")[:300]
            if not handle.get("engine_queued") or handle.get("engine_reason") != text:
                store.note(job, text, handle=dict(handle, engine_queued=True, engine_reason=text))
                # what the job says while it waits; a first attempt has not started yet
                first: dict[str, float | None] = {"started_at": None} if job.attempt == 1 else {}
                store.update(job, reason=text, **first)
        elif handle.get("engine_queued"):
            text = f"running on {self.manager.backend.name}: the engine admitted it"
            store.note(job, text, handle=dict(handle, engine_queued=False, started_at=now))
            first = {"started_at": now} if job.attempt == 1 else {}  # its first run
            store.update(job, reason=f"{text} (attempt {job.attempt})", **first)

    def _poll_all(self, jobs: list[Job]) -> list[tuple[RunStatus, str | None]]:
        """Each run's status and, where it runs on, the bound it passed (log, output)."""
        backend = self.manager.backend
        out: list[tuple[RunStatus, str | None]] = []
        for job in jobs:
            handle = handle_of(job)
            status = backend.poll(handle) if handle else RunStatus(alive=False)
            over = self._over_bound(job, handle) if handle and status.alive is not False else None
            out.append((status, over))
        return out

    def _over_bound(self, job: Job, handle: RunHandle) -> str | None:
        """Why the run passed a size bound (``max_log_bytes``, ``max_output_bytes``), where
        the backend can tell cheaply (a stat in the job folder, not a cluster API call)."""
        m = self.manager
        if not m.backend.sizes_are_cheap:
            return None
        if m.max_log_bytes > 0 and m.backend.log_size(job.id) > m.max_log_bytes:
            return (
                f"log exceeded JobManager.max_log_bytes = {human_bytes(m.max_log_bytes)}"
                ": the job was stopped"
            )
        if m.max_output_bytes > 0:
            size = m.backend.output_size(handle)
            if size is not None and size > m.max_output_bytes:
                return (
                    "executed notebook exceeded JobManager.max_output_bytes = "
                    f"{human_bytes(m.max_output_bytes)}: the job was stopped and its "
                    "notebook not copied into your files"
                )
        return None

    async def _stop_over_bound(self, job: Job, reason: str) -> None:
        """Kill a run over a size bound; the job fails with ``reason`` when it settles (the
        log is cut to the bound, the oversized notebook removed from the job folder)."""
        m = self.manager
        handle = handle_of(job)
        if handle is None or job.handle is None:
            return
        m.store.note(job, reason, handle=dict(job.handle, over_bound=reason))
        with m.busy.holding(job.id):
            await m.call_backend(self._kill_and_trim, handle)
        m.wake.set()

    def _kill_and_trim(self, handle: RunHandle) -> None:
        m = self.manager
        m.backend.kill(handle)
        trim = getattr(m.backend, "trim", None)
        if trim is not None:
            try:
                trim(handle, m.max_log_bytes, m.max_output_bytes)
            except OSError as exc:
                log.warning("job %s: could not trim its files: %s", handle.job_id, exc)

    async def _enforce_limits(self, job: Job, now: float) -> None:
        """Kill a run over its ``max_runtime_s`` (from when the engine let it run), or one
        cancelled longer than ``cancel_grace_s`` ago."""
        m = self.manager
        handle = handle_of(job)
        if handle is None or job.handle is None:
            return
        began = float(job.handle.get("started_at") or now)
        if (
            now - began > job.max_runtime_s
            and not job.handle.get("over_runtime")
            and not job.handle.get("engine_queued")
        ):
            m.store.update(job, handle=dict(job.handle, over_runtime=True, kill_at=now))
            await m.call_backend(m.backend.kill, handle)
            return
        cancel_at = job.handle.get("cancel_at")
        if job.cancel_requested and cancel_at and now >= float(cancel_at) + m.cancel_grace_s:
            await m.call_backend(m.backend.kill, handle)

    async def signal(self, job: Job, reason: str) -> None:
        """SIGTERM the run (e.g. a preemption notice on its grant); noted once."""
        m = self.manager
        handle = handle_of(job)
        with m.busy.holding(job.id):
            if handle is not None:
                await m.call_backend(m.backend.signal, handle)
        m.store.note(job, f"{reason}: SIGTERM sent", preempt_signalled=True)

    async def kill_for_lost_grant(self, job: Job) -> None:
        """The run's grant is gone (released, reclaimed, reconciled away): kill the run."""
        m = self.manager
        handle = handle_of(job)
        if handle is not None:
            await m.call_backend(m.backend.kill, handle)
        why = m.outcomes.release_reason(job.grant_id) or "released"
        m.store.note(job, f"its grant was released ({why}): stopped", preempt_signalled=True)

    async def preempt_now(self, grant: Grant, reason: str) -> None:
        """The grace period is over: SIGKILL the run and settle it as preempted."""
        m = self.manager
        job = m.job_of_grant(grant)
        if job is None or job.state is not JobState.RUNNING:
            return
        handle = handle_of(job)
        if not job.preempt_signalled:
            m.store.note(job, f"preemption: {reason}", preempt_signalled=True)
        if handle is None:
            return
        with m.busy.holding(job.id):
            status = await self._kill_and_wait(handle)
        if job.state is JobState.RUNNING:
            m.outcomes.settle(job, replace(status, alive=False))

    async def _kill_and_wait(self, handle: RunHandle) -> RunStatus:
        """SIGKILL the run and poll until it ends (at most ``KILL_POLLS`` times)."""
        m = self.manager
        await m.call_backend(m.backend.kill, handle)
        status = RunStatus(alive=True)
        for _ in range(KILL_POLLS):
            status = await m.call_backend(m.backend.poll, handle)
            if not status.alive:
                break
            await asyncio.sleep(0.1)
        return status
