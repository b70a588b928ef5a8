"""Issue 23, findings 5 and 6 and the jobs rules: what ``POST /jobs`` refuses before it
holds a GPU share, and what a requeue resets.

An in-process broker runs the small policy of ``data/jobs_policy.yaml`` with an inert
backend: it is the local backend (so the broker knows which kernels are installed) that
starts nothing, so admitted jobs stay "running" and no kernel process is spent.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import jobnotebooks as nbs
import pytest
from brokerkit import call, start_broker, static_tokens
from sqlalchemy import select
from traitlets.config import Config

from jupyter_gpushare.backends.base import RunHandle, RunSpec, RunStatus
from jupyter_gpushare.backends.local import LocalBackend
from jupyter_gpushare.broker.jobs.store import Job
from jupyter_gpushare.broker.jobs.submit import installed_kernels
from jupyter_gpushare.broker.store.db import jobs_table
from jupyter_gpushare.core.jobs import (
    JobLimits,
    JobState,
    RuntimeRules,
    may_requeue,
    parameter_name_error,
    validate_runtime,
)
from jupyter_gpushare.policy import load_policy

POLICY = Path(__file__).resolve().parent / "data" / "jobs_policy.yaml"


class InertBackend(LocalBackend):
    """The local backend (same name, same folders) whose runs never start a process."""

    def submit(self, spec: RunSpec) -> RunHandle:
        self.attempt_dir(spec.job_id, spec.attempt).mkdir(parents=True, exist_ok=True)
        return RunHandle(self.name, spec.job_id, spec.attempt, {"inert": True})

    def poll(self, handle: RunHandle) -> RunStatus:
        return RunStatus(alive=True, started=True)

    def signal(self, handle: RunHandle) -> None:
        return None

    def kill(self, handle: RunHandle) -> None:
        return None


async def _start(tmp_path: Path, limits: dict[str, Any] | None = None, **jobs: Any) -> Any:
    config = Config()
    for key, value in (limits or {}).items():
        setattr(config.BrokerLimits, key, value)
    config.JobManager.backend_class = InertBackend
    config.JobManager.user_root_template = str(tmp_path / "home" / "{username}")
    for key, value in jobs.items():
        setattr(config.JobManager, key, value)
    for user in ("alice", "bob"):
        (tmp_path / "home" / user).mkdir(parents=True)
    return await start_broker(
        load_policy(str(POLICY)), f"sqlite:///{tmp_path}/jobs.sqlite",
        static_tokens({"alice": ["vision"], "bob": ["nlp"]}), config=config,
    )


@pytest.fixture
async def app(tmp_path: Path) -> Any:
    app = await _start(tmp_path)
    yield app
    await app.stop_async()


async def submit(app: Any, nb: dict[str, Any] | None = None, token: str = "tok-bob",
                 **body: Any) -> tuple[int, Any]:
    body.setdefault("profile", "job-1gpu")
    body.setdefault("max_runtime", 300)
    return await call(app, "POST", "/jobs", token, {"notebook": nb or nbs.simple(), **body})


async def assert_nothing_stored(app: Any) -> None:
    assert (await call(app, "GET", "/jobs?all=1", "tok-admin"))[1]["jobs"] == []
    assert not app.broker.state.grants and not app.broker.queue


# -- finding 5: parameter names ----------------------------------------------------------------


@pytest.mark.parametrize("name", ["class", "None", "True", "lambda", "import", "1x", "a-b",
                                  "ﬁle", ""])
def test_a_parameter_name_that_cannot_be_assigned_is_refused(name: str) -> None:
    assert parameter_name_error(name) is not None


@pytest.mark.parametrize("name", ["lr", "_", "match", "type", "case", "épsilon", "x" * 100])
def test_a_parameter_name_python_can_assign_is_accepted(name: str) -> None:
    assert parameter_name_error(name) is None
    exec(compile(f"{name} = 1", "<injected>", "exec"), {})  # what papermill writes


async def test_keyword_parameter_names_are_refused_at_submit(app: Any) -> None:
    for name in ("class", "None", "x" * 101):
        status, answer = await submit(app, parameters={name: 1, "ok": 2})
        assert status == 400, answer
        assert answer["field"].startswith("parameters.") and len(answer["field"]) < 60, answer
        assert name[:40] in answer["field"]
    too_many = {f"p{i}": i for i in range(65)}
    status, answer = await submit(app, parameters=too_many)
    assert (status, answer["field"]) == (400, "parameters")
    status, answer = await submit(app, parameters={"big": "x" * 20000})
    assert (status, answer["field"]) == (400, "parameters") and "bytes" in answer["error"]
    await assert_nothing_stored(app)
    status, answer = await submit(app, parameters={"match": 1, "lr": 0.1})
    assert status == 201, answer


# -- finding 6: the kernel ---------------------------------------------------------------------


async def test_a_notebook_without_kernelspec_is_refused_before_any_grant(app: Any) -> None:
    nb = nbs.simple()
    nb["metadata"] = {}
    status, answer = await submit(app, nb, name="train.ipynb")
    assert (status, answer["field"]) == (400, "notebook.metadata.kernelspec"), answer
    assert "train.ipynb" in answer["error"] and "kernelspec" in answer["error"]
    nb["metadata"] = {"kernelspec": {"display_name": "Python 3"}}
    status, answer = await submit(app, nb, path="dir/exp.ipynb")
    assert (status, answer["field"]) == (400, "notebook.metadata.kernelspec.name"), answer
    assert "dir/exp.ipynb" in answer["error"]
    await assert_nothing_stored(app)


async def test_a_kernel_not_installed_where_jobs_run_is_refused(app: Any) -> None:
    nb = nbs.simple()
    nb["metadata"]["kernelspec"]["name"] = "julia-1.9"
    status, answer = await submit(app, nb, name="jl.ipynb")
    assert (status, answer["field"]) == (400, "notebook.metadata.kernelspec.name"), answer
    assert "julia-1.9" in answer["error"] and "python3" in answer["error"], answer
    await assert_nothing_stored(app)
    nb["metadata"]["kernelspec"]["name"] = "Python3"  # kernel names are case-insensitive
    status, answer = await submit(app, nb)
    assert status == 201, answer


async def test_a_cluster_backend_cannot_know_the_kernels_and_does_not_guess(app: Any) -> None:
    app.jobs.backend.name = "elsewhere"  # e.g. Slurm: kernels are installed on its nodes
    nb = nbs.simple()
    nb["metadata"]["kernelspec"]["name"] = "julia-1.9"
    status, answer = await submit(app, nb, backend="elsewhere")
    assert status == 201, answer
    nb["metadata"] = {}  # but it must still name one
    status, answer = await submit(app, nb, backend="elsewhere")
    assert (status, answer["field"]) == (400, "notebook.metadata.kernelspec"), answer


async def test_jobs_run_as_their_user_may_use_their_own_kernels(app: Any) -> None:
    assert "python3" in (installed_kernels(app.jobs) or ())
    app.jobs.backend.run_as = "user"  # the broker (root) does not read the user's home
    assert installed_kernels(app.jobs) is None


# -- the checkpoint rule per priority class, at the exact threshold -----------------------------

RULES_RESEARCH = RuntimeRules(profile_max_s=3600, priority_preemptible=True,
                              checkpoint_required_after_s=600, grace_period_s=3)


@pytest.mark.parametrize(("runtime", "checkpoint", "preemptible", "refused"), [
    (600, False, True, False),  # at the threshold: not "longer than"
    (601, False, True, True),  # one second past it, preemptible, no checkpoints: refused
    (601, True, True, False),  # ... fine once it checkpoints
    (3600, False, False, False),  # a non-preemptible class never needs checkpoints
])
def test_checkpoint_rule_at_its_threshold(
    runtime: int, checkpoint: bool, preemptible: bool, refused: bool,
) -> None:
    rules = dataclasses.replace(RULES_RESEARCH, priority_preemptible=preemptible)
    bad = validate_runtime(runtime, checkpoint, rules, JobLimits())
    assert (bad is not None) == refused, bad
    if refused:
        assert bad is not None and bad.field == "checkpoint" and "600" in bad.message


async def test_checkpoint_rule_per_priority_class_through_submit(app: Any) -> None:
    # research (preemptible, checkpoints required after 10 min) and training (not preemptible)
    status, answer = await submit(app, max_runtime=601)
    assert (status, answer["field"]) == (400, "checkpoint"), answer
    await assert_nothing_stored(app)
    status, answer = await submit(app, max_runtime=600)
    assert status == 201 and answer["priority"] == "research", answer
    status, answer = await submit(app, max_runtime=3600, priority="training")
    assert status == 201 and answer["checkpoint"] is False, answer
    status, answer = await submit(app, max_runtime=601, checkpoint=True)
    assert status == 201, answer


# -- the per-user job cap at its exact boundary ------------------------------------------------


async def test_the_per_user_job_cap_admits_the_nth_and_refuses_the_next(tmp_path: Path) -> None:
    app = await _start(tmp_path, max_queued_per_user=3)
    try:
        for _ in range(3):
            status, answer = await submit(app)
            assert status == 201, answer
        stored = len(app.jobs.store.live)
        status, answer = await submit(app)
        assert status == 429 and answer["field"] == "max_queued_per_user", answer
        assert "3" in answer["error"] and len(app.jobs.store.live) == stored == 3
        assert (await submit(app, token="tok-alice"))[0] == 201  # another user's own count
    finally:
        await app.stop_async()


# -- what a requeue resets and what it keeps ---------------------------------------------------


def _db_job(app: Any, job_id: str) -> Job:
    with app.broker.engine.connect() as conn:
        row = conn.execute(select(jobs_table).where(jobs_table.c.id == job_id)).first()
    assert row is not None
    return Job.from_row(row)


async def _preempted(app: Any, **body: Any) -> Job:
    status, answer = await submit(app, checkpoint=True, parameters={"lr": 0.5}, **body)
    assert status == 201 and answer["state"] == "admitted", answer
    job = app.jobs.store.live[answer["id"]]
    ckpt = Path(app.jobs.backend.checkpoint_dir(job.id))
    ckpt.mkdir(parents=True, exist_ok=True)
    (ckpt / "state.pt").write_text("step 41")
    app.jobs.store.update(job, gpu_hours=0.25, preempt_signalled=True)
    app.broker.release(job.grant_id, "released: preempted for a test")
    app.jobs.store.transition(job, JobState.PREEMPTED, "preempted for a test")
    return job


async def test_a_requeue_resets_the_attempt_and_grant_and_keeps_the_rest(app: Any) -> None:
    job = await _preempted(app)
    before = dataclasses.replace(job)
    app.jobs.outcomes.requeue_or_fail(job)  # no await before the checks: the job loop cannot run
    for seen in (job, _db_job(app, job.id)):
        assert seen.attempt == before.attempt + 1 == 2
        assert seen.state is JobState.QUEUED and "attempt 2" in seen.reason
        assert seen.grant_id is None and seen.handle is None
        assert seen.preempt_signalled is False
        assert seen.request_id and seen.request_id != before.request_id
        # kept: what it runs, with what, its age in the queue and its GPU-hours so far
        assert seen.parameters == {"lr": 0.5} and seen.checkpoint is True
        assert seen.max_runtime_s == before.max_runtime_s
        assert seen.output_path == before.output_path
        assert seen.created_at == before.created_at
        assert seen.gpu_hours == pytest.approx(0.25)
    spec = dict(job.request_spec)
    assert spec["created_at"] == before.request_spec["created_at"]
    checkpoint = Path(app.jobs.backend.checkpoint_dir(job.id)) / "state.pt"
    assert checkpoint.read_text() == "step 41"
    asked = app.broker.get_request(job.request_id, durable=False)
    assert asked is not None and asked["status"] in ("queued", "granted"), asked


async def test_a_requeue_at_max_attempts_fails_instead(tmp_path: Path) -> None:
    app = await _start(tmp_path, max_attempts=2)
    try:
        job = await _preempted(app)
        app.jobs.store.update(job, attempt=2)  # its last attempt was preempted
        app.jobs.outcomes.requeue_or_fail(job)
        assert job.state is JobState.FAILED and "max_attempts" in job.reason
        assert _db_job(app, job.id).state is JobState.FAILED
        assert may_requeue(1, 2) and not may_requeue(2, 2)
    finally:
        await app.stop_async()


# -- finding 8: a job submission counts against the user's request rate ---------------------------


async def test_job_submissions_take_the_request_rate_tokens(tmp_path: Path) -> None:
    app = await _start(tmp_path, {"requests_per_minute_per_user": 1.0,
                                  "request_burst_per_user": 2})
    try:
        assert (await submit(app, profile="debug-quarter", max_runtime=60))[0] == 201
        status, answer = await submit(app, profile="debug-quarter", max_runtime=60)
        assert status == 409 and answer["state"] == "refused", answer  # a row all the same
        rows = len(app.broker.list_requests(user="bob"))
        status, answer = await submit(app, profile="debug-quarter", max_runtime=60)
        assert status == 429 and answer["code"] == "requests_per_minute_per_user", answer
        assert len(app.broker.list_requests(user="bob")) == rows == 2
        assert len(app.jobs.store.live) == 1
        status, answer = await submit(app, parameters={"class": 1})  # refused first: free
        assert status == 400, answer
    finally:
        await app.stop_async()
