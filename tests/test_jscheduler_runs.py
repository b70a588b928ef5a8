"""Scheduled runs of a jupyter-scheduler job definition, each one broker submission (issue
25, item 2): jupyter-scheduler's own task runner (its queue and ``process_queue``) with
:class:`GPUShareTaskRunner`, in this process against a real broker; a run the broker admits
is a broker job, a run it refuses is kept as a failed run with the broker's reason. And the
form's fields as broker fields (pure)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import jobnotebooks as nbs
import pytest
from brokerkit import BASE, call, start_broker, static_tokens
from jupyter_scheduler.models import CreateJobDefinition, ListJobsQuery, Status
from jupyter_scheduler.orm import create_tables
from jupyter_scheduler.task_runner import JobDefinitionTask, UpdateJobDefinitionCache

from jupyter_gpushare.policy import load_policy
from jupyter_gpushare.scheduler import (
    GPUShareEnvironmentManager,
    GPUShareScheduler,
    GPUShareTaskRunner,
)
from jupyter_gpushare.scheduler.form import (
    FormError,
    message_of,
    parse_duration,
    parse_flag,
    status_of,
    submission_of,
)

POLICY = Path(__file__).resolve().parent / "data" / "jobs_policy.yaml"


@pytest.fixture
async def broker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    app = await start_broker(
        load_policy(str(POLICY)),
        f"sqlite:///{tmp_path}/b.sqlite",
        static_tokens({"alice": ["vision"]}),
    )
    app.jobs.user_root_template = str(tmp_path / "{username}")
    (tmp_path / "alice").mkdir()
    monkeypatch.setenv("GPUSHARE_BROKER_URL", f"http://127.0.0.1:{app.port}{BASE}")
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "tok-alice-srv")
    yield app
    _, jobs = await call(app, "GET", "/jobs", "tok-alice")
    for job in jobs["jobs"]:
        if job["state"] not in ("succeeded", "failed", "cancelled"):
            await call(app, "DELETE", f"/jobs/{job['id']}", "tok-alice")
    await app.stop_async()


def make_scheduler(tmp: Path) -> GPUShareScheduler:
    root = tmp / "root"
    root.mkdir()
    (root / "sleep.ipynb").write_text(json.dumps(nbs.sleeping(60)))
    db = f"sqlite:///{tmp}/scheduler.sqlite"
    create_tables(db)
    return GPUShareScheduler(
        root_dir=str(root),
        environments_manager=GPUShareEnvironmentManager(),
        db_url=db,
        staging_path=str(tmp / "staging"),
    )


async def run_due(scheduler: GPUShareScheduler, definition_id: str) -> None:
    """Make the definition due now and let jupyter-scheduler's queue start its run."""
    runner = scheduler.task_runner
    assert isinstance(runner, GPUShareTaskRunner)
    runner.cache.update(definition_id, UpdateJobDefinitionCache(next_run_time=0))
    runner.queue.push(JobDefinitionTask(job_definition_id=definition_id, next_run_time=0))
    runner.process_queue()
    await asyncio.gather(*runner.pending)


async def test_each_scheduled_run_is_admitted_on_its_own(tmp_path: Path, broker: Any) -> None:
    scheduler = make_scheduler(tmp_path)
    definition_id = scheduler.create_job_definition(
        CreateJobDefinition(
            input_uri="sleep.ipynb",
            name="nightly",
            runtime_environment_name="debug-quarter",
            compute_type="interactive",
            output_formats=["ipynb"],
            schedule="0 3 * * *",
            timezone="UTC",
        )
    )
    await run_due(scheduler, definition_id)
    (first,) = (await scheduler.list_jobs(ListJobsQuery())).jobs
    assert first.job_definition_id == definition_id
    status, job = await call(broker, "GET", f"/jobs/{first.job_id}", "tok-alice")
    assert status == 200 and job["profile"] == "debug-quarter", job
    # vision's 1/4 debug GPU is now taken and the debug pool never queues: the next run is
    # refused, and kept as a failed run that says why
    await run_due(scheduler, definition_id)
    jobs = (await scheduler.list_jobs(ListJobsQuery())).jobs
    (refused,) = [j for j in jobs if j.job_id != first.job_id]
    assert refused.status == Status.FAILED
    assert refused.status_message.startswith("gpushare broker refused the job (409): ")
    _, listed = await call(broker, "GET", "/jobs", "tok-alice")
    assert [j["id"] for j in listed["jobs"]] == [first.job_id]
    await scheduler.stop_job(first.job_id)
    for _ in range(300):  # up to a minute on a loaded machine (SIGTERM, then SIGKILL)
        if (await scheduler.get_job(first.job_id)).status == Status.STOPPED:
            break
        await asyncio.sleep(0.2)
    assert (await scheduler.get_job(first.job_id)).status == Status.STOPPED
    await run_due(scheduler, definition_id)  # the quota is free again: admitted
    jobs = (await scheduler.list_jobs(ListJobsQuery())).jobs
    assert len(jobs) == 3
    _, listed = await call(broker, "GET", "/jobs", "tok-alice")
    assert len(listed["jobs"]) == 2
    (third,) = [j for j in jobs if j.job_id not in (first.job_id, refused.job_id)]
    # deleting the definition deletes its runs' records and cancels the one still running
    await scheduler.delete_job_definition(definition_id)
    assert (await scheduler.list_jobs(ListJobsQuery())).jobs == []
    for _ in range(300):
        _, job = await call(broker, "GET", f"/jobs/{third.job_id}", "tok-alice")
        if job["state"] == "cancelled":
            break
        await asyncio.sleep(0.2)
    assert job["state"] == "cancelled", job


def test_the_records_commit_without_waiting_for_the_disk(tmp_path: Path) -> None:
    scheduler = make_scheduler(tmp_path)
    with scheduler.db_session() as session:
        mode = session.connection().exec_driver_sql("PRAGMA journal_mode").scalar()
        sync = session.connection().exec_driver_sql("PRAGMA synchronous").scalar()
    assert (mode, sync) == ("wal", 1)  # 1 = NORMAL


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("300", 300),
        ("90m", 5400),
        ("2h", 7200),
        ("1.5 h", 5400),
        ("1d", 86400),
        ("45s", 45),
    ],
)
def test_runtime_parameter_reads_seconds_and_units(text: str, seconds: int) -> None:
    assert parse_duration("gpushare_max_runtime", text) == seconds


@pytest.mark.parametrize("text", ["", "soon", "-5", "2 weeks", "0.2"])
def test_a_bad_runtime_names_the_parameter(text: str) -> None:
    with pytest.raises(FormError, match="^gpushare_max_runtime: "):
        parse_duration("gpushare_max_runtime", text)


def test_checkpoint_flag_and_papermill_values() -> None:
    assert parse_flag("gpushare_checkpoint", "Yes") is True
    assert parse_flag("gpushare_checkpoint", "false") is False
    with pytest.raises(FormError, match="gpushare_checkpoint: 'maybe'"):
        parse_flag("gpushare_checkpoint", "maybe")
    sub = submission_of(
        "job-1gpu",
        "research",
        {
            "gpushare_max_runtime": "2h",
            "gpushare_checkpoint": "true",
            "n": "3",
            "words": "hello there",
            "xs": "[1, 2]",
        },
    )
    assert (sub.profile, sub.priority, sub.max_runtime, sub.checkpoint) == (
        "job-1gpu",
        "research",
        7200,
        True,
    )
    assert sub.parameters == {"n": 3, "words": "hello there", "xs": [1, 2]}
    body = sub.to_broker({"cells": []}, "a.ipynb", "work/a.ipynb")
    assert (
        body["max_runtime"] == 7200
        and body["checkpoint"] is True
        and body["path"] == "work/a.ipynb"
    )
    plain = submission_of("job-1gpu", None, None).to_broker({}, "a.ipynb", "")
    assert "priority" not in plain and "max_runtime" not in plain and "path" not in plain
    with pytest.raises(FormError, match="^environment: "):
        submission_of("", None, None)


@pytest.mark.parametrize(
    ("state", "status"),
    [
        ("queued", Status.QUEUED),
        ("admitted", Status.QUEUED),
        ("preempted", Status.QUEUED),
        ("running", Status.IN_PROGRESS),
        ("succeeded", Status.COMPLETED),
        ("failed", Status.FAILED),
        ("lost", Status.FAILED),
        ("cancelled", Status.STOPPED),
    ],
)
def test_broker_states_map_to_jupyter_scheduler_status(state: str, status: Status) -> None:
    assert status_of({"state": state}) == status


def test_the_message_carries_the_queue_position_and_the_failure() -> None:
    queued = {"state": "queued", "reason": "waiting for 1 GPU", "position": 2, "pool": "train"}
    assert message_of(queued) == "gpushare queued: waiting for 1 GPU; position 2 in the train queue"
    failed = {"state": "failed", "reason": "a cell raised", "error": {"summary": "ValueError: x"}}
    assert message_of(failed) == "gpushare failed: a cell raised; ValueError: x"
