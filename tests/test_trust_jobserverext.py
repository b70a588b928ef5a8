# ruff: noqa: F811 - the fixtures imported from test_kube_output are parameters here
"""Issue 23, findings 1, 4 and 7 in the server extension: ``GET /gpushare/api/jobs/{id}/output``
relays the broker's notebook a range at a time (never whole in memory), with a safe
``Content-Disposition``, and serves a notebook from the user's own files (Kubernetes) only
when no link is on its way. The fixtures are those of ``test_kube_output`` (a real broker
on the Kubernetes stand-in, a real jupyter_server with the extension)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import jobnotebooks as nbs
import pytest
from brokerkit import BASE, call, start_broker, static_tokens
from pytest_jupyter.jupyter_server import *  # noqa: F403 (fixtures)
from test_kube_output import (  # noqa: F401 (fixtures)
    FAKE,
    broker,
    fetch,
    jp_asyncio_loop,
    jp_root_dir,
    jp_server_config,
    volume,
    wait_job,
)

from jupyter_gpushare.policy import load_policy
from jupyter_gpushare.serverextension import job_output

pytestmark = pytest.mark.slow
POLICY = Path(__file__).resolve().parent / "data" / "jobs_policy.yaml"
SECRET = "root-only secret 51d2"


async def test_a_link_in_the_users_files_is_not_served_by_the_server(
    broker: Any, jp_fetch: Any, volume: Path, tmp_path: Path,
) -> None:
    status, job = await call(broker, "POST", "/jobs", "tok-alice-srv", {
        "notebook": nbs.simple(), "profile": "job-1gpu", "max_runtime": 300,
        "output_path": "work/a.ipynb"})
    assert status == 201, job
    await wait_job(broker, job["id"], {"running"})
    message = await asyncio.to_thread(FAKE["fake"].run, f"gpushare-{job['id']}-a1",
                                      {"claim-alice": volume}, tmp_path)
    assert message["exit_code"] == 0, message
    await wait_job(broker, job["id"], {"succeeded"})
    out = ("gpushare", "api", "jobs", job["id"], "output")
    status, body, headers = await fetch(jp_fetch, *out)
    assert status == 200 and json.loads(body)["nbformat"] == 4
    assert "filename*=UTF-8''a.ipynb" in headers["Content-Disposition"]
    secret = tmp_path / "secret.ipynb"
    secret.write_text(json.dumps({"secret": SECRET}))
    (volume / "work" / "a.ipynb").unlink()
    (volume / "work" / "a.ipynb").symlink_to(secret)
    status, body, _ = await fetch(jp_fetch, *out)
    assert status == 403 and b"symbolic link" in body and SECRET.encode() not in body, body


async def test_the_brokers_notebook_is_relayed_a_range_at_a_time(
    broker: Any, jp_fetch: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    home = tmp_path / "local-home"
    local = await start_broker(load_policy(str(POLICY)), f"sqlite:///{tmp_path}/l.sqlite",
                               static_tokens({"alice": ["vision"]}))
    try:
        local.jobs.user_root_template = str(home / "{username}")
        (home / "alice").mkdir(parents=True)
        monkeypatch.setenv("GPUSHARE_BROKER_URL", f"http://127.0.0.1:{local.port}{BASE}")
        status, job = await call(local, "POST", "/jobs", "tok-alice-srv", {
            "notebook": nbs.simple(), "profile": "job-1gpu", "max_runtime": 300,
            "output_path": "Эксперимент.ipynb"})
        assert status == 201, job
        deadline = time.monotonic() + 90
        while (await call(local, "GET", f"/jobs/{job['id']}", "tok-alice"))[1]["state"] \
                not in ("succeeded", "failed"):
            assert time.monotonic() < deadline
            await asyncio.sleep(0.2)
        asked: list[str] = []
        real = job_output.JobOutputHandler._range

        async def counting(self: Any, qid: str, start: int) -> Any:
            asked.append(f"{start}")
            return await real(self, qid, start)

        monkeypatch.setattr(job_output, "RELAY_CHUNK", 1000)
        monkeypatch.setattr(job_output.JobOutputHandler, "_range", counting)
        status, body, headers = await fetch(jp_fetch, "gpushare", "api", "jobs", job["id"],
                                            "output")
        assert status == 200, body
        on_disk = (home / "alice" / "Эксперимент.ipynb").read_bytes()
        assert body == on_disk
        assert len(asked) == -(-len(on_disk) // 1000) > 1  # one range per 1000 bytes
        value = headers["Content-Disposition"]
        assert unquote(value.split("filename*=UTF-8''")[1]) == "Эксперимент.ipynb"
    finally:
        await local.stop_async()
