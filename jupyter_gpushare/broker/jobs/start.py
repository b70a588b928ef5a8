"""Starting a batch job: a queued job whose request was granted becomes ``admitted``; an
admitted one is started on the backend and becomes ``running``.

A request that is no longer waiting and has no grant is settled here too: refused (the job
fails), cancelled, or lost or released before the run started (asked for again).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ...backends.base import RunHandle, RunSpec
from ...core.jobs import JobState
from ...core.model import UNIT, Grant
from .spec import build_run_spec
from .store import Job

if TYPE_CHECKING:
    from .manager_view import JobManagerView

log = logging.getLogger("gpushare.broker.jobs")


class JobStarter:
    """Takes a job from ``queued`` to ``running`` for its :class:`~.runner.JobManager`."""

    def __init__(self, manager: JobManagerView) -> None:
        self.manager = manager
        self._real_gpus: bool | None = None  # asked once, on the first start

    def check_queued(self, job: Job) -> None:
        """A queued job: ``admitted`` once its request holds a grant; otherwise, once the
        request waits no more, cancelled, failed (refused) or asked for again."""
        m = self.manager
        grant = m.grant_of(job)
        if grant is not None:
            self._admit(job, grant)
            return
        rid = job.request_id or ""
        if rid in m.broker.queue or rid in m.broker.pending:
            return
        view = m.broker.get_request(rid) if rid else None
        if job.cancel_requested:
            m.store.transition(job, JobState.CANCELLED, "cancelled while queued")
        elif view is not None and view["status"] == "refused":
            m.store.transition(job, JobState.FAILED, f"refused: {view['reason']}")
        elif view is not None and view["status"] == "granted" and view.get("grant_id"):
            # granted and released again before the job started (e.g. reconcile)
            m.outcomes.ask_again(job, job.attempt, "its grant was released before it started")
        else:
            m.outcomes.ask_again(job, job.attempt, "its request was lost: asked again")

    def _admit(self, job: Job, grant: Grant) -> None:
        self.manager.store.transition(
            job,
            JobState.ADMITTED,
            f"admitted: granted {grant.units_milli / UNIT:g} GPU on {grant.placement.node}"
            + (" (borrowed)" if grant.borrowed else ""),
            grant_id=grant.id,
        )
        self.manager.wake.set()

    async def start(self, job: Job) -> None:
        """Start an admitted job's run on the backend (unless its grant is gone, it was
        cancelled, or the backend refuses it: then it is asked again, cancelled or failed)."""
        m = self.manager
        grant = m.broker.state.grants.get(job.grant_id or "")
        if grant is None:
            m.outcomes.ask_again(job, job.attempt, "its grant was released before it started")
            return
        if job.cancel_requested:
            self.cancel_admitted(job)
            return
        try:
            with m.busy.holding(job.id):
                spec = await m.call_backend(self._run_spec, job, grant)
                refused = await m.call_backend(m.backend.refusal, spec)  # may ask the engine
                handle: RunHandle | None = (
                    None if refused else await m.call_backend(m.backend.submit, spec)
                )
        except Exception as exc:  # a job that cannot start fails with the reason
            log.exception("job %s could not start", job.id)
            self._fail(job, "job could not start", f"could not start: {exc}")
            return
        if refused:
            name = m.backend.name
            self._fail(
                job,
                f"refused by the {name} backend",
                f"refused by the {name} backend: {refused}",
                summary=refused,
            )
            return
        assert handle is not None  # submitted, since not refused
        await self._running(job, handle)

    def cancel_admitted(self, job: Job) -> None:
        """An admitted job cancelled before its run started: its grant is released."""
        self.manager.outcomes.release_grant(job, "job cancelled")
        self.manager.store.transition(
            job, JobState.CANCELLED, "cancelled before it started", grant_id=None
        )

    def _fail(self, job: Job, release: str, reason: str, *, summary: str | None = None) -> None:
        """The run did not start: release the grant, fail the job with ``reason``."""
        self.manager.outcomes.release_grant(job, release)
        self.manager.store.transition(
            job, JobState.FAILED, reason, grant_id=None, error={"summary": summary or reason}
        )

    async def _running(self, job: Job, handle: RunHandle) -> None:
        """The run started: the job is ``running`` with its handle; a cancel asked while it
        was being started is sent now (SIGTERM; SIGKILL after ``cancel_grace_s``)."""
        m = self.manager
        now = m.broker.clock()
        data = handle.to_json()
        data["started_at"] = now
        if job.cancel_requested:  # asked while the run was being started: no handle then
            data["cancel_at"] = now
        m.store.transition(
            job,
            JobState.RUNNING,
            f"running on {m.backend.name} (attempt {job.attempt})",
            handle=data,
            started_at=job.started_at or now,
        )
        if job.cancel_requested:  # SIGTERM now, SIGKILL after cancel_grace_s (the watcher)
            await m.call_backend(m.backend.signal, handle)
            m.wake.set()

    def _run_spec(self, job: Job, grant: Grant) -> RunSpec:
        if self._real_gpus is None:
            from ...spawner.local import real_gpus_present

            self._real_gpus = real_gpus_present()
        return build_run_spec(self.manager, job, grant, real_gpus=self._real_gpus)
