"""Batch jobs end to end: a real JupyterHub, its proxy, the broker it starts, a real
single-user server with the gpushare server extension, papermill jobs on the local backend,
and the ``jupyter-gpushare job`` command line.

alice (team vision) submits from her running server; the notebook is read from her files
and the executed notebook lands next to it. A path outside her files and another team's
profile are refused with the field named. A job keeps running, and delivers its output,
after her server is stopped. The command line submits, lists, follows the log and cancels.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import jobnotebooks as nbs
import pytest
from realhub import free_port, proxy_available, real_hub

pytestmark = [pytest.mark.hub, pytest.mark.slow]
POLICY = Path(__file__).resolve().parent / "data" / "jobs_policy.yaml"


def http(
    url: str, token: str, method: str = "GET", body: Any = None, accept: str = "application/json",
    timeout: float = 30,
) -> tuple[int, Any]:
    req = urllib.request.Request(
        url, method=method, data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"token {token}", "Content-Type": "application/json",
                 "Accept": accept},
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw, status, ctype = resp.read(), resp.status, resp.headers.get("Content-Type", "")
    except urllib.error.HTTPError as exc:
        raw, status, ctype = exc.read(), exc.code, exc.headers.get("Content-Type", "")
    if "json" in ctype and raw:
        return status, json.loads(raw)
    return status, raw.decode(errors="replace")


class Env:
    def __init__(self, hub: Any, tmp: Path) -> None:
        self.hub = hub
        self.tmp = tmp
        self.broker = hub.url + "/services/gpushare/api/v1"
        self.alice = hub.token_for("alice")
        self.home = tmp / "home" / "alice"

    def server(self, path: str) -> str:
        return f"{self.hub.url}/user/alice/gpushare/api{path}"

    def start_server(self) -> None:
        status, _ = self.hub.api("POST", "/users/alice/server")
        assert status in (201, 202, 400), status  # 400: already running
        deadline = time.monotonic() + 90
        while True:
            _, model = self.hub.api("GET", "/users/alice")
            server = (model.get("servers") or {}).get("")
            if server and server.get("ready"):
                break
            assert time.monotonic() < deadline, self.hub.log_text()[-4000:]
            time.sleep(0.5)
        deadline = time.monotonic() + 30
        while http(self.server("/jobs"), self.alice)[0] != 200:  # the extension answers
            assert time.monotonic() < deadline, self.hub.log_text()[-4000:]
            time.sleep(0.5)

    def wait(self, job_id: str, states: set[str], timeout: float = 120) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            status, job = http(f"{self.broker}/jobs/{job_id}", self.alice)
            assert status == 200, job
            if job["state"] in states:
                return dict(job)
            assert time.monotonic() < deadline, job
            time.sleep(0.3)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Any:
    if not proxy_available():
        pytest.skip("configurable-http-proxy is not installed in hub_config/proxy (npm install)")
    tmp = tmp_path_factory.mktemp("jobshub")
    port = free_port()
    extra = f"""
c.SimpleLocalProcessSpawner.home_dir_template = HUB_TMP + "/home/{{username}}"
from jupyter_gpushare.hubsetup import setup_gpushare
setup_gpushare(c, {str(POLICY)!r}, spawner="simple", broker_port={port}, data_dir=HUB_TMP,
               admin_users=["ada"], broker_args=["--BrokerApp.reconcile_min_age_s=0",
                                                 "--BrokerApp.reconcile_interval_s=0",
                                                 "--JobManager.cancel_grace_s=2"])
c.JupyterHub.spawner_class = "simple"  # servers without a grant: the GPUs stay for jobs
"""
    with real_hub(tmp, extra) as hub:
        deadline = time.monotonic() + 60
        while True:
            try:
                if http(hub.url + "/services/gpushare/api/v1/health", "x")[0] == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, hub.log_text()[-5000:]
            time.sleep(0.3)
        hub.create_user("alice", ["vision"])
        env = Env(hub, tmp)
        (env.home / "work").mkdir(parents=True)
        (env.home / "work" / "demo.ipynb").write_text(json.dumps(nbs.simple()))
        (env.home / "work" / "fails.ipynb").write_text(json.dumps(nbs.raising()))
        (env.home / "work" / "count.ipynb").write_text(json.dumps(nbs.counting(8, 0.5)))
        (env.home / "not-a-notebook.ipynb").write_text("this is not json")
        env.start_server()
        yield env
        _, jobs = http(env.broker + "/jobs", env.alice)
        for job in jobs["jobs"]:
            if job["state"] not in ("succeeded", "failed", "cancelled", "lost"):
                http(f"{env.broker}/jobs/{job['id']}", env.alice, "DELETE")
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:  # let cancelled runs end before the hub goes
            _, jobs = http(env.broker + "/jobs", env.alice)
            if all(j["state"] in ("succeeded", "failed", "cancelled") for j in jobs["jobs"]):
                break
            time.sleep(0.5)


def test_submit_from_the_server_delivers_the_output_into_the_users_files(env: Env) -> None:
    status, options = http(env.server("/jobs/options?path=work/demo.ipynb"), env.alice)
    assert status == 200, options
    assert {p["slug"] for p in options["profiles"]} >= {"job-1gpu", "vision-1gpu"}
    assert "nlp-1gpu" not in {p["slug"] for p in options["profiles"]}
    assert options["notebook"]["parameters_cell"].startswith("greeting = 'hello'")
    assert [p["name"] for p in options["notebook"]["parameters"]] == ["greeting", "repeat"]
    assert options["backends"][0]["name"] == "local"
    status, job = http(env.server("/jobs"), env.alice, "POST", {
        "path": "work/demo.ipynb", "profile": "vision-1gpu", "max_runtime": 300,
        "parameters": {"greeting": "hub"},
    })
    assert status == 201, job
    assert job["state"] in ("admitted", "queued") and job["name"] == "demo.ipynb"
    # the log streams as server-sent events through the server, until the job ends
    status, stream = http(env.server(f"/jobs/{job['id']}/log?follow=1"), env.alice,
                          accept="text/event-stream", timeout=120)
    assert status == 200
    assert "event: log" in stream and "hub " + job["id"] in stream
    assert stream.rstrip().endswith('data: {"state": "succeeded"}'), stream[-500:]
    done = env.wait(job["id"], {"succeeded", "failed"})
    assert done["state"] == "succeeded", done
    out = env.home / done["output_path"]
    assert out.parent == env.home / "work" and out.exists()
    assert "hub " + job["id"] in out.read_text()
    status, listed = http(env.server("/jobs"), env.alice)
    assert job["id"] in [j["id"] for j in listed["jobs"]]


def test_a_failing_notebook_names_the_cell_through_the_server(env: Env) -> None:
    status, job = http(env.server("/jobs"), env.alice, "POST", {
        "path": "work/fails.ipynb", "profile": "job-1gpu", "max_runtime": 120})
    assert status == 201, job
    done = env.wait(job["id"], {"succeeded", "failed"})
    assert done["state"] == "failed"
    assert done["error"]["summary"] == "cell 3 failed: ValueError: bad value 1"
    assert "\x1b" not in done["error"]["traceback"]
    assert (env.home / done["output_path"]).exists()  # the executed notebook is kept


def test_refusals_through_the_server_name_the_field(env: Env) -> None:
    for path in ("../../etc/passwd.ipynb", "/etc/hosts.ipynb", "work/../../x.ipynb"):
        status, answer = http(env.server("/jobs"), env.alice, "POST",
                              {"path": path, "profile": "job-1gpu", "max_runtime": 60})
        assert (status, answer.get("field")) == (400, "path"), (path, answer)
    status, answer = http(env.server("/jobs"), env.alice, "POST",
                          {"path": "missing.ipynb", "profile": "job-1gpu"})
    assert (status, answer.get("field")) == (404, "path")
    status, answer = http(env.server("/jobs"), env.alice, "POST",
                          {"path": "not-a-notebook.ipynb", "profile": "job-1gpu"})
    assert status == 400 and answer.get("field") == "path", answer
    status, answer = http(env.server("/jobs"), env.alice, "POST", {
        "path": "work/demo.ipynb", "profile": "nlp-1gpu", "max_runtime": 60})
    assert (status, answer.get("field")) == (403, "profile"), answer
    assert "nlp" in answer["error"]
    status, answer = http(env.server("/jobs"), env.alice, "POST", {
        "path": "work/demo.ipynb", "profile": "job-1gpu"})  # 1 h preemptible, no checkpoint
    assert (status, answer.get("field")) == (400, "checkpoint"), answer


def test_a_job_outlives_its_users_server_and_still_delivers(env: Env) -> None:
    env.start_server()
    status, job = http(env.server("/jobs"), env.alice, "POST", {
        "path": "work/count.ipynb", "profile": "job-1gpu", "max_runtime": 300,
        "checkpoint": True})
    assert status == 201, job
    env.wait(job["id"], {"running"})
    status, _ = env.hub.api("DELETE", "/users/alice/server")
    assert status in (202, 204)
    deadline = time.monotonic() + 60
    while (env.hub.api("GET", "/users/alice")[1].get("servers") or {}):
        assert time.monotonic() < deadline
        time.sleep(0.5)
    mid = env.wait(job["id"], {"running", "succeeded", "failed"})
    assert mid["state"] in ("running", "succeeded")
    done = env.wait(job["id"], {"succeeded", "failed"})
    assert done["state"] == "succeeded", done
    assert "finished 8" in (env.home / done["output_path"]).read_text()
    env.start_server()


def test_command_line_submit_list_log_cancel(env: Env) -> None:
    cli = [str(Path(sys.executable).parent / "jupyter-gpushare"), "job"]
    run_env = dict(os.environ, JUPYTERHUB_API_TOKEN=env.alice, GPUSHARE_BROKER_URL=env.broker)

    def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*cli, *args], env=run_env, capture_output=True, text=True,
                              timeout=timeout)

    nb = env.home / "work" / "demo.ipynb"
    res = run("submit", str(nb), "--profile", "job-1gpu", "-p", "greeting", "cli",
              "-p", "repeat", "3", "--max-runtime", "5m", "--root", str(env.home))
    assert res.returncode == 0, res.stderr
    job_id = res.stdout.split()[0]
    assert job_id.startswith("job-") and "output: work/demo-" in res.stdout
    res = run("log", "-f", job_id)
    assert res.returncode == 0, res.stderr
    assert "cliclicli " + job_id in res.stdout and "succeeded" in res.stderr
    res = run("list")
    assert res.returncode == 0 and job_id in res.stdout
    res = run("submit", str(env.home / "work" / "count.ipynb"), "--profile", "job-1gpu",
              "--checkpoint", "-p", "steps", "200", "--root", str(env.home))
    assert res.returncode == 0, res.stderr
    long_id = res.stdout.split()[0]
    env.wait(long_id, {"running"})
    res = run("cancel", long_id)
    assert res.returncode == 0, res.stderr
    assert env.wait(long_id, {"cancelled", "failed", "succeeded"})["state"] == "cancelled"
    res = run("submit", str(nb), "--profile", "nlp-1gpu", "--max-runtime", "1m")
    assert res.returncode == 1 and "field profile" in res.stderr


def test_kill_9_of_the_broker_under_the_hub_loses_and_repeats_nothing(env: Env) -> None:
    """Two jobs run and one queues; the hub's broker is killed with SIGKILL; the broker that
    takes over reattaches both runs (attempt 1, one runner each) and the queued job runs."""
    body = {"profile": "job-1gpu", "max_runtime": 300, "checkpoint": True}
    ids = []
    for _ in range(2):
        status, job = http(env.server("/jobs"), env.alice, "POST",
                           dict(body, path="work/count.ipynb"))
        assert status == 201, job
        ids.append(job["id"])
    status, queued = http(env.server("/jobs"), env.alice, "POST",
                          dict(body, path="work/demo.ipynb"))
    assert status == 201 and queued["state"] == "queued", queued
    for job_id in ids:
        env.wait(job_id, {"running"})
    pid_file = env.tmp / "gpushare-broker.pid"
    old_pid = int(json.loads(pid_file.read_text())["pid"])
    os.kill(old_pid, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while True:  # the supervisor's standby takes over
        try:
            new_pid = int(json.loads(pid_file.read_text())["pid"])
            if new_pid != old_pid and http(env.broker + "/health", "x")[0] == 200:
                break
        except (OSError, ValueError):
            pass
        assert time.monotonic() < deadline, env.hub.log_text()[-3000:]
        time.sleep(0.3)
    for job_id in [*ids, queued["id"]]:
        done = env.wait(job_id, {"succeeded", "failed", "cancelled"})
        assert done["state"] == "succeeded" and done["attempt"] == 1, (
            done, http(f"{env.broker}/jobs/{job_id}/events", env.alice)[1])
    jobs_dir = env.tmp / "gpushare-jobs"
    for job_id in ids:
        assert [p.name for p in (jobs_dir / job_id).glob("attempt-*")] == ["attempt-1"]
        assert (jobs_dir / job_id / "checkpoint" / "attempts.txt").read_text() == "1 0\n"
        _, events = http(f"{env.broker}/jobs/{job_id}/events", env.alice)
        assert any("reattached" in e["reason"] for e in events["events"]), events
