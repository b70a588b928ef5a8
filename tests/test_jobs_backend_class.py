"""The broker's batch backend is chosen by config (``c.JobManager.backend_class``) and each
attempt's ``RunSpec`` carries the grant that cluster backends translate (team, priority,
node, GPUs). A real in-process broker runs a real job on the chosen class."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import jobnotebooks as nbs
import pytest
from brokerkit import call, start_broker, static_tokens
from traitlets.config import Config

from jupyter_gpushare.backends.base import RunHandle, RunSpec
from jupyter_gpushare.backends.local import LocalBackend
from jupyter_gpushare.policy import load_policy

pytestmark = pytest.mark.slow
POLICY = Path(__file__).resolve().parent / "data" / "jobs_policy.yaml"


class RecordingBackend(LocalBackend):
    """The local backend, keeping every spec it was given."""

    name = "recording"
    specs: list[RunSpec] = []

    @classmethod
    def create(cls, settings: Any) -> RecordingBackend:
        backend = cls(settings.jobs_dir, run_as=settings.run_as)
        backend.specs = []
        return backend

    def submit(self, spec: RunSpec) -> RunHandle:
        self.specs.append(spec)
        return super().submit(spec)


async def test_configured_backend_runs_the_job_with_the_grant_in_its_spec(tmp_path: Path) -> None:
    config = Config()
    config.JobManager.backend_class = RecordingBackend
    config.JobManager.user_root_template = str(tmp_path / "home" / "{username}")
    (tmp_path / "home" / "alice").mkdir(parents=True)
    app = await start_broker(
        load_policy(str(POLICY)), f"sqlite:///{tmp_path}/jobs.sqlite",
        static_tokens({"alice": ["vision"]}), config=config,
    )
    try:
        backend = app.jobs.backend
        assert isinstance(backend, RecordingBackend)
        status, job = await call(app, "POST", "/jobs", "tok-alice-srv", {
            "notebook": nbs.simple(), "profile": "job-1gpu", "max_runtime": 300,
        })
        assert status == 201, job
        deadline = time.monotonic() + 90
        while True:
            _, now = await call(app, "GET", f"/jobs/{job['id']}", "tok-alice")
            if now["state"] in {"succeeded", "failed"}:
                break
            assert time.monotonic() < deadline, now
            await asyncio.sleep(0.2)
        assert now["state"] == "succeeded", now
        [spec] = backend.specs
        assert spec.grant["team"] == "vision" and spec.grant["user"] == "alice"
        assert spec.grant["kind"] == "batch" and spec.grant["node"]
        assert spec.grant["gpus"] and spec.grant["priority"] is not None
    finally:
        await app.stop_async()
