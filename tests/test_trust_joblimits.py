"""Issue 23, finding 7: a job's log and output are bounded, finished jobs are not kept for
ever (``c.JobManager.max_log_bytes``, ``max_output_bytes``, ``job_retention_days``,
``max_jobs_kept_per_user``, ``retention_interval_s``)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import jobnotebooks as nbs
import pytest
from brokerkit import call, start_broker, static_tokens

from jupyter_gpushare.backends.base import RunHandle
from jupyter_gpushare.backends.papermill_run import deliver
from jupyter_gpushare.broker.jobs.store import Job
from jupyter_gpushare.core.jobs import JobState
from jupyter_gpushare.userfiles import OverLimit, human_bytes

POLICY = Path(__file__).resolve().parent / "data" / "jobs_policy.yaml"
DAY = 86400.0


@pytest.fixture
async def app(tmp_path: Path) -> Any:
    from jupyter_gpushare.policy import load_policy

    tokens = static_tokens({"alice": ["vision"], "bob": ["nlp"]})
    app = await start_broker(
        load_policy(str(POLICY)), f"sqlite:///{tmp_path}/jobs.sqlite", tokens,
    )
    app.jobs.user_root_template = str(tmp_path / "home" / "{username}")
    for user in ("alice", "bob"):
        (tmp_path / "home" / user).mkdir(parents=True)
    yield app
    for job in list(app.jobs.store.live.values()):
        if job.handle:
            app.jobs.backend.kill(RunHandle.from_json(job.handle))
    await app.stop_async()


async def run_to_end(app: Any, nb: dict[str, Any], **body: Any) -> Any:
    status, job = await call(app, "POST", "/jobs", "tok-alice-srv",
                             {"notebook": nb, "profile": "job-1gpu", "max_runtime": 300, **body})
    assert status == 201, job
    deadline = time.monotonic() + 120
    while True:
        _, done = await call(app, "GET", f"/jobs/{job['id']}", "tok-alice")
        if done["state"] in ("succeeded", "failed", "cancelled"):
            return done
        assert time.monotonic() < deadline, done
        await asyncio.sleep(0.2)


CHATTY = """
import sys, time
line = 'x' * 1023 + '\\n'
for i in range(4000):  # 4 MB if nothing stops it
    sys.stdout.write(line * 16)
    sys.stdout.flush()
    time.sleep(0.02)
"""

BIG_OUTPUT_THEN_SLEEP = [
    "print('y' * (1024 * 1024))",  # ~1 MiB in the executed notebook (saved after the cell)
    "import time\ntime.sleep(60)",
]


@pytest.mark.slow
async def test_a_log_over_max_log_bytes_fails_the_job_naming_the_limit(
    app: Any, tmp_path: Path
) -> None:
    app.jobs.max_log_bytes = 64 * 1024
    done = await run_to_end(app, nbs.notebook(nbs._cell(CHATTY)), output_path="chatty.ipynb")
    assert done["state"] == "failed", done
    assert done["reason"].startswith("log exceeded JobManager.max_log_bytes = 64 KiB"), done
    size = app.jobs.backend.log_size(done["id"])
    assert 64 * 1024 <= size <= 64 * 1024 + 100  # cut to the bound (and a line saying so)
    assert not app.broker.state.grants


@pytest.mark.slow
async def test_an_output_over_max_output_bytes_fails_the_job_and_is_not_copied_home(
    app: Any, tmp_path: Path
) -> None:
    app.jobs.max_output_bytes = 256 * 1024
    nb = nbs.notebook(*(nbs._cell(src) for src in BIG_OUTPUT_THEN_SLEEP))
    done = await run_to_end(app, nb, output_path="big.ipynb")
    assert done["state"] == "failed", done
    assert "JobManager.max_output_bytes = 256 KiB" in done["reason"], done
    assert not (tmp_path / "home" / "alice" / "big.ipynb").exists()
    attempt = Path(app.jobs.backend.attempt_dir(done["id"], 1))
    assert not (attempt / "output.ipynb").exists()  # the oversized copy was removed too
    status, body = await call(app, "GET", f"/jobs/{done['id']}/output", "tok-alice")
    assert status == 404, body


def test_the_runner_does_not_copy_an_output_over_the_bound(tmp_path: Path) -> None:
    local = tmp_path / "attempt" / "output.ipynb"
    local.parent.mkdir()
    local.write_text(json.dumps({"cells": [], "pad": "z" * 5000}))
    home = tmp_path / "home"
    home.mkdir()
    spec = {"output_root": str(home), "output_rel": "out.ipynb",
            "output_path": str(home / "out.ipynb"), "max_output_bytes": 4096}
    with pytest.raises(OverLimit, match="over JobManager.max_output_bytes = 4 KiB"):
        deliver(local, spec)
    assert list(home.iterdir()) == []  # neither the notebook nor a partial copy
    spec["max_output_bytes"] = 1 << 20
    deliver(local, spec)
    assert (home / "out.ipynb").read_bytes() == local.read_bytes()


def test_human_bytes_names_limits_as_an_admin_wrote_them() -> None:
    assert human_bytes(64 * 1024 * 1024) == "64 MiB"
    assert human_bytes(256 * 1024) == "256 KiB"
    assert human_bytes(1536 * 1024 * 1024) == "1.5 GiB"
    assert human_bytes(1000) == "1000 bytes"


# -- retention ---------------------------------------------------------------------------------


def _job(jid: str, user: str, state: JobState, created: float, ended: float | None) -> Job:
    return Job(
        id=jid, user=user, team="vision", name=f"{jid}.ipynb", pool="train",
        priority="research", request_spec={}, max_runtime_s=60, checkpoint=False,
        backend="local", output_path=f"{jid}.ipynb", state=state, created_at=created,
        updated_at=created, ended_at=ended,
    )


def _plant(app: Any, job: Job) -> Path:
    folder = Path(app.jobs.backend.job_dir(job.id))
    folder.mkdir(parents=True)
    (folder / "log.txt").write_text("log")
    app.jobs.store.insert(job, json.dumps(nbs.simple()), [(None, job.state.value, "planted")])
    return folder


async def test_retention_prunes_only_finished_jobs_past_their_age_or_count(app: Any) -> None:
    await app.jobs.stop()  # the pass is called here, not by the loop
    now = time.time()
    app.jobs.job_retention_days = 90
    app.jobs.log_retention_days = 30
    app.jobs.max_jobs_kept_per_user = 3
    old = _plant(app, _job("a-old", "alice", JobState.SUCCEEDED, now - 120 * DAY,
                           now - 91 * DAY))
    lost = _plant(app, _job("a-lost", "alice", JobState.LOST, now - 120 * DAY, now - 100 * DAY))
    recent = _plant(app, _job("a-recent", "alice", JobState.FAILED, now - 40 * DAY,
                              now - 40 * DAY))
    # live jobs are never removed, whatever their age (even an odd ended_at)
    queued = _plant(app, _job("a-queued", "alice", JobState.QUEUED, now - 200 * DAY, None))
    running = _plant(app, _job("a-running", "alice", JobState.RUNNING, now - 200 * DAY,
                               now - 150 * DAY))
    bob = [
        _plant(app, _job(f"b-{i}", "bob", JobState.SUCCEEDED, now - (10 - i) * DAY,
                         now - (10 - i) * DAY))
        for i in range(5)
    ]
    bob_running = _plant(app, _job("b-running", "bob", JobState.RUNNING, now - 20 * DAY, None))
    out = app.jobs.retention(now)
    # (stop() waited for a pass still in its thread: nothing was deleted behind our back)
    assert sorted(out["aged"]) == ["a-lost", "a-old"]
    assert sorted(out["over_count"]) == ["b-0", "b-1"]  # bob's oldest finished beyond 3
    assert "a-recent" in out["files"]  # its log is past 30 days: files go, its row stays
    gone = {"a-old", "a-lost", "b-0", "b-1"}
    for folder in (old, lost, recent, queued, running, *bob, bob_running):
        assert folder.exists() == (folder.name not in gone | {"a-recent"}), folder
    store = app.jobs.store
    for jid in ("a-recent", "a-queued", "a-running", "b-2", "b-3", "b-4", "b-running"):
        assert store.get(jid) is not None, jid
        assert store.events(jid), jid
    for jid in gone:
        assert store.get(jid) is None and store.events(jid) == [], jid
    # a second pass finds nothing more to delete
    again = app.jobs.retention(now)
    assert again["aged"] == [] and again["over_count"] == []


async def test_the_job_loop_runs_the_retention_pass_on_its_own(app: Any) -> None:
    now = time.time()
    app.jobs.retention_interval_s = 1.0
    _plant(app, _job("a-ancient", "alice", JobState.CANCELLED, now - 400 * DAY, now - 400 * DAY))
    deadline = time.monotonic() + 10
    while app.jobs.store.get("a-ancient") is not None:
        assert time.monotonic() < deadline, "the retention pass did not run"
        await asyncio.sleep(0.2)
    assert not Path(app.jobs.backend.job_dir("a-ancient")).exists()
