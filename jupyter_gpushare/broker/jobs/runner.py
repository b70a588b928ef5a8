"""The life of batch jobs in the broker: admission, the loop that drives the backend, restarts.

A job is admitted as a ``Kind.BATCH`` request through the same path as a server (one
policy, one ledger); its grant lives exactly as long as its run:

* **submit**: validate (:mod:`.job_submit`), ask the broker (:meth:`Broker.submit`); a
  refusal stores no job; otherwise the job is written ``queued`` or ``admitted``;
* **loop** (:meth:`JobManager.tick`, every ``poll_interval_s``): a queued job whose request
  was granted becomes ``admitted``; an admitted one is started on the backend (``running``);
  running ones are polled; a preemption notice on a job's grant sends SIGTERM at once, the
  deadline SIGKILL (:class:`JobsBatchBackend`, called by the preemption runner); an ended
  run releases its grant and settles the job; a preempted job is asked for again
  (``queued``, attempt + 1) once its grant is gone, and resumes from its checkpoint dir;
* **restart** (:meth:`JobManager.recover`): runs still alive are reattached, runs that
  ended meanwhile are settled from their status file, the rest requeued or failed with a
  reason (:func:`~jupyter_gpushare.core.jobs.restart_verdict`); nothing starts twice.

Backend calls (process start, polls, signals, file reads) run in a worker thread. What a
run's end writes (outcome, grant release, node failure, requeue) is in :mod:`.job_outcome`.
"""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import replace
from typing import TYPE_CHECKING, Any, cast

from sqlalchemy import select

from ...backends.base import JobBackend, RunHandle, RunSpec, RunStatus
from ...core.jobs import TERMINAL, JobState
from ...core.model import UNIT, Grant, Kind
from ...userfiles import human_bytes
from ..service.preempt import BatchBackend
from ..store.db import jobs_table
from .node_return import NodeReturn
from .outcome import JobOutcomes
from .recovery import recover
from .spec import build_run_spec
from .store import Job, JobStore, handle_of

if TYPE_CHECKING:
    from ..service.broker import Broker

log = logging.getLogger("gpushare.broker.jobs")

TERMINAL_VALUES = frozenset(s.value for s in TERMINAL)
STOP_TRIES = 10  # cancels stop() sends, a second apart, before it gives up waiting
RETENTION_STOP_WAIT_S = 60.0  # how long stop() waits for a retention pass still in its thread


class JobManager(JobOutcomes):
    """Owner of batch jobs: their store, their runs on the backend and their grants
    (how a run's end is written: :class:`~.job_outcome.JobOutcomes`)."""

    def __init__(self, broker: Broker, backend: JobBackend | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.broker = broker
        backend_class = cast("type[JobBackend]", self.backend_class)
        self.backend = backend if backend is not None else backend_class.create(self)
        self.store = JobStore(broker.engine, broker.clock)
        self.wake = asyncio.Event()
        self._busy: set[str] = set()  # jobs with a backend call in flight
        self._task: asyncio.Task[Any] | None = None
        self._retention_pass: asyncio.Future[Any] | None = None  # the pass in its thread
        self._stopping = False
        self._real_gpus: bool | None = None
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
        """The periodic retention pass (only finished jobs; never a queued or running one):
        files of jobs past ``log_retention_days`` (:meth:`sweep`), then rows, history and
        files of jobs past ``job_retention_days`` and beyond ``max_jobs_kept_per_user``."""
        out: dict[str, list[str]] = {"files": [], "aged": [], "over_count": []}
        if self.log_retention_days > 0:
            out["files"] = self.sweep(now)
        if self.job_retention_days > 0:
            out["aged"] = self.store.delete_ended_before(now - self.job_retention_days * 86400)
        out["over_count"] = self.store.prune_all(self.max_jobs_kept_per_user)
        for job_id in out["aged"] + out["over_count"]:
            self.backend.forget(job_id)
        if out["aged"] or out["over_count"]:
            log.info("job retention: %d finished jobs past %g days, %d beyond %d per user "
                     "deleted", len(out["aged"]), self.job_retention_days,
                     len(out["over_count"]), self.max_jobs_kept_per_user)
        return out

    def sweep(self, now: float) -> list[str]:
        """Forget the log, snapshot and checkpoints of jobs finished longer ago than
        ``log_retention_days`` (their rows and history stay); returns their ids."""
        cutoff = now - self.log_retention_days * 86400
        with self.broker.engine.connect() as conn:
            rows = conn.execute(
                select(jobs_table.c.id, jobs_table.c.state).where(
                    jobs_table.c.ended_at.is_not(None), jobs_table.c.ended_at < cutoff,
                )
            )
            ids = [r.id for r in rows if r.state in TERMINAL_VALUES]
        for job_id in ids:
            self.backend.forget(job_id)
        return ids

    async def call_backend(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(None, fn, *args)

    # -- the loop ---------------------------------------------------------------------------

    def batch_grants(self) -> dict[str, Grant]:
        return {
            g.request.id: g for g in self.broker.state.grants.values()
            if g.request.kind is Kind.BATCH
        }

    def _grant_of(self, job: Job) -> Grant | None:
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
        broker = self.broker
        running: list[Job] = []
        for job in list(self.store.live.values()):
            if job.id in self._busy:
                continue
            if job.state is JobState.QUEUED:
                self._check_queued(job)
            elif job.state is JobState.ADMITTED:
                self._spawn(self._start(job))
            elif job.state is JobState.PREEMPTED:
                self._requeue_or_fail(job)
            elif job.state is JobState.RUNNING:
                if job.grant_id not in broker.state.grants:
                    self._spawn(self.kill_for_lost_grant(job))
                    continue
                if job.grant_id in broker.preempt_info and not job.preempt_signalled:
                    reason = broker.preempt_info[job.grant_id][0]
                    self._spawn(self._signal(job, f"preemption notice: {reason}"))
                    continue
                running.append(job)
        if running:
            self._spawn(self._poll(running))
        if self.node_return.due():
            self._spawn(self.node_return.check(self.call_backend))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        task.add_done_callback(_log_failure)

    def _check_queued(self, job: Job) -> None:
        broker = self.broker
        grant = self._grant_of(job)
        if grant is not None:
            self.store.transition(
                job, JobState.ADMITTED,
                f"admitted: granted {grant.units_milli / UNIT:g} GPU on {grant.placement.node}"
                + (" (borrowed)" if grant.borrowed else ""),
                grant_id=grant.id,
            )
            self.wake.set()
            return
        rid = job.request_id or ""
        if rid in broker.queue or rid in broker.pending:
            return
        view = broker.get_request(rid) if rid else None
        if job.cancel_requested:
            self.store.transition(job, JobState.CANCELLED, "cancelled while queued")
        elif view is not None and view["status"] == "refused":
            self.store.transition(job, JobState.FAILED, f"refused: {view['reason']}")
        elif view is not None and view["status"] == "granted" and view.get("grant_id"):
            # granted and released again before the job started (e.g. reconcile)
            self.ask_again(job, job.attempt, "its grant was released before it started")
        else:
            self.ask_again(job, job.attempt, "its request was lost: asked again")

    async def _start(self, job: Job) -> None:
        grant = self.broker.state.grants.get(job.grant_id or "")
        if grant is None:
            self.ask_again(job, job.attempt, "its grant was released before it started")
            return
        if job.cancel_requested:
            self.release_grant(job, "job cancelled")
            self.store.transition(job, JobState.CANCELLED, "cancelled before it started",
                                  grant_id=None)
            return
        self._busy.add(job.id)
        try:
            spec = await self.call_backend(self._run_spec, job, grant)
            refused = await self.call_backend(self.backend.refusal, spec)  # may ask the engine
            if refused:
                self._busy.discard(job.id)
                self.release_grant(job, f"refused by the {self.backend.name} backend")
                self.store.transition(
                    job, JobState.FAILED, f"refused by the {self.backend.name} backend: {refused}",
                    grant_id=None, error={"summary": refused},
                )
                return
            handle: RunHandle = await self.call_backend(self.backend.submit, spec)
        except Exception as exc:  # a job that cannot start fails with the reason
            self._busy.discard(job.id)
            log.exception("job %s could not start", job.id)
            self.release_grant(job, "job could not start")
            self.store.transition(
                job, JobState.FAILED, f"could not start: {exc}", grant_id=None,
                error={"summary": f"could not start: {exc}"},
            )
            return
        self._busy.discard(job.id)
        now = self.broker.clock()
        data = handle.to_json()
        data["started_at"] = now
        if job.cancel_requested:  # asked while the run was being started: no handle then
            data["cancel_at"] = now
        self.store.transition(
            job, JobState.RUNNING, f"running on {self.backend.name} (attempt {job.attempt})",
            handle=data, started_at=job.started_at or now,
        )
        if job.cancel_requested:  # SIGTERM now, SIGKILL after cancel_grace_s (_enforce_limits)
            await self.call_backend(self.backend.signal, handle)
            self.wake.set()

    def _run_spec(self, job: Job, grant: Grant) -> RunSpec:
        if self._real_gpus is None:
            from ...spawner.local import real_gpus_present

            self._real_gpus = real_gpus_present()
        return build_run_spec(self, job, grant, real_gpus=self._real_gpus)

    async def _signal(self, job: Job, reason: str) -> None:
        handle = handle_of(job)
        self._busy.add(job.id)
        try:
            if handle is not None:
                await self.call_backend(self.backend.signal, handle)
        finally:
            self._busy.discard(job.id)
        self.store.note(job, f"{reason}: SIGTERM sent", preempt_signalled=True)

    async def _poll(self, jobs: list[Job]) -> None:
        for job in jobs:
            self._busy.add(job.id)
        try:
            polled = await self.call_backend(self._poll_all, jobs)
        finally:
            for job in jobs:
                self._busy.discard(job.id)
        now = self.broker.clock()
        pools: set[str] = set()
        for job, (status, over) in zip(jobs, polled, strict=True):
            if job.state is not JobState.RUNNING:
                continue
            if status.alive or status.alive is None:
                self._engine_queue(job, status, now)
                if over and job.handle is not None and not job.handle.get("over_bound"):
                    await self._stop_over_bound(job, over)
                    continue
                await self._enforce_limits(job, now)
                continue
            self.settle(job, status, drain=False)
            pools.add(job.pool)
        for pool in sorted(pools):  # one pass over the queue for all the runs that ended
            self.broker.drain_queue(pool)

    def _engine_queue(self, job: Job, status: RunStatus, now: float) -> None:
        """A run the engine still holds in its own queue (e.g. a Job Kueue has not admitted,
        a Slurm job PENDING): an event says why, once per new reason, and so does the job's
        reason; its runtime clock starts when the engine lets it run (the grant, and its
        GPU-hours, run from the broker's admission)."""
        if job.handle is None:
            return
        if status.queued:
            text = (status.reason or "waiting in the engine's queue")[:300]
            if not job.handle.get("engine_queued") or job.handle.get("engine_reason") != text:
                self.store.note(job, text, handle=dict(job.handle, engine_queued=True,
                                                       engine_reason=text))
                # what the job says while it waits; a first attempt has not started yet
                first: dict[str, float | None] = {"started_at": None} if job.attempt == 1 else {}
                self.store.update(job, reason=text, **first)
        elif job.handle.get("engine_queued"):
            text = f"running on {self.backend.name}: the engine admitted it"
            self.store.note(job, text,
                            handle=dict(job.handle, engine_queued=False, started_at=now))
            first = {"started_at": now} if job.attempt == 1 else {}  # its first run
            self.store.update(job, reason=f"{text} (attempt {job.attempt})", **first)

    def _poll_all(self, jobs: list[Job]) -> list[tuple[RunStatus, str | None]]:
        """Each run's status and, where it runs on, the bound it passed (log, output)."""
        out: list[tuple[RunStatus, str | None]] = []
        for job in jobs:
            handle = handle_of(job)
            status = self.backend.poll(handle) if handle else RunStatus(alive=False)
            over = self._over_bound(job, handle) if handle and status.alive is not False \
                else None
            out.append((status, over))
        return out

    def _over_bound(self, job: Job, handle: RunHandle) -> str | None:
        """Why the run passed a size bound (``max_log_bytes``, ``max_output_bytes``), where
        the backend can tell cheaply (a stat in the job folder, not a cluster API call)."""
        if not self.backend.sizes_are_cheap:
            return None
        if self.max_log_bytes > 0 and self.backend.log_size(job.id) > self.max_log_bytes:
            return (f"log exceeded JobManager.max_log_bytes = {human_bytes(self.max_log_bytes)}"
                    ": the job was stopped")
        if self.max_output_bytes > 0:
            size = self.backend.output_size(handle)
            if size is not None and size > self.max_output_bytes:
                return ("executed notebook exceeded JobManager.max_output_bytes = "
                        f"{human_bytes(self.max_output_bytes)}: the job was stopped and its "
                        "notebook not copied into your files")
        return None

    async def _stop_over_bound(self, job: Job, reason: str) -> None:
        """Kill a run over a size bound; the job fails with ``reason`` when it settles (the
        log is cut to the bound, the oversized notebook removed from the job folder)."""
        handle = handle_of(job)
        if handle is None or job.handle is None:
            return
        self.store.note(job, reason, handle=dict(job.handle, over_bound=reason))
        self._busy.add(job.id)
        try:
            await self.call_backend(self._kill_and_trim, handle)
        finally:
            self._busy.discard(job.id)
        self.wake.set()

    def _kill_and_trim(self, handle: RunHandle) -> None:
        self.backend.kill(handle)
        trim = getattr(self.backend, "trim", None)
        if trim is not None:
            try:
                trim(handle, self.max_log_bytes, self.max_output_bytes)
            except OSError as exc:
                log.warning("job %s: could not trim its files: %s", handle.job_id, exc)

    async def _enforce_limits(self, job: Job, now: float) -> None:
        handle = handle_of(job)
        if handle is None or job.handle is None:
            return
        began = float(job.handle.get("started_at") or now)
        if (now - began > job.max_runtime_s and not job.handle.get("over_runtime")
                and not job.handle.get("engine_queued")):
            self.store.update(job, handle=dict(job.handle, over_runtime=True, kill_at=now))
            await self.call_backend(self.backend.kill, handle)
            return
        cancel_at = job.handle.get("cancel_at")
        if job.cancel_requested and cancel_at and now >= float(cancel_at) + self.cancel_grace_s:
            await self.call_backend(self.backend.kill, handle)

    async def kill_for_lost_grant(self, job: Job) -> None:
        handle = handle_of(job)
        if handle is not None:
            await self.call_backend(self.backend.kill, handle)
        why = self._release_reason(job.grant_id) or "released"
        self.store.note(job, f"its grant was released ({why}): stopped", preempt_signalled=True)

    # -- preemption, from the broker's preemption runner ------------------------------------

    def job_of_grant(self, grant: Grant) -> Job | None:
        job = self.store.live.get(grant.request.holder)
        if job is None or job.grant_id != grant.id:
            return None
        return job

    async def preempt_now(self, grant: Grant, reason: str) -> None:
        """The grace period is over: SIGKILL the run and settle it as preempted."""
        job = self.job_of_grant(grant)
        if job is None or job.state is not JobState.RUNNING:
            return
        handle = handle_of(job)
        if not job.preempt_signalled:
            self.store.note(job, f"preemption: {reason}", preempt_signalled=True)
        if handle is None:
            return
        self._busy.add(job.id)
        try:
            await self.call_backend(self.backend.kill, handle)
            status = RunStatus(alive=True)
            for _ in range(50):
                status = await self.call_backend(self.backend.poll, handle)
                if not status.alive:
                    break
                await asyncio.sleep(0.1)
        finally:
            self._busy.discard(job.id)
        if job.state is JobState.RUNNING:
            self.settle(job, replace(status, alive=False))

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
            if job.request_id and (job.request_id in self.broker.queue
                                   or job.request_id in self.broker.pending):
                self.broker.cancel(job.request_id)
            grant = self._grant_of(job)
            if grant is not None:
                self.broker.release(grant.id, "released: job cancelled")
            self.store.transition(job, JobState.CANCELLED, "cancelled while queued")
            return job
        if job.state is JobState.ADMITTED and job.id not in self._busy:
            self.release_grant(job, "job cancelled")
            self.store.transition(job, JobState.CANCELLED, "cancelled before it started",
                                  grant_id=None)
            return job
        now = self.broker.clock()
        self.store.note(
            job, f"cancel asked: SIGTERM, SIGKILL after {self.cancel_grace_s:g}s",
            cancel_requested=True,
            handle=dict(job.handle or {}, cancel_at=now) if job.handle else job.handle,
        )
        handle = handle_of(job)
        if handle is not None:
            await self.call_backend(self.backend.signal, handle)
        self.wake.set()
        return job

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
