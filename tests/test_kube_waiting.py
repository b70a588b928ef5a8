"""A job pod that Kueue admitted but that has not started says why, and ends where waiting
cannot help: KubeJobsBackend against the in-memory stand-in (``kubefake.FakeKube``, whose
scheduler and kubelet produce the pod states a cluster reports: Unschedulable,
ContainerCreating with a Multi-Attach event, ErrImagePull/ImagePullBackOff,
CreateContainerConfigError), and through a real in-process broker.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import jobnotebooks as nbs
import pytest
from brokerkit import call
from kubefake import FakeClusterBackend, FakeKube, start_broker_on
from kubejobkit import run_spec

from jupyter_gpushare.backends.base import RunHandle
from jupyter_gpushare.backends.kube import KubeJobsBackend
from jupyter_gpushare.backends.kube_waiting import TEXT_LIMIT

NAME = "gpushare-job-0123456789abcdef0123-a1"
IMAGE = "quay.io/example/notebook:nope"
NOT_FOUND = (f'rpc error: code = NotFound desc = failed to pull and unpack image "{IMAGE}": '
             f'failed to resolve reference "{IMAGE}": {IMAGE}: not found')


@pytest.fixture
def fake() -> FakeKube:
    return FakeKube()


def backend_for(fake: FakeKube, **settings: Any) -> KubeJobsBackend:
    b = KubeJobsBackend(client=fake, poll_min_interval_s=0, image=IMAGE, **settings)
    b.user_root = lambda user: "/home/ada"
    return b


def admitted(b: KubeJobsBackend, fake: FakeKube) -> RunHandle:
    handle = b.submit(run_spec("whole"))
    assert b.poll(handle).reason.startswith("waiting for Kueue")
    fake.admit(NAME)
    return handle


def nothing_left(fake: FakeKube) -> None:
    assert fake.jobs == {} and fake.pods == {} and fake.configmaps == {}
    assert fake.workloads == {}


def test_an_image_that_cannot_be_pulled_waits_saying_why_then_fails_its_attempt(
    fake: FakeKube,
) -> None:
    fake.unpullable[IMAGE] = NOT_FOUND
    b = backend_for(fake, image_pull_timeout_s=1.0)
    handle = admitted(b, fake)
    texts = set()
    for _ in range(4):  # the kubelet alternates ErrImagePull and ImagePullBackOff
        status = b.poll(handle)
        assert status.alive is True and status.queued is True and not status.finished
        texts.add(status.reason)
    assert texts == {f"waiting: the image {IMAGE} cannot be pulled: not found in the "
                     "registry (ImagePullBackOff)"}  # one text: one event in the broker
    assert ("jupyterhub", NAME) in fake.jobs
    time.sleep(1.1)
    ended = b.poll(handle)
    assert ended.alive is False and ended.finished and ended.exit_code is None
    summary = ended.error["summary"]  # type: ignore[index]
    assert IMAGE in summary and "not found in the registry" in summary, summary
    assert "image_pull_timeout_s = 1 s" in summary, summary
    nothing_left(fake)  # the Job, its pod, its ConfigMap and its Workload are gone
    assert len(b.poller._waits) == 0


def test_an_image_pulled_in_time_runs(fake: FakeKube) -> None:
    fake.unpullable[IMAGE] = "rpc error: code = Unknown desc = 401 Unauthorized"
    b = backend_for(fake, image_pull_timeout_s=60)
    handle = admitted(b, fake)
    status = b.poll(handle)
    assert status.queued and "the registry refused access" in status.reason
    del fake.unpullable[IMAGE]  # e.g. the pull secret was fixed
    running = b.poll(handle)
    assert running.alive and not running.queued and running.reason == ""
    assert len(b.poller._waits) == 0


def test_a_stop_of_a_pod_that_never_started_deletes_its_job(fake: FakeKube) -> None:
    fake.unpullable[IMAGE] = NOT_FOUND
    b = backend_for(fake, image_pull_timeout_s=60)
    handle = admitted(b, fake)
    assert b.poll(handle).queued
    b.signal(handle)  # preemption or cancel: no notebook ran, nothing to save
    assert ("delete_job", "jupyterhub", NAME, "Foreground", 0) in fake.calls
    nothing_left(fake)
    assert b.poll(handle).alive is False


def test_a_container_configuration_error_fails_the_attempt_at_once(fake: FakeKube) -> None:
    fake.config_errors[NAME] = 'secret "hf-token" not found'
    b = backend_for(fake)
    handle = admitted(b, fake)
    ended = b.poll(handle)
    assert ended.alive is False and ended.finished and ended.exit_code is None
    summary = ended.error["summary"]  # type: ignore[index]
    assert summary == ("The job's container cannot be created from its configuration "
                       "(CreateContainerConfigError: secret \"hf-token\" not found)")
    assert ended.reason == "CreateContainerConfigError"
    nothing_left(fake)


def test_a_volume_attached_on_another_node_keeps_waiting_and_says_why(fake: FakeKube) -> None:
    b = backend_for(fake, image_pull_timeout_s=0)  # no timeout applies to a volume
    handle = b.submit(run_spec("whole"))
    claim = fake.jobs["jupyterhub", NAME]["spec"]["template"]["spec"]["volumes"][0][
        "persistentVolumeClaim"]["claimName"]
    fake.attached_elsewhere[claim] = "jupyter-ada-2elovelace"
    fake.admit(NAME)
    for _ in range(3):
        status = b.poll(handle)
        assert status.alive and status.queued and not status.finished
        assert status.reason.startswith("waiting: the user's volume is attached on another "
                                        "node"), status.reason
        assert "Multi-Attach error" in status.reason
        assert "jupyter-ada-2elovelace" in status.reason and len(status.reason) <= TEXT_LIMIT
    pod = next(iter(fake.pods))[1]
    assert ("list_events", "jupyterhub",
            f"involvedObject.kind=Pod,involvedObject.name={pod}") in fake.calls
    del fake.attached_elsewhere[claim]  # the user's server stopped
    running = b.poll(handle)
    assert running.alive and not running.queued


def test_a_pod_no_node_takes_waits_with_the_schedulers_words_bounded(fake: FakeKube) -> None:
    fake.unschedulable = ("0/5 nodes are available: 1 Insufficient nvidia.com/gpu, "
                          + "4 node(s) didn't match Pod's node affinity/selector. " * 40)
    b = backend_for(fake, image_pull_timeout_s=0)
    handle = admitted(b, fake)
    status = b.poll(handle)
    assert status.alive and status.queued
    assert status.reason.startswith("waiting: no node can take the job's pod yet "
                                    "(Unschedulable: 0/5 nodes are available: 1 Insufficient")
    assert len(status.reason) <= TEXT_LIMIT and status.reason.endswith("...")
    assert not any(c[0] == "list_events" for c in fake.calls)  # the pod says it all
    fake.unschedulable = ""
    assert not b.poll(handle).queued


# ------------------------------------------------------------------ through the real broker


class WaitingBackend(FakeClusterBackend):
    """The stand-in's backend with the test's image and a short image-pull timeout."""

    overrides = {"image": IMAGE, "image_pull_timeout_s": 1.5}


@pytest.mark.slow
async def test_the_broker_shows_the_wait_then_fails_the_job_and_releases_its_grant(
    tmp_path: Path,
) -> None:
    fake = FakeKube()
    fake.unpullable[IMAGE] = NOT_FOUND
    app = await start_broker_on(fake, tmp_path, WaitingBackend)
    try:
        status, job = await call(app, "POST", "/jobs", "tok-alice-srv", {
            "notebook": nbs.simple(), "profile": "job-1gpu", "max_runtime": 300})
        assert status == 201, job
        name = f"gpushare-{job['id']}-a1"
        deadline = time.monotonic() + 30
        while ("jupyterhub", name) not in fake.jobs:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        assert app.broker.state.grants  # the broker granted it
        fake.admit(name)
        waiting = f"waiting: the image {IMAGE} cannot be pulled: not found in the registry"
        seen = None
        while True:
            _, now = await call(app, "GET", f"/jobs/{job['id']}", "tok-alice")
            if now["state"] != "running":
                break
            if waiting in (now.get("reason") or ""):
                seen = now
            assert time.monotonic() < deadline, now
            await asyncio.sleep(0.05)
        assert seen is not None and seen["started_at"] is None  # it never ran
        assert now["state"] == "failed", now
        assert "could not be pulled" in now["reason"] and IMAGE in now["reason"], now
        _, events = await call(app, "GET", f"/jobs/{job['id']}/events", "tok-alice")
        said = [e for e in events["events"] if waiting in (e.get("reason") or "")]
        assert len(said) == 1, events  # said once, though the kubelet's words alternate
        assert not app.broker.state.grants  # the grant is released
        nothing_left(fake)  # nothing left running on the cluster
    finally:
        await app.stop_async()
