"""jupyter-scheduler's task runner for scheduled job definitions, each run one broker
submission: a run the broker admits or queues is a job like any other; a run it refuses is
kept as a failed job whose message is the broker's reason, so the definition's run list
says why that run did not happen."""

from __future__ import annotations

import asyncio
from typing import Any

from jupyter_scheduler.exceptions import SchedulerError
from jupyter_scheduler.models import CreateJob, Status
from jupyter_scheduler.task_runner import TaskRunner

from .form import message_of, status_of


class GPUShareTaskRunner(TaskRunner):
    """jupyter-scheduler's ``TaskRunner`` submitting each due run to the broker."""

    def __init__(self, scheduler: Any, config: Any = None) -> None:
        super().__init__(scheduler, config=config)
        self.pending: set[asyncio.Task[str]] = set()

    def create_job(self, job_definition_id: str) -> None:
        definition = self.scheduler.get_job_definition(job_definition_id)
        if not definition or not definition.active:
            return
        model = CreateJob(
            **definition.dict(exclude={"schedule", "timezone"}, exclude_none=True),
            input_uri=self.scheduler.get_staging_paths(definition)["input"],
        )
        task = asyncio.get_running_loop().create_task(self.run_once(model))
        self.pending.add(task)
        task.add_done_callback(self.pending.discard)

    async def run_once(self, model: CreateJob) -> str:
        """Submit one run; a refusal is recorded as a failed run with the broker's reason."""
        scheduler = self.scheduler
        path = scheduler.input_path(model)
        notebook = scheduler.read_notebook(path, model.input_filename)
        try:
            job = await scheduler.submit(model, notebook)
        except SchedulerError as exc:
            self.log.warning("scheduled run of %s refused: %s", model.job_definition_id, exc)
            return str(scheduler.record(model, notebook, None, Status.FAILED, str(exc)))
        return str(scheduler.record(model, notebook, job["id"], status_of(job), message_of(job)))
