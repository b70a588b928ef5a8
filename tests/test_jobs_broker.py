"""Batch jobs through the broker's HTTP API, run for real by papermill on the local backend.

An in-process broker (static tokens, the small two-team policy of ``data/jobs_policy.yaml``
with second-long grace periods); every job is a real ``papermill_run`` process with a real
kernel, so the tests keep the notebooks small and combine steps where they can.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import jobnotebooks as nbs
import pytest
from brokerkit import call, start_broker, static_tokens

from jupyter_gpushare.broker.ops.reconcile import reconcile
from jupyter_gpushare.core.model import GPUAsk, Kind, Request
from jupyter_gpushare.policy import load_policy

pytestmark = pytest.mark.slow
POLICY = Path(__file__).resolve().parent / "data" / "jobs_policy.yaml"


@pytest.fixture
async def app(tmp_path: Path) -> Any:
    tokens = static_tokens({"alice": ["vision"], "bob": ["nlp"]})
    app = await start_broker(
        load_policy(str(POLICY)), f"sqlite:///{tmp_path}/jobs.sqlite", tokens,
    )
    app.jobs.user_root_template = str(tmp_path / "home" / "{username}")
    app.jobs.cancel_grace_s = 2.0
    for user in ("alice", "bob"):
        (tmp_path / "home" / user).mkdir(parents=True)
    yield app
    for job in list(app.jobs.store.live.values()):  # leave no process behind
        if job.handle:
            from jupyter_gpushare.backends.base import RunHandle

            app.jobs.backend.kill(RunHandle.from_json(job.handle))
    await app.stop_async()


def outputs_text(nb: dict[str, Any]) -> str:
    parts = []
    for cell in nb["cells"]:
        for out in cell.get("outputs", []):
            text = out.get("text", "")
            parts.append("".join(text) if isinstance(text, list) else text)
    return "".join(parts)


async def submit(app: Any, token: str, nb: dict[str, Any], **body: Any) -> tuple[int, Any]:
    body.setdefault("profile", "job-1gpu")
    body.setdefault("max_runtime", 300)
    return await call(app, "POST", "/jobs", token, {"notebook": nb, **body})


async def wait_state(
    app: Any, token: str, job_id: str, states: set[str], timeout: float = 90
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        status, job = await call(app, "GET", f"/jobs/{job_id}", token)
        assert status == 200, job
        if job["state"] in states:
            return dict(job)
        assert time.monotonic() < deadline, (job, app.jobs.backend.read_log(job_id)[0][-3000:])
        await asyncio.sleep(0.2)


async def test_submit_runs_to_completion_with_output_log_and_history(
    app: Any, tmp_path: Path
) -> None:
    status, job = await submit(app, "tok-alice-srv", nbs.simple(), path="work/demo.ipynb",
                               parameters={"greeting": "bonjour", "repeat": 2})
    assert status == 201, job
    assert job["state"] == "admitted" and job["team"] == "vision" and job["pool"] == "train"
    done = await wait_state(app, "tok-alice", job["id"], {"succeeded", "failed"})
    assert done["state"] == "succeeded", done
    out = tmp_path / "home" / "alice" / done["output_path"]
    assert done["output_path"].startswith("work/demo-") and out.exists()
    executed = json.loads(out.read_text())
    texts = outputs_text(executed)
    assert "bonjourbonjour " + job["id"] in texts  # the parameters were injected
    assert "CUDA_VISIBLE_DEVICES=''" in texts  # the grant's enforcement (simulated GPU)
    assert (out.parent / f"marker-{job['id']}").read_text() == "bonjour"  # ran in its folder
    assert done["gpu_hours"] > 0 and done["grant_id"] is None
    assert not app.broker.state.grants  # the grant lived exactly as long as the run
    status, events = await call(app, "GET", f"/jobs/{job['id']}/events", "tok-alice")
    assert [(e["from"], e["to"]) for e in events["events"]] == [
        (None, "queued"), ("queued", "admitted"), ("admitted", "running"),
        ("running", "succeeded"),
    ]
    status, log = await call(app, "GET", f"/jobs/{job['id']}/log?tail=2000", "tok-alice")
    assert status == 200 and "bonjourbonjour" in log
    status, output = await call(app, "GET", f"/jobs/{job['id']}/output", "tok-alice")
    assert status == 200 and output["cells"][0]["metadata"]["tags"] == ["injected-parameters"] \
        or "parameters" in json.dumps(output)
    # another user sees nothing of it
    assert (await call(app, "GET", f"/jobs/{job['id']}", "tok-bob"))[0] == 404
    assert (await call(app, "DELETE", f"/jobs/{job['id']}", "tok-bob"))[0] == 404
    _, mine = await call(app, "GET", "/jobs", "tok-bob")
    assert mine["jobs"] == []
    _, everyone = await call(app, "GET", "/jobs?all=1", "tok-admin")
    assert [j["id"] for j in everyone["jobs"]] == [job["id"]]
    assert (await call(app, "GET", "/jobs?all=1", "tok-bob"))[0] == 403
    # log retention: a month later the log and snapshot go, the job's row and history stay
    jobdir = Path(app.jobs.backend.job_dir(job["id"]))
    assert jobdir.exists() and app.jobs.sweep(time.time()) == []
    assert app.jobs.sweep(time.time() + 31 * 86400) == [job["id"]] and not jobdir.exists()
    assert (await call(app, "GET", f"/jobs/{job['id']}/events", "tok-alice"))[0] == 200


async def test_a_failing_notebook_keeps_its_output_and_names_the_cell(
    app: Any, tmp_path: Path
) -> None:
    status, job = await submit(app, "tok-bob", nbs.raising(), name="fails.ipynb",
                               parameters={"x": 7})
    assert status == 201, job
    done = await wait_state(app, "tok-bob", job["id"], {"succeeded", "failed"})
    assert done["state"] == "failed"
    err = done["error"]
    assert err["ename"] == "ValueError" and err["evalue"] == "bad value 7"
    assert err["summary"] == "cell 3 failed: ValueError: bad value 7"  # as submitted
    assert err["executed_cell_index"] == 3  # after the injected parameters cell
    assert "raise ValueError" in err["source"] and "\x1b" not in err["traceback"]
    assert done["reason"] == err["summary"]
    executed = json.loads((tmp_path / "home" / "bob" / done["output_path"]).read_text())
    assert "before the error" in outputs_text(executed)
    assert not app.broker.state.grants


async def test_the_limit_watchdog_stops_a_job_over_its_memory_limit(app: Any) -> None:
    """A job whose kernel (simulated) uses more than its grant fails with the watchdog's
    message, as a kernel in JupyterLab is told."""
    app.jobs.extra_env = {"GPUSHARE_SIMULATED_JOB_MEMORY_MIB": "200000"}
    status, job = await submit(app, "tok-bob", nbs.sleeping(120), name="big.ipynb")
    assert status == 201, job
    done = await wait_state(app, "tok-bob", job["id"], {"succeeded", "failed"}, timeout=60)
    assert done["state"] == "failed"
    assert done["reason"].startswith("GPU memory limit 141.0 GiB exceeded: kernel of big.ipynb "
                                     "used 195.3 GiB"), done["reason"]
    assert done["error"]["ename"] == "GPUMemoryLimitExceeded"
    assert not app.broker.state.grants


async def test_refusals_name_the_field_and_store_nothing(app: Any) -> None:
    outside = Path(app.jobs.user_root("bob")) / "elsewhere"
    outside.symlink_to("/tmp")  # a link inside bob's files that leads out of them
    cases = [
        (dict(output_path="elsewhere/x.ipynb"), "tok-bob", 400, "output_path"),
        (dict(profile="vision-1gpu"), "tok-bob", 403, "profile"),  # another team's profile
        (dict(profile="nope"), "tok-bob", 400, "profile"),
        (dict(priority="interactive"), "tok-bob", 403, "priority"),  # not allowed here
        (dict(max_runtime=None), "tok-bob", 400, "checkpoint"),  # 1 h, preemptible, no ckpt
        (dict(max_runtime=7200, checkpoint=True), "tok-bob", 400, "max_runtime"),
        (dict(notebook={"cells": "x"}), "tok-bob", 400, "notebook"),
        (dict(parameters={"not a name": 1}), "tok-bob", 400, "parameters.not a name"),
        (dict(parameters=[1, 2]), "tok-bob", 400, "parameters"),
        (dict(output_path="../escape.ipynb"), "tok-bob", 400, "output_path"),
        (dict(path="/etc/passwd.ipynb"), "tok-bob", 400, "path"),
        (dict(team="vision"), "tok-bob", 403, "team"),
        (dict(checkpoint="yes"), "tok-bob", 400, "checkpoint"),
        # an explicit GPU ask: only where the policy allows one (admins here)
        (dict(profile=None, pool="train", gpu={"count": 1}, priority="research"), "tok-bob",
         403, "profile"),
        (dict(profile=None, pool="nowhere", gpu={"count": 1}), "tok-bob", 400, "pool"),
    ]
    for extra, token, code, field in cases:
        body: dict[str, Any] = {"notebook": nbs.simple(), "profile": "job-1gpu",
                                "max_runtime": 300, **extra}
        body = {k: v for k, v in body.items() if v is not None}
        status, answer = await call(app, "POST", "/jobs", token, body)
        assert (status, answer.get("field")) == (code, field), (extra, answer)
    assert (await call(app, "GET", "/jobs?all=1", "tok-admin"))[1]["jobs"] == []
    assert not app.broker.state.grants and not app.broker.queue
    # the long preemptible job is fine once it declares checkpointing
    status, ok = await submit(app, "tok-bob", nbs.simple(), max_runtime=None, checkpoint=True)
    assert status == 201 and ok["max_runtime"] == 3600
    await call(app, "DELETE", f"/jobs/{ok['id']}", "tok-bob")
    status, explicit = await call(app, "POST", "/jobs", "tok-admin", {
        "notebook": nbs.simple(), "pool": "train", "gpu": {"count": 1}, "priority": "research",
        "team": "nlp", "max_runtime": 60})
    assert status == 201 and explicit["team"] == "nlp" and explicit["profile"] == "", explicit
    await call(app, "DELETE", f"/jobs/{explicit['id']}", "tok-admin")


async def test_debug_pool_refuses_instead_of_queueing(app: Any) -> None:
    first = await submit(app, "tok-bob", nbs.sleeping(30), profile="debug-quarter")
    assert first[0] == 201
    status, answer = await submit(app, "tok-bob", nbs.sleeping(30), profile="debug-quarter")
    assert status == 409 and answer["state"] == "refused" and answer["reason"]
    jobs = (await call(app, "GET", "/jobs", "tok-bob"))[1]["jobs"]
    assert [j["id"] for j in jobs] == [first[1]["id"]]
    await call(app, "DELETE", f"/jobs/{first[1]['id']}", "tok-bob")


async def test_queue_cancel_preemption_requeue_and_resume(app: Any) -> None:
    """nlp fills both GPUs (one borrowed from vision); a third job queues with its position
    and is cancelled; vision reclaims its guarantee: the borrowed counting job gets SIGTERM,
    is requeued and resumes from its checkpoint; a running job is cancelled."""
    s1, long_job = await submit(app, "tok-bob", nbs.sleeping(120))
    await wait_state(app, "tok-bob", long_job["id"], {"running"})
    s2, counter = await submit(app, "tok-bob", nbs.counting(steps=14, delay=0.4),
                               checkpoint=True)
    assert (s1, s2) == (201, 201)
    assert counter["borrowed"] is True
    status, queued = await submit(app, "tok-bob", nbs.simple())
    assert status == 201 and queued["state"] == "queued"
    assert queued["position"] == 1 and "borrow" in queued["queue_reason"]
    status, cancelled = await call(app, "DELETE", f"/jobs/{queued['id']}", "tok-bob")
    assert status == 200 and cancelled["state"] == "cancelled"
    assert queued["request_id"] not in app.broker.queue
    # let the counter make progress, then vision reclaims its guaranteed GPU
    ckpt = Path(app.jobs.backend.checkpoint_dir(counter["id"]))
    deadline = time.monotonic() + 120
    while not (ckpt / "count.json").exists() or json.loads(
        (ckpt / "count.json").read_text()
    )["done"] < 2:
        assert time.monotonic() < deadline, app.jobs.backend.read_log(counter["id"])[0]
        await asyncio.sleep(0.2)
    status, reclaim = await submit(app, "tok-alice", nbs.simple())
    assert status == 201 and reclaim["state"] == "queued", reclaim  # preempting the borrower
    await wait_state(app, "tok-bob", counter["id"], {"queued"}, timeout=90)
    done_alice = await wait_state(app, "tok-alice", reclaim["id"], {"succeeded", "failed"})
    assert done_alice["state"] == "succeeded"
    # cancel the long-running job: SIGTERM, then SIGKILL after the cancel grace
    status, _ = await call(app, "DELETE", f"/jobs/{long_job['id']}", "tok-bob")
    assert status == 200
    gone = await wait_state(app, "tok-bob", long_job["id"], {"cancelled", "failed"})
    assert gone["state"] == "cancelled"
    done = await wait_state(app, "tok-bob", counter["id"], {"succeeded", "failed"})
    assert done["state"] == "succeeded" and done["attempt"] == 2, done
    attempts = (ckpt / "attempts.txt").read_text().split("\n")
    assert attempts[0] == "1 0" and attempts[1].startswith("2 ")
    assert (ckpt / "sigterm").read_text() == "1\n"  # the kernel itself got the notice
    resumed_from = int(attempts[1].split()[1])
    assert resumed_from >= 2, attempts  # the second attempt found its checkpoint
    _, events = await call(app, "GET", f"/jobs/{counter['id']}/events", "tok-bob")
    path = [e["to"] for e in events["events"]]
    assert path == ["queued", "admitted", "running", "running", "preempted", "queued",
                    "admitted", "running", "succeeded"], events
    assert any("SIGTERM" in e["reason"] for e in events["events"])
    # both attempts are in the ledger: two released grants held by this job
    from sqlalchemy import select

    from jupyter_gpushare.broker.store.db import grants_table

    with app.broker.engine.connect() as conn:
        rows = list(conn.execute(
            select(grants_table).where(grants_table.c.server == counter["id"])
        ))
    assert len(rows) == 2 and all(r.released_at is not None for r in rows)
    hours = sum(r.units_milli / 1000 * (r.released_at - r.granted_at) / 3600 for r in rows)
    assert done["gpu_hours"] == pytest.approx(hours, rel=0.05, abs=1e-4)
    assert not app.broker.state.grants and not app.broker.queue


@pytest.mark.parametrize("turns", [0, 1, 2, 3])
async def test_the_job_loop_stops_when_a_wake_up_races_the_cancel(app: Any, turns: int) -> None:
    """A run that ends wakes the loop; when that wake-up lands just as the loop is cancelled
    (the fixture kills the runs, then stops), the cancel is not lost: on Python 3.11
    ``asyncio.wait_for`` swallowed it and ``stop()`` (and the test's teardown) hung."""
    await asyncio.sleep(0.3)  # the loop is idle, waiting for a wake-up
    task = app.jobs._task
    app.jobs.wake.set()
    for _ in range(turns):
        await asyncio.sleep(0)
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=5)
    if not done:  # let the teardown finish
        app.jobs._stopping = True
        task.cancel()
    assert done, "a cancel of the job loop was lost"
    app.jobs._task = asyncio.ensure_future(app.jobs._loop())  # stop() ends it again
    app.jobs.wake.set()
    for _ in range(turns):
        await asyncio.sleep(0)
    await asyncio.wait_for(app.jobs.stop(), 15)
    assert app.jobs._task is None


async def test_reconcile_releases_batch_grants_without_a_job(app: Any) -> None:
    now = app.broker.clock()
    req = Request(id="r-fake", user="bob", team="nlp", pool="train", gpu=GPUAsk(whole=1),
                  priority="research", kind=Kind.BATCH, holder="job-made-up", created_at=now,
                  max_runtime_s=60)
    answer = app.broker.submit(req)
    assert answer["status"] == "granted", answer
    result = await reconcile(app.broker, app.checker, 0)
    assert [r["server"] for r in result["released"]] == ["job-made-up"]
    assert not app.broker.state.grants


async def test_a_job_that_ignores_sigterm_is_killed_at_the_deadline(app: Any) -> None:
    """Preemption: SIGTERM, the grace period (3 s for research here), then SIGKILL and a
    requeue; cancel: SIGTERM, the cancel grace (2 s), then SIGKILL."""
    s1, own = await submit(app, "tok-bob", nbs.sleeping(120))
    await wait_state(app, "tok-bob", own["id"], {"running"})
    s2, borrowed = await submit(app, "tok-bob", nbs.stubborn())
    assert (s1, s2) == (201, 201) and borrowed["borrowed"] is True
    await wait_state(app, "tok-bob", borrowed["id"], {"running"})
    log_of = app.jobs.backend.read_log
    deadline = time.monotonic() + 60
    while b"ignoring SIGTERM" not in log_of(borrowed["id"])[0]:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.2)
    t0 = time.monotonic()
    status, reclaim = await submit(app, "tok-alice", nbs.sleeping(1))
    assert status == 201
    requeued = await wait_state(app, "tok-bob", borrowed["id"], {"queued"}, timeout=30)
    assert time.monotonic() - t0 >= 2.5  # not before the grace period ran out
    assert requeued["attempt"] == 2
    _, events = await call(app, "GET", f"/jobs/{borrowed['id']}/events", "tok-bob")
    assert [e["to"] for e in events["events"]][-3:] == ["running", "preempted", "queued"]
    await call(app, "DELETE", f"/jobs/{own['id']}", "tok-bob")
    gone = await wait_state(app, "tok-bob", own["id"], {"cancelled", "failed"}, timeout=30)
    assert gone["state"] == "cancelled"
    await wait_state(app, "tok-alice", reclaim["id"], {"succeeded", "failed"})
    again = await wait_state(app, "tok-bob", borrowed["id"], {"running"}, timeout=60)
    while b"ignoring SIGTERM" not in log_of(borrowed["id"])[0].split(b"attempt 2")[-1]:
        await asyncio.sleep(0.2)
    t1 = time.monotonic()
    await call(app, "DELETE", f"/jobs/{again['id']}", "tok-bob")
    done = await wait_state(app, "tok-bob", borrowed["id"], {"cancelled", "failed"}, timeout=30)
    assert done["state"] == "cancelled" and time.monotonic() - t1 >= 1.5  # after the grace
    assert not app.broker.state.grants


async def test_a_cancel_while_the_run_is_being_started_stops_it(
    app: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cancel that lands while the backend is still starting the run (no handle to signal
    yet) is carried out once the run has started: SIGTERM, SIGKILL after the grace, the job
    cancelled and its grant released. Before, the run started as if nothing had been asked and
    held its GPU to the end (seen from jupyter-scheduler: deleting a definition right after its
    run was submitted)."""
    backend = app.jobs.backend
    real_submit = backend.submit
    submitting = asyncio.Event()
    loop = asyncio.get_running_loop()

    def slow_submit(spec: Any) -> Any:
        loop.call_soon_threadsafe(submitting.set)
        time.sleep(1.5)  # the engine takes its time; the user cancels meanwhile
        return real_submit(spec)

    monkeypatch.setattr(backend, "submit", slow_submit)
    status, job = await submit(app, "tok-alice-srv", nbs.stubborn(120))
    assert status == 201, job
    await asyncio.wait_for(submitting.wait(), 30)
    status, asked = await call(app, "DELETE", f"/jobs/{job['id']}", "tok-alice")
    assert status == 200 and asked["state"] == "admitted", asked  # still being started
    started = time.monotonic()
    done = await wait_state(app, "tok-alice", job["id"], {"cancelled", "succeeded", "failed"},
                            timeout=60)
    assert done["state"] == "cancelled", done
    # the stubborn notebook ignores SIGTERM: it ended by the SIGKILL after cancel_grace_s (2 s)
    assert time.monotonic() - started < 30
    assert done["grant_id"] is None and not app.broker.state.grants
