"""A broker's start, for its jobs: every unfinished job is settled, reattached or requeued.

What was running when the broker stopped is asked of the backend (:meth:`poll`);
:func:`~jupyter_gpushare.core.jobs.restart_verdict` decides from that and the job's state
whether it starts (again), is reattached, finished, requeued or failed. Nothing starts twice.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from ...backends.base import JobBackend, RunHandle, RunStatus
from ...core.jobs import JobState, Verdict, restart_verdict
from ...core.model import Grant
from ..service.broker import Broker
from .outcome import JobOutcomes
from .store import Job, JobStore, handle_of

log = logging.getLogger("gpushare.broker.jobs")


class Recovering(Protocol):
    """What recovery needs of the job manager (:class:`~.runner.JobManager`)."""

    broker: Broker
    backend: JobBackend
    store: JobStore
    max_attempts: int
    outcomes: JobOutcomes

    async def call_backend(self, fn: Any, *args: Any) -> Any: ...
    def batch_grants(self) -> dict[str, Grant]: ...
    async def kill_for_lost_grant(self, job: Job) -> None: ...


async def recover(manager: Recovering) -> list[str]:
    """After a start of the broker: settle, reattach or requeue every unfinished job."""
    changes: list[str] = []
    jobs = manager.store.load()
    grants = manager.batch_grants()
    for job in jobs:
        if job.state is JobState.QUEUED:
            continue  # the loop checks its request
        if job.state not in (JobState.ADMITTED, JobState.RUNNING):
            continue
        handle = handle_of(job) or RunHandle(manager.backend.name, job.id, job.attempt)
        status: RunStatus = await manager.call_backend(manager.backend.poll, handle)
        verdict = restart_verdict(
            job.state,
            status.started,
            status.alive,
            status.finished,
            job.checkpoint,
            job.attempt,
            manager.max_attempts,
        )
        live = job.grant_id in manager.broker.state.grants or job.request_id in grants
        changes.append(f"job {job.id} ({job.state.value}): {verdict.value}")
        # a running job reattached is the normal case after a restart; the rest is news
        quiet = verdict is Verdict.REATTACH and job.state is JobState.RUNNING and live
        log.log(logging.INFO if quiet else logging.WARNING, "jobs on start: %s", changes[-1])
        if verdict is Verdict.START:
            continue  # the loop starts it (or asks again if its grant is gone)
        if job.state is JobState.ADMITTED:
            # it started before the broker died but was not recorded as running
            manager.store.transition(
                job,
                JobState.RUNNING,
                "found running after a broker restart",
                handle=dict(handle.to_json(), started_at=manager.broker.clock()),
            )
        if verdict is Verdict.REATTACH:
            manager.store.note(job, "reattached after a broker restart")
            if not live:
                await manager.kill_for_lost_grant(job)
        elif verdict is Verdict.FINISH:
            manager.outcomes.settle(job, status)
        elif verdict is Verdict.REQUEUE:
            manager.outcomes.release_grant(job, "job died while the broker was down", drain=False)
            manager.outcomes.ask_again(
                job,
                job.attempt + 1,
                "its process ended while the broker was "
                "down, without a result: requeued (it checkpoints)",
            )
        else:
            hours = manager.outcomes.release_grant(job, "job died while the broker was down")
            manager.store.transition(
                job,
                JobState.FAILED,
                "its process ended while the broker was down, without a result",
                gpu_hours=job.gpu_hours + hours,
                grant_id=None,
                error={"summary": "the job's process ended while the broker was down"},
            )
    return changes
