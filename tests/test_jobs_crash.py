"""``kill -9`` of the broker with jobs running and queued: nothing lost, nothing run twice.

A broker subprocess (static tokens, the jobs test policy) runs three jobs and queues a
fourth; it is killed with SIGKILL. While it is down one job ends normally and another one's
process is killed (as an OOM killer would). After the restart:

* the job still running is reattached (same process, attempt 1, started once);
* the job that ended meanwhile gets its true final state from its status file;
* the job that died without a result and checkpoints is requeued and resumes;
* the queued job runs once capacity frees;
* every job ends succeeded, each notebook ran exactly the attempts its history says.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import jobnotebooks as nbs
import psutil
import pytest
from brokerkit import call, free_port, static_tokens

pytestmark = pytest.mark.slow
POLICY = Path(__file__).resolve().parent / "data" / "jobs_policy.yaml"


def start(tmp: Path, port: int) -> subprocess.Popen[bytes]:
    cmd = [
        sys.executable, "-m", "jupyter_gpushare.broker",
        f"--BrokerApp.policy_file={POLICY}",
        f"--BrokerApp.db_url=sqlite:///{tmp}/jobs.sqlite",
        f"--BrokerApp.port={port}", "--BrokerApp.ip=127.0.0.1",
        "--BrokerApp.use_hub=False", "--BrokerApp.reconcile_on_start=False",
        "--BrokerApp.reconcile_interval_s=0",
        "--BrokerApp.authenticator_class=jupyter_gpushare.broker.api.auth.StaticTokenAuthenticator",
        f"--StaticTokenAuthenticator.tokens_file={tmp}/tokens.json",
        f"--JobManager.user_root_template={tmp}/home/{{username}}",
        f"--JobManager.jobs_dir={tmp}/jobs",
    ]
    log = (tmp / "broker.log").open("ab")
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=tmp)


async def ready(url: str, proc: subprocess.Popen[bytes], tmp: Path) -> None:
    deadline = time.monotonic() + 30
    while True:
        assert proc.poll() is None, (tmp / "broker.log").read_text()[-3000:]
        try:
            if (await call(url, "GET", "/health"))[0] == 200:
                return
        except ConnectionError:
            pass
        assert time.monotonic() < deadline, (tmp / "broker.log").read_text()[-3000:]
        await asyncio.sleep(0.1)


async def wait(url: str, job_id: str, states: set[str], tmp: Path, timeout: float = 90) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        _, job = await call(url, "GET", f"/jobs/{job_id}", "tok-admin")
        if job["state"] in states:
            return job
        assert time.monotonic() < deadline, (job, (tmp / "broker.log").read_text()[-3000:])
        await asyncio.sleep(0.2)


def runner_of(tmp: Path, job_id: str, attempt: int) -> psutil.Process:
    ref = json.loads((tmp / "jobs" / job_id / f"attempt-{attempt}" / "pid").read_text())
    return psutil.Process(ref["pid"])


def steps_done(tmp: Path, job_id: str) -> int:
    path = tmp / "jobs" / job_id / "checkpoint" / "count.json"
    return int(json.loads(path.read_text())["done"]) if path.exists() else 0


async def test_kill_9_with_jobs_running_and_queued(tmp_path: Path) -> None:
    (tmp_path / "tokens.json").write_text(json.dumps(
        static_tokens({"alice": ["vision"], "bob": ["nlp"]})
    ))
    for user in ("alice", "bob"):
        (tmp_path / "home" / user).mkdir(parents=True)
    port = free_port()
    url = f"http://127.0.0.1:{port}/services/gpushare/api/v1"
    proc = start(tmp_path, port)
    procs = [proc]
    try:
        await ready(url, proc, tmp_path)

        async def submit(token: str, nb: dict[str, Any], **body: Any) -> str:
            body = {"profile": "job-1gpu", "max_runtime": 300, "notebook": nb, **body}
            status, job = await call(url, "POST", "/jobs", token, body)
            assert status == 201, job
            return str(job["id"])

        # long enough to outlive the broker's restart on a loaded machine (it must be
        # reattached, not found finished)
        keeps = await submit("tok-alice", nbs.counting(60, 0.4), checkpoint=True)
        ends = await submit("tok-bob", nbs.sleeping(4))
        dies = await submit("tok-alice", nbs.counting(12, 0.4), checkpoint=True,
                            profile="debug-quarter")
        queued = await submit("tok-bob", nbs.simple("queued"))
        for job_id in (keeps, ends, dies):
            await wait(url, job_id, {"running"}, tmp_path)
        assert (await call(url, "GET", f"/jobs/{queued}", "tok-bob"))[1]["state"] == "queued"
        deadline = time.monotonic() + 150  # kernels start slowly on a loaded machine
        while steps_done(tmp_path, keeps) < 2 or steps_done(tmp_path, dies) < 2:
            assert time.monotonic() < deadline, (tmp_path / "broker.log").read_text()[-3000:]
            await asyncio.sleep(0.2)
        keeper = runner_of(tmp_path, keeps, 1)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        # while the broker is down: one job ends, another one's processes are killed
        victim = runner_of(tmp_path, dies, 1)
        for p in [victim, *victim.children(recursive=True)]:
            p.kill()
        deadline = time.monotonic() + 60
        while not (tmp_path / "jobs" / ends / "attempt-1" / "status.json").exists():
            assert time.monotonic() < deadline
            await asyncio.sleep(0.2)
        assert keeper.is_running()
        proc = start(tmp_path, port)
        procs.append(proc)
        await ready(url, proc, tmp_path)

        ended = await wait(url, ends, {"succeeded", "failed"}, tmp_path)
        assert ended["state"] == "succeeded" and ended["attempt"] == 1
        reattached = await wait(url, keeps, {"running", "succeeded"}, tmp_path)
        assert reattached["attempt"] == 1
        resumed = await wait(url, dies, {"succeeded", "failed"}, tmp_path)
        assert resumed["state"] == "succeeded" and resumed["attempt"] == 2, resumed
        last = await wait(url, queued, {"succeeded", "failed"}, tmp_path)
        assert last["state"] == "succeeded" and last["attempt"] == 1
        kept = await wait(url, keeps, {"succeeded", "failed"}, tmp_path)
        assert kept["state"] == "succeeded" and kept["attempt"] == 1, kept

        # nothing ran twice: one runner per attempt, each notebook started as often as
        # its history says
        jobs_dir = tmp_path / "jobs"
        assert sorted(p.name for p in (jobs_dir / keeps).glob("attempt-*")) == ["attempt-1"]
        ckpt = jobs_dir / keeps / "checkpoint" / "attempts.txt"
        assert ckpt.read_text() == "1 0\n"
        lines = (jobs_dir / dies / "checkpoint" / "attempts.txt").read_text().split()
        assert lines[:2] == ["1", "0"] and lines[2] == "2" and int(lines[3]) >= 2
        marker = list((tmp_path / "home" / "bob").glob(f"marker-{queued}"))
        assert len(marker) == 1
        _, events = await call(url, "GET", f"/jobs/{keeps}/events", "tok-alice")
        assert any("reattached" in e["reason"] for e in events["events"])
        _, events = await call(url, "GET", f"/jobs/{dies}/events", "tok-alice")
        assert any("while the broker was down" in e["reason"] for e in events["events"])
        _, grants = await call(url, "GET", "/grants", "tok-admin")
        assert grants["grants"] == []  # every grant ended with its run
        # the admin's log warns of what changed while the broker was down, not of the job
        # that simply ran on (a reattach is the normal case of every restart)
        text = (tmp_path / "broker.log").read_text()
        assert f"WARNING | jobs on start: job {dies} (running): " in text, text[-3000:]
        assert f"WARNING | jobs on start: job {keeps} " not in text, text[-3000:]
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
        for pidfile in (tmp_path / "jobs").glob("*/attempt-*/pid"):
            pid = json.loads(pidfile.read_text())["pid"]
            try:
                runner = psutil.Process(pid)
                for child in [runner, *runner.children(recursive=True)]:
                    child.kill()
            except psutil.Error:
                pass
        os.sync()
