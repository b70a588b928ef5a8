"""The real client (``AsyncKubeClient`` on kubernetes_asyncio): the HTTP requests it builds.

No API server can run here; a tiny HTTP server in the test records each request (method,
path, query, body) and answers with canned API objects or errors, so the client's real
request building, its event loop in its own thread, and its error mapping are exercised
over real HTTP. What the answers mean is not exercised (that needs a cluster).
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest
import tornado.httpserver
import tornado.web
from kubejobkit import run_spec

from jupyter_gpushare.backends.kube_client import AlreadyExists, AsyncKubeClient, KubeError
from jupyter_gpushare.backends.kube_objects import JobTemplate, configmap_manifest, job_manifest

NS = "jupyterhub"


class Recorder(tornado.web.RequestHandler):
    def initialize(self, log: list[dict[str, Any]], answers: dict[tuple[str, str], Any]) -> None:
        self.log_ = log
        self.answers = answers

    def _any(self) -> None:
        body = self.request.body.decode() if self.request.body else ""
        self.log_.append({"method": self.request.method, "path": self.request.path,
                          "query": {k: v[0].decode() for k, v in
                                    self.request.query_arguments.items()},
                          "body": json.loads(body) if body else None})
        status, answer = self.answers.get((self.request.method or "", self.request.path),
                                          (404, {"kind": "Status", "code": 404,
                                                 "reason": "NotFound"}))
        self.set_status(status)
        if isinstance(answer, str):
            self.set_header("Content-Type", "text/plain")
            self.finish(answer)
        else:
            self.set_header("Content-Type", "application/json")
            self.finish(json.dumps(answer))

    get = post = delete = put = patch = _any  # type: ignore[assignment]


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, list[dict[str, Any]], dict]]:
    log: list[dict[str, Any]] = []
    answers: dict[tuple[str, str], Any] = {}
    app = tornado.web.Application([(r"/.*", Recorder, {"log": log, "answers": answers})])
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    sock.setblocking(False)
    http = tornado.httpserver.HTTPServer(app)
    http.add_sockets([sock])
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", log, answers
    finally:
        http.stop()


def client_for(url: str) -> AsyncKubeClient:
    from kubernetes_asyncio.client import Configuration

    conf = Configuration(host=url)
    return AsyncKubeClient(conf, timeout_s=10)


async def test_requests_of_every_call(server: tuple[str, list, dict]) -> None:
    url, log, answers = server
    spec = run_spec("fraction")
    job = job_manifest(spec, "o.ipynb", JobTemplate(gpu_backend="hami"))
    cm = configmap_manifest(spec, "o.ipynb", JobTemplate())
    name = job["metadata"]["name"]
    jobs = f"/apis/batch/v1/namespaces/{NS}/jobs"
    answers[("POST", jobs)] = (201, {**job, "metadata": {**job["metadata"], "uid": "u-1"}})
    answers[("GET", f"{jobs}/{name}")] = (200, {**job, "status": {"active": 1}})
    answers[("DELETE", f"{jobs}/{name}")] = (200, {"kind": "Status", "status": "Success"})
    answers[("GET", jobs)] = (200, {"kind": "JobList", "apiVersion": "batch/v1",
                                    "items": [job]})
    answers[("POST", f"/api/v1/namespaces/{NS}/configmaps")] = (201, cm)
    answers[("GET", f"/api/v1/namespaces/{NS}/pods")] = (200, {
        "kind": "PodList", "apiVersion": "v1", "items": [{
            "metadata": {"name": "p-1", "labels": {"job-name": name}},
            "status": {"phase": "Running"}}]})
    answers[("DELETE", f"/api/v1/namespaces/{NS}/pods/p-1")] = (200, {"kind": "Pod"})
    answers[("GET", f"/api/v1/namespaces/{NS}/pods/p-1/log")] = (200, "line 1\nline 2\n")
    answers[("GET", f"/api/v1/namespaces/{NS}/events")] = (200, {
        "kind": "EventList", "apiVersion": "v1", "items": [{
            "metadata": {"name": "p-1.1"}, "type": "Warning", "reason": "FailedAttachVolume",
            "message": "Multi-Attach error for volume \"pvc-1\"",
            "involvedObject": {"kind": "Pod", "name": "p-1"}}]})
    client = client_for(url)
    loop = asyncio.get_running_loop()

    def calls() -> dict[str, Any]:
        out: dict[str, Any] = {}
        out["created"] = client.create_job(NS, job)
        out["got"] = client.get_job(NS, name)
        out["missing"] = client.get_job(NS, "nope")
        client.create_configmap(NS, cm)
        out["pods"] = client.list_pods(NS, "gpushare.jupyter.org/job-id=job-1")
        out["jobs"] = client.list_jobs(NS, "gpushare.jupyter.org/job-id=job-1")
        client.delete_pod(NS, "p-1", 120)
        out["log"] = client.read_pod_log(NS, "p-1", "notebook")
        out["events"] = client.list_events(NS, "involvedObject.kind=Pod,involvedObject.name=p-1")
        client.delete_job(NS, name, propagation="Foreground", grace_s=0)
        client.delete_job(NS, "gone")  # 404: no error
        out["workloads"] = client.list_workloads(NS, "kueue.x-k8s.io/job-uid=u-1")
        return out

    try:
        out = await loop.run_in_executor(None, calls)
    finally:
        await loop.run_in_executor(None, client.close)
    assert out["created"]["metadata"]["uid"] == "u-1"
    assert out["got"]["status"] == {"active": 1}
    assert out["missing"] is None
    assert out["pods"][0]["metadata"]["name"] == "p-1"
    assert out["jobs"][0]["metadata"]["name"] == name
    assert out["log"] == "line 1\nline 2\n"
    assert out["events"][0]["reason"] == "FailedAttachVolume"
    assert out["workloads"] == []  # Kueue's API absent (404): no workloads, no error
    by = {(r["method"], r["path"]): r for r in log}
    sent = by["POST", jobs]["body"]
    assert sent["spec"]["suspend"] is True  # the manifest went as built
    assert sent["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpushare-vision"
    assert sent["spec"]["template"]["spec"]["schedulerName"] == "hami-scheduler"
    assert by["GET", f"/api/v1/namespaces/{NS}/pods"]["query"] == {
        "labelSelector": "gpushare.jupyter.org/job-id=job-1"}
    assert by["DELETE", f"/api/v1/namespaces/{NS}/pods/p-1"]["body"] == {
        "gracePeriodSeconds": 120}
    assert by["DELETE", f"{jobs}/{name}"]["body"] == {
        "propagationPolicy": "Foreground", "gracePeriodSeconds": 0}
    assert by["GET", f"/api/v1/namespaces/{NS}/pods/p-1/log"]["query"] == {
        "container": "notebook"}
    assert by["GET", f"/api/v1/namespaces/{NS}/events"]["query"] == {
        "fieldSelector": "involvedObject.kind=Pod,involvedObject.name=p-1"}
    wl = by["GET", f"/apis/kueue.x-k8s.io/v1beta2/namespaces/{NS}/workloads"]
    assert wl["query"] == {"labelSelector": "kueue.x-k8s.io/job-uid=u-1"}


async def test_errors_are_mapped(server: tuple[str, list, dict]) -> None:
    url, log, answers = server
    job = job_manifest(run_spec("whole"), "o.ipynb", JobTemplate())
    jobs = f"/apis/batch/v1/namespaces/{NS}/jobs"
    answers[("POST", jobs)] = (409, {"kind": "Status", "code": 409, "reason": "AlreadyExists"})
    answers[("GET", f"/api/v1/namespaces/{NS}/pods")] = (403, {
        "kind": "Status", "code": 403, "message": "pods is forbidden"})
    client = client_for(url)
    loop = asyncio.get_running_loop()
    try:
        with pytest.raises(AlreadyExists):
            await loop.run_in_executor(None, client.create_job, NS, job)
        with pytest.raises(KubeError, match="403.*forbidden"):
            await loop.run_in_executor(None, client.list_pods, NS, "a=b")
    finally:
        await loop.run_in_executor(None, client.close)
