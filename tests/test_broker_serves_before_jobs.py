"""A starting broker serves admissions before it has asked the batch engine about its jobs.

Job recovery polls the backend once per unfinished job (a Slurm listing, the attempt's
files): 30-90 ms of each takeover in the soak (seed 111), while the probes sent right after a
kill waited for the new broker. Admissions do not depend on it, so the broker now listens
(and tells its supervisor it is ready) first, and recovers the jobs after; ``start_async``
still returns only once they are recovered and the job loop runs.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from brokerkit import call, start_broker, static_tokens
from brokerpolicies import small
from ports import free_port

from jupyter_gpushare.broker.jobs.runner import JobManager


def test_admissions_are_answered_while_jobs_are_recovered(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    release = asyncio.Event()
    began = []
    real = JobManager.recover

    async def slow_recover(self: JobManager) -> list[str]:
        began.append(True)
        await release.wait()  # the backend's polls take their time
        return await real(self)

    monkeypatch.setattr(JobManager, "recover", slow_recover)

    async def scenario() -> None:
        port = free_port()
        starting = asyncio.ensure_future(start_broker(
            small(), f"sqlite:///{tmp_path}/b.sqlite", static_tokens({"alice": ["a"]}),
            port=port,
        ))
        base = f"http://127.0.0.1:{port}/services/gpushare/api/v1"
        answer: tuple[int, Any] = (0, None)
        for _ in range(200):  # up to 10 s
            await asyncio.sleep(0.05)
            try:
                answer = await call(base, "POST", "/requests", "tok-spawner", {
                    "user": "alice", "server": "", "groups": ["a"], "pool": "shared",
                    "gpu": {"fraction": 0.25},
                })
            except OSError:
                continue  # not listening yet
            break
        status, body = answer
        assert status == 201 and body["status"] == "granted", answer
        assert began and not starting.done()  # recovery is still under way
        release.set()
        app = await asyncio.wait_for(starting, 10)
        try:
            assert app.jobs._task is not None  # the job loop runs once recovered
        finally:
            await app.stop_async()

    asyncio.run(scenario())
