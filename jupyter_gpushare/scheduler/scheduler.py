"""jupyter-scheduler's scheduler, running every job through the gpushare broker.

It keeps jupyter-scheduler's own records (its database: jobs, job definitions, the task
runner that starts scheduled runs) and replaces how a job runs: ``create_job`` sends the
notebook to the broker (``POST /jobs``, the same call the gpushare submit dialog makes) and
records the job under the broker's job id, so both UIs name it alike; a refusal raises
:class:`BrokerRefusal` with the broker's reason, which jupyter-scheduler answers as an HTTP
error the Create Job form shows. Reading a job asks the broker how its unfinished jobs stand
and maps the state back (:func:`.form.status_of`); once one ends, its executed notebook
(and HTML, and log, where asked for) is put in jupyter-scheduler's staging folder, where its
"Download job files" finds them.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Any
from urllib.parse import quote

import fsspec
from jupyter_scheduler.exceptions import InputUriError, SchedulerError
from jupyter_scheduler.models import (
    CountJobsQuery,
    CreateJob,
    CreateJobFromDefinition,
    DescribeJob,
    ListJobsQuery,
    ListJobsResponse,
    Status,
)
from jupyter_scheduler.orm import Job, JobDefinition
from jupyter_scheduler.scheduler import Scheduler
from sqlalchemy import create_engine, event
from sqlalchemy.orm import sessionmaker
from traitlets import Bool, Integer
from traitlets import Type as TType

from .broker_http import call_broker
from .form import (
    FINISHED,
    FormError,
    epoch_ms,
    message_of,
    refusal_message,
    status_of,
    submission_of,
)
from .outputs import stage_outputs

UNFINISHED = (Status.CREATED, Status.QUEUED, Status.IN_PROGRESS, Status.STOPPING)


def wal_mode(connection: Any, _record: Any) -> None:
    cursor = connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


class BrokerRefusal(SchedulerError):
    """The broker refused a job; the message is its reason (and the field it names)."""


class GPUShareScheduler(Scheduler):
    """jupyter-scheduler's ``Scheduler`` whose jobs are gpushare broker jobs."""

    task_runner_class = TType(
        allow_none=True,
        config=True,
        default_value="jupyter_gpushare.scheduler.task_runner.GPUShareTaskRunner",
        klass="jupyter_scheduler.task_runner.BaseTaskRunner",
        help="Starts the scheduled runs of job definitions; each run is one broker submission.",
    )
    list_limit = Integer(
        1000,
        config=True,
        help="How many of the user's newest broker jobs one refresh of the job list reads.",
    )

    sqlite_wal = Bool(
        True,
        config=True,
        help="On a SQLite db_url, keep jupyter-scheduler's records in WAL mode with "
        "synchronous=NORMAL: a commit no longer waits for the disk (it made Create answer "
        "25-90 ms later than the gpushare dialog here); a power cut may lose the last "
        "records, never the jobs, which the broker keeps and the gpushare panel lists.",
    )

    _db_session: Any = None

    @property
    def db_session(self) -> Any:
        if not self._db_session:
            engine = create_engine(self.db_url, echo=False)
            if engine.dialect.name == "sqlite" and self.sqlite_wal:
                event.listen(engine, "connect", wal_mode)
            self._db_session = sessionmaker(bind=engine)
        return self._db_session

    # -- creating ---------------------------------------------------------------------

    def input_path(self, model: CreateJob) -> str:
        """The notebook's path on disk: in the server's files, or a definition's staged copy."""
        if model.job_definition_id and os.path.isabs(model.input_uri):
            staged = os.path.realpath(model.input_uri)
            if staged.startswith(os.path.realpath(self.staging_path) + os.sep):
                return staged
            raise InputUriError(model.input_uri)
        if not self.file_exists(model.input_uri):
            raise InputUriError(model.input_uri)
        return os.path.join(self.root_dir, model.input_uri)

    @staticmethod
    def read_notebook(path: str, shown: str) -> dict[str, Any]:
        try:
            with open(path, encoding="utf-8") as f:
                notebook = json.load(f)
        except (OSError, ValueError) as exc:
            raise SchedulerError(f"input_uri: {shown} cannot be read as a notebook: {exc}") from exc
        if not isinstance(notebook, dict):
            raise SchedulerError(f"input_uri: {shown} is not a notebook (a JSON object)")
        return notebook

    async def submit(self, model: CreateJob, notebook: dict[str, Any]) -> dict[str, Any]:
        """The broker's job for this form, or :class:`BrokerRefusal` with its reason."""
        if model.package_input_folder:
            raise SchedulerError(
                "package_input_folder: a gpushare job runs the notebook "
                'alone; untick "Run job with input folder"'
            )
        try:
            sub = submission_of(
                model.runtime_environment_name, model.compute_type, model.parameters
            )
        except FormError as exc:
            raise SchedulerError(str(exc)) from exc
        path = "" if model.job_definition_id else model.input_uri
        answer = await call_broker(
            "POST", "/jobs", sub.to_broker(notebook, model.input_filename, path)
        )
        if answer.status != 201:
            raise BrokerRefusal(refusal_message(answer.status, answer.json()))
        job: dict[str, Any] = answer.json()
        return job

    async def create_job(self, model: CreateJob) -> str:  # type: ignore[override]
        path = self.input_path(model)
        notebook = self.read_notebook(path, model.input_uri)
        job = await self.submit(model, notebook)
        return self.record(
            model, notebook, job_id=job["id"], status=status_of(job), message=message_of(job)
        )

    def record(
        self,
        model: CreateJob,
        notebook: dict[str, Any],
        job_id: str | None,
        status: Status,
        message: str,
    ) -> str:
        """Store the job in jupyter-scheduler's records with its input staged."""
        with self.db_session() as session:
            fields = model.dict(exclude_none=True, exclude={"input_uri"})
            fields["output_formats"] = model.output_formats or []
            if job_id:
                fields["job_id"] = job_id
            row = Job(**fields, status=status, status_message=message)
            session.add(row)
            session.flush()  # the row's defaults, read below before the commit expires them
            described = DescribeJob.from_orm(row)  # (after it, reading them is a query more)
            session.commit()
            staging = self.get_staging_paths(described)
            stored_id = str(described.job_id)
        with fsspec.open(staging["input"], "w", encoding="utf-8") as f:
            json.dump(notebook, f)
        return stored_id

    async def create_job_from_definition(  # type: ignore[override]
        self,
        job_definition_id: str,
        model: CreateJobFromDefinition,
    ) -> str | None:
        definition = self.get_job_definition(job_definition_id)
        if not definition:
            return None
        attributes = definition.dict(exclude={"schedule", "timezone"}, exclude_none=True)
        attributes.update(model.dict(exclude_none=True))
        attributes["input_uri"] = self.get_staging_paths(definition)["input"]
        return await self.create_job(CreateJob(**attributes))

    # -- reading ----------------------------------------------------------------------

    async def broker_jobs(self, job_ids: list[str]) -> dict[str, dict[str, Any] | None]:
        """The broker's view of these jobs (None: the broker does not know it)."""
        if len(job_ids) == 1:
            answer = await call_broker("GET", f"/jobs/{quote(job_ids[0], safe='')}")
            if answer.status == 404:
                return {job_ids[0]: None}
            if answer.status != 200:
                raise SchedulerError(refusal_message(answer.status, answer.json()))
            return {job_ids[0]: answer.json()}
        answer = await call_broker("GET", f"/jobs?limit={self.list_limit}")
        if answer.status != 200:
            raise SchedulerError(refusal_message(answer.status, answer.json()))
        listed = {j["id"]: j for j in answer.json().get("jobs", [])}
        return {i: listed[i] for i in job_ids if i in listed}

    def unfinished_ids(self, only: str | None = None) -> list[str]:
        with self.db_session() as session:
            rows = session.query(Job.job_id).filter(Job.status.in_([str(s) for s in UNFINISHED]))
            if only is not None:
                rows = rows.filter(Job.job_id == only)
            return [r[0] for r in rows.all()]

    async def refresh(self, only: str | None = None) -> None:
        """Bring the unfinished jobs' status (or one job's) up to the broker's."""
        ids = self.unfinished_ids(only)
        if not ids:
            return
        for job_id, job in (await self.broker_jobs(ids)).items():
            if job is None:
                self.update_row(
                    job_id,
                    {
                        "status": Status.FAILED,
                        "status_message": "the gpushare broker no longer has this job",
                    },
                )
                continue
            await self.apply(job_id, job)

    async def apply(self, job_id: str, job: dict[str, Any]) -> None:
        update: dict[str, Any] = {
            "status": status_of(job),
            "status_message": message_of(job),
            "start_time": epoch_ms(job.get("started_at")),
            "end_time": epoch_ms(job.get("ended_at")),
        }
        if job.get("state") in FINISHED:
            with self.db_session() as session:
                row = session.query(Job).filter(Job.job_id == job_id).one()
                model = DescribeJob.from_orm(row)
            await stage_outputs(job_id, model.output_formats or [], self.get_staging_paths(model))
        self.update_row(job_id, {k: v for k, v in update.items() if v is not None})

    def update_row(self, job_id: str, values: dict[str, Any]) -> None:
        with self.db_session() as session:
            session.query(Job).filter(Job.job_id == job_id).update(values)
            session.commit()

    async def get_job(  # type: ignore[override]
        self,
        job_id: str,
        job_files: bool | None = True,
    ) -> DescribeJob:
        await self.refresh(job_id)
        return super().get_job(job_id, job_files)

    async def list_jobs(self, query: ListJobsQuery) -> ListJobsResponse:  # type: ignore[override]
        await self.refresh()
        return super().list_jobs(query)

    async def count_jobs(self, query: CountJobsQuery) -> int:  # type: ignore[override]
        await self.refresh()
        return super().count_jobs(query)

    # -- stopping and deleting --------------------------------------------------------

    async def cancel(self, job_id: str) -> None:
        answer = await call_broker("DELETE", f"/jobs/{quote(job_id, safe='')}")
        if answer.status not in (200, 404):
            raise SchedulerError(refusal_message(answer.status, answer.json()))

    async def stop_job(self, job_id: str) -> None:  # type: ignore[override]
        if job_id in self.unfinished_ids(job_id):
            await self.cancel(job_id)
            self.update_row(job_id, {"status": Status.STOPPING})
            await self.refresh(job_id)

    async def delete_job(self, job_id: str) -> None:  # type: ignore[override]
        if job_id in self.unfinished_ids(job_id):
            await self.cancel(job_id)
        with self.db_session() as session:
            row = session.query(Job).filter(Job.job_id == job_id).one()
            staging = self.get_staging_paths(DescribeJob.from_orm(row))
            folder = os.path.dirname(staging["input"])
            if os.path.isdir(folder):
                shutil.rmtree(folder)
            session.query(Job).filter(Job.job_id == job_id).delete()
            session.commit()

    async def delete_job_definition(self, job_definition_id: str) -> None:  # type: ignore[override]
        with self.db_session() as session:
            runs = [
                r[0]
                for r in session.query(Job.job_id)
                .filter(Job.job_definition_id == job_definition_id)
                .all()
            ]
        for job_id in runs:
            await self.delete_job(job_id)
        with self.db_session() as session:
            found = session.query(JobDefinition).filter(
                JobDefinition.job_definition_id == job_definition_id
            )
            schedule = found.with_entities(JobDefinition.schedule).scalar()
            found.delete()
            session.commit()
        if self.task_runner and schedule:
            self.task_runner.delete_job_definition(job_definition_id)
