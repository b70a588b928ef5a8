"""The stack of the jupyter-scheduler tests and benchmark: a real broker (in this process, on
the running event loop, local backend running papermill) and a real ``jupyter lab`` whose
jupyter-scheduler uses :mod:`jupyter_gpushare.scheduler`, with alice's server token.

API::

    async with scheduler_stack(tmp_path) as s:
        await s.lab_api("GET", "scheduler/runtime_environments")   # the lab, off the loop
        await s.broker_api("GET", "/jobs")                           # the broker, as alice
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import jobnotebooks as nbs
from brokerkit import BASE, call, start_broker, static_tokens
from labkit import Lab, start_lab

from jupyter_gpushare.policy import load_policy

POLICY = Path(__file__).resolve().parent / "data" / "jobs_policy.yaml"
FINISHED = {"COMPLETED", "FAILED", "STOPPED"}


def scheduler_args(tmp: Path) -> list[str]:
    """The two documented config lines, plus this test's own database and staging folder."""
    return [
        "--SchedulerApp.scheduler_class=jupyter_gpushare.scheduler.GPUShareScheduler",
        "--SchedulerApp.environment_manager_class="
        "jupyter_gpushare.scheduler.GPUShareEnvironmentManager",
        f"--SchedulerApp.db_url=sqlite:///{tmp}/scheduler.sqlite",
        f"--GPUShareScheduler.staging_path={tmp}/staging",
    ]


class Stack:
    def __init__(self, broker: Any, lab: Lab, tmp: Path) -> None:
        self.broker, self.lab, self.tmp = broker, lab, tmp
        self.root = lab.root

    async def lab_api(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        return await asyncio.to_thread(self.lab.api, method, path, body)

    async def broker_api(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        return await call(self.broker, method, path, "tok-alice", body)

    def write_notebook(self, name: str, notebook: dict[str, Any]) -> str:
        (self.root / name).write_text(json.dumps(notebook))
        return name

    async def wait_status(
        self, job_id: str, statuses: set[str], timeout: float = 120
    ) -> dict[str, Any]:
        """jupyter-scheduler's job once its status is one of ``statuses``."""
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            status, job = await self.lab_api("GET", f"scheduler/jobs/{job_id}")
            assert status == 200, job
            if job["status"] in statuses:
                return dict(job)
            assert asyncio.get_running_loop().time() < deadline, (job, self.lab.log_text()[-3000:])
            await asyncio.sleep(0.3)

    async def cancel_unfinished(self) -> None:
        _, jobs = await self.broker_api("GET", "/jobs")
        for job in (jobs or {}).get("jobs", []):
            if job["state"] not in ("succeeded", "failed", "cancelled", "lost"):
                await self.broker_api("DELETE", f"/jobs/{job['id']}")


@contextlib.asynccontextmanager
async def scheduler_stack(tmp: Path, **broker_traits: Any) -> AsyncIterator[Stack]:
    broker = await start_broker(
        load_policy(str(POLICY)),
        f"sqlite:///{tmp}/broker.sqlite",
        static_tokens({"alice": ["vision"], "bob": ["nlp"]}),
        **broker_traits,
    )
    lab_tmp = tmp / "alice"
    broker.jobs.user_root_template = str(tmp / "{username}" / "root")
    env = {
        "GPUSHARE_BROKER_URL": f"http://127.0.0.1:{broker.port}{BASE}",
        "JUPYTERHUB_API_TOKEN": "tok-alice-srv",
    }
    lab_cm = start_lab(lab_tmp, env, args=scheduler_args(tmp))
    try:
        lab = await asyncio.to_thread(lab_cm.__enter__)
        stack = Stack(broker, lab, tmp)
        stack.write_notebook("hello.ipynb", nbs.simple())
        try:
            yield stack
        finally:
            await stack.cancel_unfinished()
            await asyncio.to_thread(lab_cm.__exit__, None, None, None)
    finally:
        await broker.stop_async()
