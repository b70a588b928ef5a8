"""KubeJobsBackend against an in-memory stand-in of the Kubernetes API, its Job controller and
Kueue (``kubefake.FakeKube``: documented semantics, NOT a real API server; none can run here).

What is real: the backend, the manifests it sends (checked with kubernetes-validate), the
broker driving it (last test). What is not: the cluster's behaviour, modelled by the fake.
"""

from __future__ import annotations

import asyncio
import base64
import os
import time
from pathlib import Path
from typing import Any

import jobnotebooks as nbs
import kubernetes_validate
import pytest
from brokerkit import call, start_broker, static_tokens
from kubefake import FakeKube, start_broker_on
from kubejobkit import run_spec
from traitlets.config import Config

from jupyter_gpushare.backends.base import RunHandle
from jupyter_gpushare.backends.kube import KubeJobsBackend
from jupyter_gpushare.policy import load_policy

NAME = "gpushare-job-0123456789abcdef0123-a1"


@pytest.fixture
def fake() -> FakeKube:
    return FakeKube()


@pytest.fixture
def backend(fake: FakeKube) -> KubeJobsBackend:
    b = KubeJobsBackend(client=fake, poll_min_interval_s=0)  # every poll asks the fake
    b.user_root = lambda user: "/home/ada"
    return b


def submitted(backend: KubeJobsBackend, **over: Any) -> RunHandle:
    return backend.submit(run_spec(over.pop("kind", "whole"), **over))


def test_submit_creates_a_suspended_job_and_its_configmap_once(
    backend: KubeJobsBackend, fake: FakeKube
) -> None:
    handle = submitted(backend)
    assert handle.backend == "kubernetes" and handle.ref["name"] == NAME
    job = fake.jobs["jupyterhub", NAME]
    cm = fake.configmaps["jupyterhub", NAME]
    kubernetes_validate.validate({k: v for k, v in job.items() if k != "status"}, "1.30.0",
                                 strict=True)
    kubernetes_validate.validate(cm, "1.30.0", strict=True)
    assert job["spec"]["suspend"] is True
    assert cm["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]
    # the output path is the user's, relative to their files, inside the pod's home
    assert handle.ref["output_path"] == "/home/jovyan/runs/out.ipynb"
    again = submitted(backend)
    assert again == handle
    assert len(fake.jobs) == 1 and len(fake.configmaps) == 1
    other = submitted(backend, attempt=2)
    assert other.ref["name"] != handle.ref["name"] and len(fake.jobs) == 2


def test_a_configmap_failure_removes_the_job(backend: KubeJobsBackend, fake: FakeKube) -> None:
    def broken(namespace: str, body: dict) -> dict:
        raise RuntimeError("etcd is full")

    fake.create_configmap = broken  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="etcd"):
        submitted(backend)
    assert fake.jobs == {}


def test_states_from_queued_to_complete(backend: KubeJobsBackend, fake: FakeKube) -> None:
    handle = submitted(backend)
    queued = backend.poll(handle)
    assert queued.alive is True and queued.queued is True
    assert "insufficient unused quota" in queued.reason
    fake.admit(NAME)
    running = backend.poll(handle)
    assert running.alive is True and not running.queued and running.started_at
    fake.finish(NAME, 0, {"exit_code": 0, "error": None, "terminated": False,
                          "output_path": "/home/jovyan/runs/out.ipynb"})
    done = backend.poll(handle)
    assert done.finished and done.exit_code == 0 and done.alive is False
    assert done.output_path == "/home/jovyan/runs/out.ipynb"
    assert done.ended_at and done.ended_at > done.started_at  # type: ignore[operator]


def test_a_failed_cell_comes_back_from_the_termination_message(
    backend: KubeJobsBackend, fake: FakeKube
) -> None:
    handle = submitted(backend)
    fake.admit(NAME)
    error = {"summary": "ZeroDivisionError in cell 2", "ename": "ZeroDivisionError",
             "cell_index": 1}
    fake.finish(NAME, 1, {"exit_code": 1, "error": error, "terminated": False})
    status = backend.poll(handle)
    assert status.finished and status.exit_code == 1
    assert status.error == error and status.reason == "BackoffLimitExceeded"
    assert not status.preempted


def test_oom_and_deadline_are_said_so(backend: KubeJobsBackend, fake: FakeKube) -> None:
    handle = submitted(backend)
    fake.admit(NAME)
    fake.finish(NAME, 137, None, reason="OOMKilled")
    status = backend.poll(handle)
    assert status.exit_code == 137 and "out of memory" in status.error["summary"]  # type: ignore[index]
    second = submitted(backend, attempt=2)
    fake.admit(second.ref["name"])
    fake.pass_deadline(second.ref["name"])
    late = backend.poll(second)
    assert late.finished and late.exit_code == 1 and late.reason == "DeadlineExceeded"
    assert "maximum runtime" in late.error["summary"]  # type: ignore[index]


def test_kueue_preemption_is_preempted_and_the_job_is_not_left_to_restart(
    backend: KubeJobsBackend, fake: FakeKube
) -> None:
    handle = submitted(backend)
    fake.admit(NAME)
    fake.evict(NAME)
    status = backend.poll(handle)
    assert status.preempted and status.finished and status.exit_code is None
    assert "reclamation within the cohort" in status.reason
    assert ("jupyterhub", NAME) not in fake.jobs  # Kueue cannot readmit it on its own


def test_a_pod_evicted_by_the_cluster_is_preempted(
    backend: KubeJobsBackend, fake: FakeKube
) -> None:
    handle = submitted(backend)
    pod = fake.admit(NAME)
    fake.pods["jupyterhub", pod]["status"]["conditions"] = [{
        "type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler",
        "message": "preempted by a higher-priority pod"}]
    status = backend.poll(handle)
    assert status.preempted and "higher-priority" in status.reason


def test_signal_deletes_the_pod_with_the_grace_period_kill_deletes_the_job(
    backend: KubeJobsBackend, fake: FakeKube
) -> None:
    handle = submitted(backend)
    pod = fake.admit(NAME, log="--- started ---\nstep 1\n")
    backend.signal(handle)
    assert ("delete_pod", "jupyterhub", pod, 120) in fake.calls  # the grant's grace period
    after = backend.poll(handle)
    assert after.finished and after.exit_code is None  # the broker: preempted or cancelled
    data, _ = backend.read_log(handle.job_id)
    assert b"step 1" in data  # read before the pod went
    backend.kill(handle)
    assert ("delete_job", "jupyterhub", NAME, "Foreground", 0) in fake.calls
    assert backend.poll(handle).alive is False
    assert fake.configmaps == {}


def test_signal_of_a_job_still_in_the_queue_deletes_it(
    backend: KubeJobsBackend, fake: FakeKube
) -> None:
    handle = submitted(backend)
    backend.signal(handle)
    assert fake.jobs == {}
    assert backend.poll(handle).alive is False


def test_logs_of_every_attempt_with_offsets_and_forget(
    backend: KubeJobsBackend, fake: FakeKube
) -> None:
    first = submitted(backend)
    fake.admit(NAME, log="attempt one\n")
    fake.finish(NAME, 1, {"exit_code": 143, "terminated": True, "error": None})
    second = submitted(backend, attempt=2)
    fake.admit(second.ref["name"], log="attempt two\n")
    data, end = backend.read_log(first.job_id)
    assert data == b"attempt one\nattempt two\n" and end == len(data)
    assert backend.log_size(first.job_id) == len(data)
    tail, end2 = backend.read_log(first.job_id, offset=12, max_bytes=7)
    assert tail == b"attempt" and end2 == 19
    backend.forget(first.job_id)
    assert fake.jobs == {} and backend.read_log(first.job_id) == (b"", 0)


def test_the_api_server_is_asked_at_most_every_poll_interval(fake: FakeKube) -> None:
    b = KubeJobsBackend(client=fake, poll_min_interval_s=60)
    handle = b.submit(run_spec("whole"))
    assert b.poll(handle).queued
    fake.admit(NAME, log="hello\n")
    gets = sum(c[0] == "get_job" for c in fake.calls)
    for _ in range(20):  # the broker's loop polls every 0.25 s: one API read a minute
        assert b.poll(handle).queued
    assert sum(c[0] == "get_job" for c in fake.calls) == gets
    assert b.read_log(handle.job_id)[0] == b"hello\n"
    fake.logs[NAME + "-00001"] = "hello\nmore\n"
    assert b.read_log(handle.job_id)[0] == b"hello\n"  # the last read, within the interval
    b.signal(handle)  # a stop: the next poll asks again
    assert b.poll(handle).finished


def test_grants_the_pods_could_not_hold_are_refused_before_submit(fake: FakeKube) -> None:
    whole = KubeJobsBackend(client=fake)
    reason = whole.refusal(run_spec("fraction"))
    assert reason and "0.25 of a GPU" in reason and "whole GPUs" in reason
    assert whole.refusal(run_spec("whole")) is None
    hami = KubeJobsBackend(client=fake, gpu_backend="hami")
    assert hami.refusal(run_spec("fraction")) is None
    mig = KubeJobsBackend(client=fake, gpu_backend="mig")
    assert "MIG profile" in (mig.refusal(run_spec("whole")) or "")
    assert mig.refusal(run_spec("mig")) is None
    noise = base64.b64encode(os.urandom(1024 * 1024)).decode()  # does not compress
    big = {**nbs.simple(), "cells": [{"cell_type": "markdown", "metadata": {}, "source": noise}]}
    assert "ConfigMap holds at most" in (whole.refusal(run_spec("whole", notebook=big)) or "")
    assert fake.calls == []  # decided from the spec and settings alone


def test_settings_reach_the_manifest(fake: FakeKube) -> None:
    config = Config()
    config.KubeJobsBackend.namespace = "ml-jobs"
    config.KubeJobsBackend.gpu_backend = "hami"
    config.KubeJobsBackend.pvc_name_template = "home-{username}"
    config.KubeJobsBackend.image = "example.org/nb:1"
    b = KubeJobsBackend(client=fake, config=config)
    handle = b.submit(run_spec("fraction"))
    job = fake.jobs["ml-jobs", handle.ref["name"]]
    pod = job["spec"]["template"]["spec"]
    assert pod["schedulerName"] == "hami-scheduler"
    assert pod["containers"][0]["image"] == "example.org/nb:1"
    assert pod["volumes"][0]["persistentVolumeClaim"]["claimName"].startswith("home-ada")
    assert b.capabilities().memory_isolation == "hard (HAMi)"


# ------------------------------------------------------------------ through the real broker

POLICY = Path(__file__).resolve().parent / "data" / "jobs_policy.yaml"


async def _wait(app: Any, job_id: str, pred: Any, timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        _, now = await call(app, "GET", f"/jobs/{job_id}", "tok-alice")
        if pred(now):
            return now
        assert time.monotonic() < deadline, now
        await asyncio.sleep(0.1)


@pytest.mark.slow
async def test_the_broker_runs_a_job_through_the_kube_backend(tmp_path: Path) -> None:
    fake = FakeKube()
    app = await start_broker_on(fake, tmp_path)
    try:
        status, job = await call(app, "POST", "/jobs", "tok-alice-srv", {
            "notebook": nbs.simple(), "profile": "job-1gpu", "max_runtime": 300,
            "output_path": "results/run.ipynb", "checkpointing": True,
        })
        assert status == 201, job
        await _wait(app, job["id"], lambda j: j["state"] == "running")
        name = f"gpushare-{job['id']}-a1"
        kube_job = fake.jobs["jupyterhub", name]
        labels = kube_job["metadata"]["labels"]
        assert labels["kueue.x-k8s.io/queue-name"] == "gpushare-vision"
        assert labels["kueue.x-k8s.io/priority-class"] == "gpushare-research"
        assert kube_job["spec"]["activeDeadlineSeconds"] == 300
        container = kube_job["spec"]["template"]["spec"]["containers"][0]
        assert container["command"][-1].endswith(f"/{job['id']}/attempt-1")
        assert fake.configmaps["jupyterhub", name]
        # while Kueue holds the Job, the job's events say why, once
        for _ in range(100):
            _, events = await call(app, "GET", f"/jobs/{job['id']}/events", "tok-alice")
            waiting = [e for e in events["events"] if "insufficient unused quota"
                       in (e.get("reason") or "")]
            if waiting:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)  # more polls: no second event for the same reason
        _, events = await call(app, "GET", f"/jobs/{job['id']}/events", "tok-alice")
        waiting = [e for e in events["events"] if "insufficient unused quota"
                   in (e.get("reason") or "")]
        assert len(waiting) == 1, events
        held = app.jobs.store.get(job["id"]).handle  # what the broker keeps of the run
        assert held["engine_queued"] is True
        # Kueue admits it, then takes the GPUs back for another team: preempted, requeued
        fake.admit(name)
        for _ in range(100):
            _, events = await call(app, "GET", f"/jobs/{job['id']}/events", "tok-alice")
            if any("engine admitted it" in (e.get("reason") or "") for e in events["events"]):
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError(events)
        admitted = app.jobs.store.get(job["id"]).handle
        assert admitted["engine_queued"] is False
        # the runtime clock starts when Kueue lets the Job run
        assert admitted["started_at"] > held["started_at"]
        fake.evict(name)
        again = await _wait(app, job["id"], lambda j: j["attempt"] >= 2
                            and j["state"] == "running")
        assert ("jupyterhub", name) not in fake.jobs
        second = f"gpushare-{job['id']}-a2"
        fake.admit(second)
        fake.finish(second, 0, {"exit_code": 0, "error": None, "terminated": False,
                                "output_path": "/home/jovyan/results/run.ipynb"})
        done = await _wait(app, job["id"], lambda j: j["state"] in ("succeeded", "failed"))
        assert done["state"] == "succeeded", done
        assert again["attempt"] == 2
        _, events = await call(app, "GET", f"/jobs/{job['id']}/events", "tok-alice")
        assert any("preempted" in (e.get("reason") or e.get("message") or "")
                   for e in events["events"]), events
    finally:
        await app.stop_async()


@pytest.mark.slow
async def test_the_runtime_limit_counts_from_kueues_admission(tmp_path: Path) -> None:
    fake = FakeKube()
    app = await start_broker_on(fake, tmp_path)
    try:
        status, job = await call(app, "POST", "/jobs", "tok-alice-srv", {
            "notebook": nbs.simple(), "profile": "job-1gpu", "max_runtime": 1})
        assert status == 201, job
        await _wait(app, job["id"], lambda j: j["state"] == "running")
        await asyncio.sleep(2.5)  # held by Kueue for longer than its runtime: not killed
        name = f"gpushare-{job['id']}-a1"
        assert ("jupyterhub", name) in fake.jobs
        assert not any(c[0] == "delete_job" for c in fake.calls)
        fake.admit(name)  # now it runs, and over a second later it is stopped
        done = await _wait(app, job["id"], lambda j: j["state"] in ("failed", "succeeded"))
        assert done["state"] == "failed" and "maximum runtime" in done["reason"], done
        assert ("delete_job", "jupyterhub", name, "Foreground", 0) in fake.calls
    finally:
        await app.stop_async()


# ------------------------------------------------------------------ the config to copy

HUB_CONFIG = Path(__file__).resolve().parent.parent / "hub_config"


@pytest.mark.slow
async def test_the_z2jh_values_broker_config_builds_the_kube_backend(tmp_path: Path) -> None:
    """The broker config in hub_config/z2jh-values.yaml, loaded as the broker loads it
    (--BrokerApp.config_file), gives the broker a KubeJobsBackend for its jobs."""
    import yaml
    from traitlets.config.loader import PyFileConfigLoader

    values = yaml.safe_load((HUB_CONFIG / "z2jh-values.yaml").read_text())
    files = values["hub"]["extraFiles"]
    path = files["gpushare-broker-config"]["mountPath"]
    assert f"--BrokerApp.config_file={path}" in values["hub"]["extraConfig"]["gpushare"]
    local = tmp_path / "broker_config.py"
    local.write_text(files["gpushare-broker-config"]["stringData"])
    config = PyFileConfigLoader(local.name, path=str(tmp_path)).load_config()
    config.JobManager.user_root_template = str(tmp_path / "home" / "{username}")
    app = await start_broker(load_policy(str(POLICY)), f"sqlite:///{tmp_path}/jobs.sqlite",
                             static_tokens({"alice": ["vision"]}), config=config)
    try:
        backend = app.jobs.backend
        assert isinstance(backend, KubeJobsBackend)
        assert backend.namespace == "jhub" and backend.gpu_backend == "hami"
        assert backend.template().storage.pvc_name_template == "claim-{username}{servername}"
        assert backend.user_root is not None and backend.gpu_memory is not None
        assert backend.gpu_memory()  # the policy's GPUs, for the memory caps
    finally:
        await app.stop_async()


def test_the_rbac_file_grants_what_the_client_calls_and_is_valid() -> None:
    import yaml

    docs = list(yaml.safe_load_all((HUB_CONFIG / "kube-jobs-rbac.yaml").read_text()))
    for doc in docs:
        kubernetes_validate.validate(doc, "1.30.0", strict=True)
    role = next(d for d in docs if d["kind"] == "Role")
    granted = {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"]
               for r in rule["resources"] for v in rule["verbs"]}
    needed = {  # AsyncKubeClient's calls
        ("batch", "jobs", "create"), ("batch", "jobs", "get"), ("batch", "jobs", "list"),
        ("batch", "jobs", "delete"), ("", "configmaps", "create"), ("", "configmaps", "delete"),
        ("", "pods", "list"), ("", "pods", "delete"), ("", "pods/log", "get"),
        ("", "events", "list"),
        ("kueue.x-k8s.io", "workloads", "list"),
    }
    assert needed <= granted, needed - granted
    binding = next(d for d in docs if d["kind"] == "RoleBinding")
    assert binding["subjects"][0]["name"] == "hub"  # z2jh's hub service account
