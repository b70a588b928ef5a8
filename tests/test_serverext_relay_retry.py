"""The lab's jobs calls through the server extension outlive a broker restart.

The broker restarts under its supervisor within seconds (a crash, ``kill -9``); the lab should not
see that as an error. ``JobsRelayHandler.broker_call`` sends a call again within
``c.GPUShareServerApp.broker_retry_window_s`` when the connection was refused (the broker got
nothing), and a GET or DELETE also after a 502/503/504. A job submission carries an
idempotency key, so it too is sent again after a 503 or a connection cut before the answer
(the broker answers the repeat with the job the first made); a POST without a key is never
sent twice. Found by the soak harness (issue 28): the lab got 503 for the seconds a killed
broker took to come back, and later for a submit cut by the kill itself.

A real jupyter_server with the extension, and a real broker started on the port the extension
already points at, after the lab's call began.
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
from brokerkit import BASE, free_port, start_broker, static_tokens
from brokerkit import call as broker_call
from pytest_jupyter.jupyter_server import *  # noqa: F403 (fixtures)
from telemetry_fakes import EXT_CONFIG, clear_gpushare_env
from tornado.httpclient import HTTPClientError
from tornado.httpserver import HTTPServer
from tornado.web import Application, RequestHandler

from jupyter_gpushare.policy import load_policy
from jupyter_gpushare.serverextension.job_relay import may_send_again

POLICY = Path(__file__).resolve().parent / "data" / "jobs_policy.yaml"
WINDOW_S = 8.0


@pytest_asyncio.fixture
async def jp_asyncio_loop():
    """Serve on pytest-asyncio's loop, the one the broker and the tests run in."""
    yield asyncio.get_running_loop()


@pytest.fixture
def port(monkeypatch: pytest.MonkeyPatch) -> int:
    """The broker's port, known to the server before anything listens on it."""
    chosen = free_port()
    clear_gpushare_env(monkeypatch)
    monkeypatch.setenv("GPUSHARE_BROKER_URL", f"http://127.0.0.1:{chosen}{BASE}")
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "tok-alice-srv")
    return chosen


@pytest.fixture
def jp_server_config(port: int) -> dict[str, Any]:
    return {**EXT_CONFIG, "GPUShareServerApp": {"broker_retry_window_s": WINDOW_S}}


async def fetch(jp_fetch: Any, *parts: str, **kw: Any) -> tuple[int, bytes]:
    try:
        r = await jp_fetch(*parts, **kw)
    except HTTPClientError as exc:
        assert exc.response is not None
        return exc.code, exc.response.body
    return r.code, r.body


@pytest.mark.parametrize("method", ["GET", "POST"])
async def test_a_call_while_the_broker_restarts_is_answered_once_it_serves(
    method: str, port: int, jp_fetch: Any, jp_root_dir: Path, tmp_path: Path,
) -> None:
    (jp_root_dir / "train.ipynb").write_text(json.dumps(nbs.simple()))
    body = {"path": "train.ipynb", "profile": "job-1gpu", "max_runtime": 300}
    started = time.monotonic()
    call = asyncio.ensure_future(fetch(
        jp_fetch, "gpushare", "api", "jobs", method=method,
        **({"body": json.dumps(body)} if method == "POST" else {})))
    await asyncio.sleep(1.5)  # the broker is down: every connection is refused
    assert not call.done(), call.result()
    broker = await start_broker(load_policy(str(POLICY)), f"sqlite:///{tmp_path}/b.sqlite",
                                static_tokens({"alice": ["vision"]}), port=port)
    try:
        status, answer = await asyncio.wait_for(call, WINDOW_S + 5)
        assert status == (201 if method == "POST" else 200), answer
        assert 1.5 <= time.monotonic() - started < WINDOW_S + 2
        if method == "POST":  # submitted once, not once per try
            _, jobs = await broker_call(broker, "GET", "/jobs", "tok-alice")
            assert len(jobs if isinstance(jobs, list) else jobs["jobs"]) == 1, jobs
    finally:
        await broker.stop_async()


class Always503(RequestHandler):
    seen: list[str] = []

    def prepare(self) -> None:
        Always503.seen.append(self.request.method or "")
        self.set_status(503)
        self.finish(json.dumps({"error": "restarting"}))


@pytest.mark.parametrize("method", ["GET", "DELETE", "POST"])  # the lab's POST: keyed
async def test_a_503_after_the_broker_got_the_call_is_retried_when_idempotent(
    method: str, port: int, jp_fetch: Any, jp_root_dir: Path,
) -> None:
    (jp_root_dir / "train.ipynb").write_text(json.dumps(nbs.simple()))
    Always503.seen = []
    server = HTTPServer(Application([(r".*", Always503)]))
    server.listen(port, "127.0.0.1")
    try:
        parts = ("gpushare", "api", "jobs") + (("j-1",) if method == "DELETE" else ())
        kw = {"body": json.dumps({"path": "train.ipynb", "profile": "job-1gpu",
                                  "max_runtime": 300})} if method == "POST" else {}
        started = time.monotonic()
        status, answer = await fetch(jp_fetch, *parts, method=method, **kw)
        took = time.monotonic() - started
    finally:
        server.stop()
    assert status == 503 and b"restarting" in answer, answer
    assert len(Always503.seen) > 3 and WINDOW_S - 1 <= took < WINDOW_S + 3, (
        Always503.seen, took)


class CutOnce(RequestHandler):
    """Takes the first POST and closes the connection without an answer (a broker killed
    after storing the job); answers every later POST with the job the first made."""

    bodies: list[dict[str, Any]] = []

    def post(self) -> None:
        CutOnce.bodies.append(json.loads(self.request.body))
        if len(CutOnce.bodies) == 1:
            assert self.request.connection is not None
            self.request.connection.stream.close()  # type: ignore[attr-defined]
            return
        self.set_status(200)
        self.finish(json.dumps({"id": "j-first", "state": "queued"}))


async def test_a_submit_cut_before_its_answer_is_sent_again_with_its_key(
    port: int, jp_fetch: Any, jp_root_dir: Path,
) -> None:
    (jp_root_dir / "train.ipynb").write_text(json.dumps(nbs.simple()))
    CutOnce.bodies = []
    server = HTTPServer(Application([(r".*", CutOnce)]))
    server.listen(port, "127.0.0.1")
    try:
        status, answer = await fetch(
            jp_fetch, "gpushare", "api", "jobs", method="POST",
            body=json.dumps({"path": "train.ipynb", "profile": "job-1gpu", "max_runtime": 300}))
    finally:
        server.stop()
    assert status == 200 and json.loads(answer)["id"] == "j-first", answer
    keys = [b.get("idempotency_key") for b in CutOnce.bodies]
    assert len(keys) == 2 and keys[0] == keys[1] and str(keys[0]).startswith("lab-"), keys


@pytest.mark.parametrize(("method", "status", "unsent", "again"), [
    ("POST", 503, True, True),     # refused: the broker received nothing
    ("POST", 503, False, False),   # it got the job: never twice without a key
    ("POST", 502, False, False),
    ("GET", 502, False, True),
    ("GET", 504, False, True),
    ("GET", 500, False, False),    # a bug is not a restart
    ("GET", 501, False, False),
    ("DELETE", 503, False, True),
    ("GET", 404, False, False),
    ("GET", 200, False, False),
])
def test_what_may_be_sent_again(method: str, status: int, unsent: bool, again: bool) -> None:
    assert may_send_again(method, status, unsent) is again


@pytest.mark.parametrize(("status", "again"), [(503, True), (502, True), (504, True),
                                               (500, False), (409, False), (201, False)])
def test_a_keyed_post_is_sent_again_only_after_a_restart_status(status: int, again: bool) -> None:
    assert may_send_again("POST", status, False, keyed=True) is again
