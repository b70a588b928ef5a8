"""How a batch job's run ends in the broker: its outcome, its grant, and asking again.

:class:`JobOutcomes`, a collaborator of :class:`~.runner.JobManager`, writes what
happened once a run is over, or once its grant is gone:

* :meth:`~JobOutcomes.settle`: a run ended; its grant is released and the job's final
  state and reason written (succeeded, failed, cancelled, over its runtime, preempted),
  with the GPU-hours of the attempt;
* a run whose node was lost (e.g. Slurm NODE_FAIL) drains the node (resumed by
  :mod:`.node_return`) and is requeued as a new attempt if it checkpoints, else failed;
* a preempted job is asked for again (``queued``, attempt + 1) once its grant is gone, or
  fails after ``max_attempts``;
* asking again is a new batch request with the same spec.

The loop that drives runs is in :mod:`.runner` (starting them: :mod:`.start`; polling,
signalling and killing them: :mod:`.watch`; restart: :mod:`.recovery`).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from sqlalchemy import select

from ...backends.base import RunStatus
from ...core.jobs import JobState, final_state, may_requeue
from ...core.model import UNIT
from ..service.ids import new_id
from ..store.db import grants_table
from ..store.serial import spec_to_request
from .store import Job

if TYPE_CHECKING:
    from .manager_view import JobManagerView

log = logging.getLogger("gpushare.broker.jobs")


class JobOutcomes:
    """The outcome of a job's run: settle it, release its grant, requeue or fail it (for
    its :class:`~.runner.JobManager`, whose settings say how many attempts and jobs)."""

    def __init__(self, manager: JobManagerView) -> None:
        self.manager = manager

    def settle(self, job: Job, status: RunStatus, *, drain: bool = True) -> None:
        """A run ended: release its grant and write the job's outcome (``drain``: decide
        on the pool's queue again at once; the loop does it once for all that ended)."""
        if status.node_failed and not status.finished and not job.cancel_requested:
            self._node_failed(job, status, drain=drain)
            return
        over = bool(job.handle and job.handle.get("over_runtime"))
        bound = str((job.handle or {}).get("over_bound") or "")
        state = final_state(
            status.exit_code if status.finished else None,
            job.preempt_signalled or status.preempted,
            job.cancel_requested,
        )
        error = status.error
        if bound and not job.cancel_requested:  # over max_log_bytes or max_output_bytes
            state = JobState.FAILED
            reason = bound
            error = {"summary": bound}
        elif over and not job.cancel_requested:
            state = JobState.FAILED
            reason = f"stopped: over its maximum runtime of {job.max_runtime_s}s"
            error = {"summary": reason}
        elif state is JobState.SUCCEEDED:
            reason = "succeeded"
        elif state is JobState.CANCELLED:
            reason = "cancelled"
        elif state is JobState.PREEMPTED:
            reason = "preempted: " + (
                self.release_reason(job.grant_id) or status.reason or "its grant was reclaimed"
            )
        elif status.finished:
            reason = (error or {}).get("summary") or f"failed (exit code {status.exit_code})"
        else:  # no result: the backend's reason where it has one (e.g. Slurm NODE_FAIL)
            reason = (error or {}).get("summary") or (
                f"its process ended without a result (exit code {status.exit_code})"
            )
            error = error or {"summary": reason}
        hours = self.release_grant(
            job, f"job {state.value}", drain=drain and state is not JobState.PREEMPTED
        )
        self.manager.store.transition(
            job,
            state,
            reason,
            error=error,
            gpu_hours=job.gpu_hours + hours,
            grant_id=None,
        )
        if state in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED):
            for old in self.manager.store.prune(job.user, self.manager.max_jobs_kept_per_user):
                self.manager.backend.forget(old)

    def _node_failed(self, job: Job, status: RunStatus, *, drain: bool) -> None:
        """The run's node was lost (the backend says so, e.g. Slurm NODE_FAIL): drain the
        node in the broker (resumed once the backend has it back, :mod:`.node_return`, or
        by an admin), release the grant, and requeue a job that checkpoints as a new
        attempt, placed elsewhere; fail the others with the backend's reason."""
        node = str(status.node_failed)
        why = (status.error or {}).get("summary") or f"its node {node} failed"
        known = self.manager.broker.state.nodes.get(node)
        if known is not None and not known.cordoned:
            self.manager.broker.set_cordon(node, True, broker_drain=why[:300])
            self.manager.node_return.drained(node)
            log.warning("node %s drained: a job's run was lost with it (%s)", node, why)
        checkpoints = job.checkpoint and may_requeue(job.attempt, self.manager.max_attempts)
        hours = self.release_grant(
            job, f"job's node {node} failed", drain=drain and not checkpoints
        )
        if checkpoints:
            self.manager.store.note(
                job, f"{why}; node {node} drained", grant_id=None, gpu_hours=job.gpu_hours + hours
            )
            self.ask_again(
                job,
                job.attempt + 1,
                f"requeued after node {node} failed "
                f"(attempt {job.attempt + 1}); resumes from its checkpoint dir",
            )
            return
        self.manager.store.transition(
            job,
            JobState.FAILED,
            why,
            error=status.error,
            grant_id=None,
            gpu_hours=job.gpu_hours + hours,
        )
        for old in self.manager.store.prune(job.user, self.manager.max_jobs_kept_per_user):
            self.manager.backend.forget(old)

    def release_grant(self, job: Job, reason: str, *, drain: bool = True) -> float:
        """Release the job's grant if it still lives; the GPU-hours of this attempt."""
        now = self.manager.broker.clock()
        grant = self.manager.broker.state.grants.get(job.grant_id or "")
        if grant is not None:
            self.manager.broker.release(grant.id, f"released: {reason}", drain=drain)
            return grant.units_milli / UNIT * max(0.0, now - grant.granted_at) / 3600.0
        if not job.grant_id:
            return 0.0
        with self.manager.broker.engine.connect() as conn:
            row = conn.execute(
                select(
                    grants_table.c.units_milli,
                    grants_table.c.granted_at,
                    grants_table.c.released_at,
                ).where(grants_table.c.id == job.grant_id)
            ).first()
        if row is None:
            return 0.0
        end = row.released_at if row.released_at is not None else now
        return row.units_milli / UNIT * max(0.0, end - row.granted_at) / 3600.0

    def release_reason(self, grant_id: str | None) -> str | None:
        """Why the grant ended (or is being preempted): its notice, else its end record."""
        if not grant_id:
            return None
        info = self.manager.broker.preempt_info.get(grant_id)
        if info:
            return info[0]
        with self.manager.broker.engine.connect() as conn:
            return conn.execute(
                select(grants_table.c.release_reason).where(grants_table.c.id == grant_id)
            ).scalar()

    def requeue_or_fail(self, job: Job) -> None:
        if job.grant_id and job.grant_id in self.manager.broker.state.grants:
            self.release_grant(job, "job preempted", drain=False)
            return  # asked again on the next pass, after the preemptor got its grant
        if job.cancel_requested:
            self.manager.store.transition(job, JobState.CANCELLED, "cancelled while preempted")
        elif may_requeue(job.attempt, self.manager.max_attempts):
            self.ask_again(
                job,
                job.attempt + 1,
                f"requeued after preemption "
                f"(attempt {job.attempt + 1}); resumes from its checkpoint dir",
            )
        else:
            self.manager.store.transition(
                job,
                JobState.FAILED,
                f"preempted {job.attempt} times (max_attempts)",
            )

    def ask_again(self, job: Job, attempt: int, reason: str) -> None:
        """Queue ``job`` again with a new batch request (same spec, same age)."""
        rid = new_id("r")
        spec = dict(job.request_spec, id=rid)
        changes: dict[str, Any] = dict(
            request_id=rid,
            attempt=attempt,
            grant_id=None,
            handle=None,
            preempt_signalled=False,
        )
        if job.state is JobState.QUEUED:
            self.manager.store.note(job, reason, **changes)
        else:
            self.manager.store.transition(job, JobState.QUEUED, reason, **changes)
        view = self.manager.broker.submit(spec_to_request(spec))
        if view["status"] == "refused":
            self.manager.store.transition(job, JobState.FAILED, f"refused: {view['reason']}")
