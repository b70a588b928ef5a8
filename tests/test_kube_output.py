"""The executed notebook of a Kubernetes job reaches its user, across the real parts.

A real in-process broker runs the job through ``KubeJobsBackend`` against the in-memory
stand-in of the Kubernetes API (``kubefake.FakeKube``; no API server can run here), whose
kubelet runs the pod's container (``kube_run``: papermill and a real kernel) for real, with
the user's volume (``claim-alice``) as a local folder. A real jupyter_server with the gpushare
extension has that folder as its root, as the user's KubeSpawner pod mounts the same claim,
and its token is the user's server's: the lab submits through it, and the output comes back
through ``GET /gpushare/api/jobs/{id}/output`` (the broker itself has none: it does not mount
the volume) and the contents API (what JupyterLab's "Open output" opens).
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import jobnotebooks as nbs
import pytest
import pytest_asyncio
from brokerkit import BASE, call
from kubefake import FakeClusterBackend, FakeKube, start_broker_on
from kubejobkit import NOTEBOOK
from pytest_jupyter.jupyter_server import *  # noqa: F403 (fixtures)
from telemetry_fakes import EXT_CONFIG, clear_gpushare_env
from tornado.httpclient import HTTPClientError
from traitlets.config import Config

pytestmark = pytest.mark.slow
FAKE = FakeClusterBackend.clusters


@pytest_asyncio.fixture
async def jp_asyncio_loop():
    """Serve on pytest-asyncio's loop, the one the broker and the tests run in."""
    yield asyncio.get_running_loop()


@pytest.fixture
def volume(tmp_path: Path) -> Path:
    """alice's PersistentVolumeClaim, as a folder: her server's root and the job's home."""
    path = tmp_path / "claim-alice"
    (path / "work").mkdir(parents=True)
    (path / "work" / "train.ipynb").write_text(json.dumps(NOTEBOOK))
    return path


@pytest.fixture
def jp_root_dir(volume: Path) -> Path:
    return volume


@pytest_asyncio.fixture
async def broker(tmp_path: Path, volume: Path, monkeypatch: Any) -> Any:
    config = Config()
    config.KubeJobsBackend.home_mount_path = str(volume)  # where the pod mounts the claim
    app = await start_broker_on(FakeKube(), tmp_path,
                                teams={"alice": ["vision"], "bob": ["nlp"]}, config=config)
    clear_gpushare_env(monkeypatch)
    monkeypatch.setenv("GPUSHARE_BROKER_URL", f"http://127.0.0.1:{app.port}{BASE}")
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "tok-alice-srv")  # alice's server's token
    yield app
    await app.stop_async()


@pytest.fixture
def jp_server_config(broker: Any) -> dict[str, Any]:
    return {**EXT_CONFIG, "GPUShareServerApp": {"broker_timeout_s": 5.0}}


async def fetch(jp_fetch: Any, *parts: str, **kw: Any) -> tuple[int, bytes, Any]:
    try:
        r = await jp_fetch(*parts, **kw)
    except HTTPClientError as exc:
        assert exc.response is not None
        return exc.code, exc.response.body, exc.response.headers
    return r.code, r.body, r.headers


async def wait_job(app: Any, job_id: str, states: set[str], timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        _, job = await call(app, "GET", f"/jobs/{job_id}", "tok-alice")
        if job["state"] in states:
            return job
        assert time.monotonic() < deadline, job
        await asyncio.sleep(0.1)


async def test_the_executed_notebook_comes_back_from_the_users_volume(
    broker: Any, jp_fetch: Any, jp_serverapp: Any, volume: Path, tmp_path: Path,
    monkeypatch: Any,
) -> None:
    fake = FAKE["fake"]
    status, body, _ = await fetch(jp_fetch, "gpushare", "api", "jobs", method="POST",
                                  body=json.dumps({"path": "work/train.ipynb",
                                                   "profile": "job-1gpu",
                                                   "max_runtime": 300,
                                                   "parameters": {"n": 7}}))
    assert status == 201, body
    job = json.loads(body)
    assert job["output_path"].startswith("work/") and job["backend"] == "kubernetes"
    running = await wait_job(broker, job["id"], {"running"})
    name = f"gpushare-{job['id']}-a1"
    assert ("jupyterhub", name) in fake.jobs, running
    out = ("gpushare", "api", "jobs", job["id"], "output")
    status, body, _ = await fetch(jp_fetch, *out)  # nothing written yet
    assert status == 404 and b"no output notebook in your files yet" in body, body

    # the kubelet runs the pod: papermill writes the notebook into the user's volume
    message = await asyncio.to_thread(fake.run, name, {"claim-alice": volume}, tmp_path)
    assert message["exit_code"] == 0, message
    done = await wait_job(broker, job["id"], {"succeeded", "failed"})
    assert done["state"] == "succeeded", done

    # the broker has no copy (it does not mount the volume) ...
    status, answer = await call(broker, "GET", f"/jobs/{job['id']}/output", "tok-alice")
    assert status == 404 and "only into your own files" in answer["error"], answer
    # ... the user's server serves it from her files
    status, body, headers = await fetch(jp_fetch, *out)
    assert status == 200, body
    assert headers["Content-Type"] == "application/x-ipynb+json"
    notebook = json.loads(body)
    assert "answer 42" in json.dumps(notebook["cells"])  # executed, with n = 7
    assert json.loads((volume / done["output_path"]).read_text()) == notebook
    # and JupyterLab's "Open output" opens output_path through the contents API
    status, body, _ = await fetch(jp_fetch, "api", "contents", *done["output_path"].split("/"))
    assert status == 200 and json.loads(body)["type"] == "notebook"

    # bounded: a notebook over the server's limit is refused with the setting named
    jp_serverapp.web_app.settings["gpushare_max_output_bytes"] = 100
    status, body, _ = await fetch(jp_fetch, *out)
    assert status == 413 and b"max_output_bytes" in body, body
    jp_serverapp.web_app.settings["gpushare_max_output_bytes"] = 256 * 1024 * 1024

    # a server whose root is not where the job wrote it says where the notebook is
    broker.jobs.backend.home_mount_path = str(tmp_path / "elsewhere")
    status, body, _ = await fetch(jp_fetch, *out)
    assert status == 404 and b"outside its root" in body, body
    broker.jobs.backend.home_mount_path = str(volume)


async def test_a_user_never_gets_another_users_output(
    broker: Any, jp_fetch: Any, jp_serverapp: Any, volume: Path, tmp_path: Path,
    monkeypatch: Any,
) -> None:
    fake = FAKE["fake"]
    status, job = await call(broker, "POST", "/jobs", "tok-alice-srv", {
        "notebook": nbs.simple(), "profile": "job-1gpu", "max_runtime": 300,
        "output_path": "work/a.ipynb"})
    assert status == 201, job
    await wait_job(broker, job["id"], {"running"})
    message = await asyncio.to_thread(fake.run, f"gpushare-{job['id']}-a1",
                                      {"claim-alice": volume}, tmp_path)
    assert message["exit_code"] == 0, message
    await wait_job(broker, job["id"], {"succeeded"})
    assert (volume / "work" / "a.ipynb").exists()
    out = ("gpushare", "api", "jobs", job["id"], "output")
    assert (await fetch(jp_fetch, *out))[0] == 200

    # bob's server (his token) asks for alice's job: the broker refuses, nothing is read,
    # although this test's server root holds alice's file
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "tok-bob-srv")
    status, body, _ = await fetch(jp_fetch, *out)
    assert status == 404 and b"no job" in body and b"cells" not in body, body
    # alice's server asks for bob's job, with a file at its output path in her files
    status, bobs = await call(broker, "POST", "/jobs", "tok-bob", {
        "notebook": nbs.simple(), "profile": "job-1gpu", "max_runtime": 300,
        "output_path": "work/b.ipynb"})
    assert status == 201, bobs
    (volume / "work" / "b.ipynb").write_text(json.dumps(nbs.simple("not bob's")))
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "tok-alice-srv")
    status, body, _ = await fetch(jp_fetch, "gpushare", "api", "jobs", bobs["id"], "output")
    assert status == 404 and b"no job" in body and b"cells" not in body, body
    # without a login nothing at all
    status, body, _ = await fetch(jp_fetch, *out, headers={"Authorization": ""})
    assert status == 403, body
