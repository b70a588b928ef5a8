"""A job cancelled after its admission but before its run started gives its grant back at
once (the job loop's start and the cancel call both; no test covered either before: a
cancel that left the grant held until the next reconcile passed them all).

An in-process broker on the small two-team jobs policy; the job loop's pass is held back
so that the job stays ``admitted`` for the cancel (nothing is started on the backend)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jobnotebooks as nbs
import pytest
from brokerkit import call, start_broker, static_tokens

from jupyter_gpushare.policy import load_policy

POLICY = Path(__file__).resolve().parent / "data" / "jobs_policy.yaml"


@pytest.fixture
async def app(tmp_path: Path) -> Any:
    tokens = static_tokens({"alice": ["vision"]})
    app = await start_broker(load_policy(str(POLICY)), f"sqlite:///{tmp_path}/jobs.sqlite", tokens)
    app.jobs.user_root_template = str(tmp_path / "home" / "{username}")
    (tmp_path / "home" / "alice").mkdir(parents=True)

    async def no_pass() -> None:  # the loop runs on, but starts nothing
        return None

    app.jobs.tick = no_pass
    yield app
    await app.stop_async()


async def _admitted_job(app: Any) -> Any:
    body = {"notebook": nbs.simple(), "profile": "job-1gpu", "max_runtime": 300}
    status, answer = await call(app, "POST", "/jobs", "tok-alice-srv", body)
    assert status == 201 and answer["state"] == "admitted", answer
    job = app.jobs.store.live[answer["id"]]
    assert job.grant_id in app.broker.state.grants
    return job


async def test_cancelling_an_admitted_job_releases_its_grant_at_once(app: Any) -> None:
    job = await _admitted_job(app)
    grant_id = job.grant_id
    status, answer = await call(app, "DELETE", f"/jobs/{job.id}", "tok-alice")
    assert status == 200 and answer["state"] == "cancelled", answer
    assert answer["reason"] == "cancelled before it started"
    assert grant_id not in app.broker.state.grants
    grant = app.broker.get_grant(grant_id, durable=True)
    assert grant is not None and grant["release_reason"] == "released: job cancelled", grant


async def test_an_admitted_job_found_cancelled_at_its_start_releases_its_grant(
    app: Any,
) -> None:
    job = await _admitted_job(app)
    grant_id = job.grant_id
    app.jobs.store.update(job, cancel_requested=True)  # asked while the loop was busy
    await app.jobs.starter.start(job)
    assert job.state.value == "cancelled" and job.grant_id is None
    assert grant_id not in app.broker.state.grants
    assert job.handle is None and job.started_at is None  # nothing was started
