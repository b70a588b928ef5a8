"""Batch jobs on a real Slurm cluster (tests/slurmcluster.py: slurmctld and five slurmd in
their own namespaces) through a real in-process broker with ``SlurmBackend``.

The policy (``data/slurm_jobs_policy.yaml``) names the cluster's nodes; every job is a real
``sbatch`` job running the real papermill runner and kernel on the node the broker chose.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jobnotebooks as nbs
import pytest
import slurmjobs
from brokerkit import call, start_broker, static_tokens
from slurmcluster import SlurmCluster, needs_slurm, running_cluster
from test_jobs_broker import outputs_text, submit, wait_state
from traitlets.config import Config

from jupyter_gpushare.backends.base import RunHandle
from jupyter_gpushare.backends.slurm import SlurmBackend
from jupyter_gpushare.policy import load_policy

pytestmark = [pytest.mark.slow, needs_slurm]
POLICY = Path(__file__).resolve().parent / "data" / "slurm_jobs_policy.yaml"
NODES = ["sl-t-0", "sl-x-0", "sl-x-1", "sl-s-0", "sl-w-0"]  # ghost-0 of the policy is no Slurm node


@pytest.fixture(scope="module")
def cluster() -> Iterator[SlurmCluster]:
    with running_cluster(nodes=NODES, gpus_per_node=2, shards_per_gpu=4) as c:
        yield c


def broker_config(cluster: SlurmCluster, tmp_path: Path) -> Config:
    config = Config()
    config.JobManager.backend_class = SlurmBackend
    config.JobManager.jobs_dir = str(tmp_path / "jobs")
    config.JobManager.user_root_template = str(tmp_path / "home" / "{username}")
    config.JobManager.cancel_grace_s = 2.0
    config.SlurmBackend.slurm_conf = cluster.conf_path
    config.SlurmBackend.pass_account = True  # accepted as is: this cluster has no slurmdbd
    config.SlurmBackend.pass_qos = True
    config.SlurmBackend.min_poll_interval_s = 0.3
    config.SlurmBackend.node_return_interval_s = 0.4
    return config


async def start(cluster: SlurmCluster, tmp_path: Path) -> Any:
    for user in ("alice", "bob"):
        (tmp_path / "home" / user).mkdir(parents=True, exist_ok=True)
    return await start_broker(
        load_policy(str(POLICY)), f"sqlite:///{tmp_path}/jobs.sqlite",
        static_tokens({"alice": ["vision"], "bob": ["nlp"]}),
        config=broker_config(cluster, tmp_path),
    )


@pytest.fixture
async def app(cluster: SlurmCluster, tmp_path: Path) -> Any:
    app = await start(cluster, tmp_path)
    yield app
    for job in list(app.jobs.store.live.values()):  # leave no Slurm job behind
        if job.handle:
            app.jobs.backend.kill(RunHandle.from_json(job.handle))
    await app.stop_async()


def where_notebook() -> dict[str, Any]:
    """Prints where it ran: hostname, GPUs and shards Slurm gave it, the Slurm job id."""
    return nbs.notebook(nbs._cell(
        "import os, socket\n"
        "print('host=' + socket.gethostname())\n"
        "for k in ('CUDA_VISIBLE_DEVICES', 'SLURM_SHARDS_ON_NODE', 'SLURM_JOB_ID',"
        " 'GPUSHARE_JOB_ATTEMPT'):\n"
        "    print(k + '=' + str(os.environ.get(k)))\n"
    ))


def printed(nb: dict[str, Any]) -> dict[str, str]:
    out = {}
    for line in outputs_text(nb).splitlines():
        key, sep, value = line.partition("=")
        if sep:
            out[key] = value
    return out


def slurm_fields(cluster: SlurmCluster, slurm_id: str) -> dict[str, str]:
    text = cluster.run("scontrol", "show", "job", "-o", slurm_id).stdout
    return dict(w.partition("=")[::2] for w in text.split() if "=" in w)


def slurm_names(cluster: SlurmCluster) -> list[str]:
    out = cluster.run("squeue", "-h", "--states=all", "-o", "%j").stdout
    return out.split()


def job_log_of(app: Any, job_id: str) -> str:
    """The end of a job's log as the backend reads it, for a failure's message."""
    return app.jobs.backend.read_log(job_id)[0][-3000:].decode(errors="replace")


def job_log(tmp_path: Path, job_id: str) -> str:
    """The end of a job's log (what Slurm's job wrote), for a failure's message."""
    path = tmp_path / "jobs" / job_id / "log.txt"
    return path.read_text(errors="replace")[-3000:] if path.exists() else f"no {path}"


async def test_jobs_run_on_their_node_with_gres_and_come_back(
    app: Any, cluster: SlurmCluster, tmp_path: Path
) -> None:
    """A whole-GPU job and a quarter-GPU job: each runs as a Slurm job on the broker's node,
    with GRES gpu:1 / shard:2, the team as account and the class as QOS, and the executed
    notebook and the log come back through the broker."""
    s1, whole = await submit(app, "tok-alice-srv", where_notebook(), path="w/whole.ipynb")
    s2, quarter = await submit(app, "tok-bob", where_notebook(), profile="shared-quarter",
                               path="q.ipynb")
    assert (s1, s2) == (201, 201), (whole, quarter)
    done = await wait_state(app, "tok-alice", whole["id"], {"succeeded", "failed"})
    assert done["state"] == "succeeded", (done.get("reason"), done.get("error"),
                                          job_log(tmp_path, whole["id"]))
    got = printed(json.loads((tmp_path / "home" / "alice" / done["output_path"]).read_text()))
    assert got["host"] == "sl-t-0"  # the node the broker placed it on, its own hostname
    assert got["CUDA_VISIBLE_DEVICES"] in ("0", "1")  # set by Slurm from GRES gpu:1
    assert got["SLURM_SHARDS_ON_NODE"] == "None" and got["GPUSHARE_JOB_ATTEMPT"] == "1"
    info = slurm_fields(cluster, got["SLURM_JOB_ID"])
    assert info["JobName"] == f"gpushare-{whole['id']}-a1" and info["NodeList"] == "sl-t-0"
    assert info["Account"] == f"vision_{done['pool']}"  # the export's name (team in the pool;
    # a QOS is kept only with accounting: no slurmdbd here)
    assert info["JobState"] == "COMPLETED" and info["Requeue"] == "0"
    assert info["TimeLimit"] == "00:06:00"  # 300 s + 3 s grace, in whole minutes
    assert info["TresPerNode"] == "gres:gpu:1"
    qdone = await wait_state(app, "tok-bob", quarter["id"], {"succeeded", "failed"})
    assert qdone["state"] == "succeeded", (qdone.get("reason"), qdone.get("error"),
                                           job_log(tmp_path, quarter["id"]))
    qgot = printed(json.loads((tmp_path / "home" / "bob" / qdone["output_path"]).read_text()))
    assert qgot["host"] == "sl-s-0" and qgot["SLURM_SHARDS_ON_NODE"] == "2"  # 1/4 x 8
    assert slurm_fields(cluster, qgot["SLURM_JOB_ID"])["TresPerNode"] == "gres:shard:2"
    status, log = await call(app, "GET", f"/jobs/{whole['id']}/log?tail=4000", "tok-alice")
    assert status == 200 and "host=sl-t-0" in log and "ended with exit code 0" in log
    status, output = await call(app, "GET", f"/jobs/{whole['id']}/output", "tok-alice")
    assert status == 200 and "host=sl-t-0" in json.dumps(output)
    assert (await call(app, "GET", f"/jobs/{whole['id']}/log", "tok-bob"))[0] == 404
    assert done["gpu_hours"] > 0 and not app.broker.state.grants
    caps = app.jobs.backend.capabilities()
    assert caps.name == "slurm" and "shards isolate neither" in caps.memory_isolation


async def test_requests_slurm_could_never_run_are_refused_before_sbatch(
    app: Any, cluster: SlurmCluster
) -> None:
    cases = [
        ("wide-4gpu", "asks for 4 whole GPUs on node 'sl-w-0', which has 2 GPUs in Slurm"),
        ("shared-3q", "asks for shard:6, more shards than one GPU of node 'sl-s-0' has (4)"),
        ("ghost-1gpu", "node 'ghost-0' is not a node of the Slurm cluster"),
    ]
    for profile, words in cases:
        status, job = await submit(app, "tok-alice", nbs.simple(), profile=profile)
        assert status == 201, job
        done = await wait_state(app, "tok-alice", job["id"], {"failed", "succeeded"})
        assert done["state"] == "failed" and words in done["reason"], done
        assert done["reason"].startswith("refused by the slurm backend: ")
        assert done["grant_id"] is None and not app.broker.state.grants
        assert not any(job["id"] in n for n in slurm_names(cluster))  # nothing submitted
    assert not app.broker.queue


async def test_cancel_preemption_requeue_and_resume_on_slurm(
    app: Any, cluster: SlurmCluster
) -> None:
    """nlp fills both GPUs of sl-t-0 (one borrowed); vision reclaims its guarantee: the
    borrowed Slurm job gets SIGTERM (its kernel sees it), ends, and the job is requeued as a
    new Slurm job that resumes from its checkpoint; the long job is cancelled with scancel."""
    s1, long_job = await submit(app, "tok-bob", nbs.sleeping(120))
    await wait_state(app, "tok-bob", long_job["id"], {"running"})
    # 30 steps of 0.4 s: still counting when the reclaim comes, also on a loaded machine
    # (with 12 it could finish first under CI's load, and the reclaim took its free GPU)
    s2, counter = await submit(app, "tok-bob", nbs.counting(steps=30, delay=0.4),
                               checkpoint=True)
    assert (s1, s2) == (201, 201) and counter["borrowed"] is True
    ckpt = Path(app.jobs.backend.checkpoint_dir(counter["id"]))
    deadline = time.monotonic() + 120
    while not (ckpt / "count.json").exists() or json.loads(
        (ckpt / "count.json").read_text()
    )["done"] < 2:
        assert time.monotonic() < deadline, app.jobs.backend.read_log(counter["id"])[0]
        await asyncio.sleep(0.2)
    status, reclaim = await submit(app, "tok-alice", nbs.simple())
    if reclaim.get("state") != "queued":
        states = {j: (await call(app, "GET", f"/jobs/{j}", "tok-bob"))[1]
                  for j in (long_job["id"], counter["id"])}
        raise AssertionError(f"reclaim {reclaim.get('state')}: {reclaim}; nlp's jobs: "
                             + "; ".join(f"{j}: {v.get('state')} {v.get('reason')}"
                                         for j, v in states.items()))
    assert status == 201
    await wait_state(app, "tok-bob", counter["id"], {"queued"}, timeout=90)
    done_alice = await wait_state(app, "tok-alice", reclaim["id"], {"succeeded", "failed"})
    assert done_alice["state"] == "succeeded", (done_alice.get("reason"), done_alice.get("error"),
                                                job_log_of(app, reclaim["id"]))
    status, _ = await call(app, "DELETE", f"/jobs/{long_job['id']}", "tok-bob")
    assert status == 200
    gone = await wait_state(app, "tok-bob", long_job["id"], {"cancelled", "failed"})
    assert gone["state"] == "cancelled", gone
    long_info = slurm_fields(cluster, cluster.run(
        "squeue", "-h", "--states=all", f"--name=gpushare-{long_job['id']}-a1", "-o", "%i"
    ).stdout.strip())
    assert long_info["JobState"] in ("CANCELLED", "COMPLETED", "FAILED"), long_info
    done = await wait_state(app, "tok-bob", counter["id"], {"succeeded", "failed"})
    assert done["state"] == "succeeded" and done["attempt"] == 2, done
    attempts = (ckpt / "attempts.txt").read_text().split("\n")
    assert attempts[0] == "1 0" and attempts[1].startswith("2 ")
    assert int(attempts[1].split()[1]) >= 2  # the second attempt found its checkpoint
    assert (ckpt / "sigterm").read_text().split() == ["1"]  # the kernel got the notice
    names = slurm_names(cluster)
    assert f"gpushare-{counter['id']}-a1" in names and f"gpushare-{counter['id']}-a2" in names
    from sqlalchemy import select

    from jupyter_gpushare.broker.store.db import grants_table

    with app.broker.engine.connect() as conn:
        rows = list(conn.execute(
            select(grants_table).where(grants_table.c.server == counter["id"])))
    assert len(rows) == 2 and all(r.released_at is not None for r in rows)
    hours = sum(r.units_milli / 1000 * (r.released_at - r.granted_at) / 3600 for r in rows)
    assert done["gpu_hours"] == pytest.approx(hours, rel=0.05, abs=1e-4)
    assert not app.broker.state.grants and not app.broker.queue


async def wait_in_log(app: Any, job_id: str, text: bytes, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while text not in app.jobs.backend.read_log(job_id)[0]:
        assert time.monotonic() < deadline, app.jobs.backend.read_log(job_id)[0][-2000:]
        await asyncio.sleep(0.2)


def node_of(app: Any, job_id: str) -> str:
    job = app.jobs.store.live[job_id]
    return str(app.broker.state.grants[job.grant_id].placement.node)


async def test_a_killed_node_ends_the_attempt_with_slurms_reason(
    app: Any, cluster: SlurmCluster
) -> None:
    """kill -9 of a node's slurmd and every process on it: Slurm says NODE_FAIL; the broker
    releases the grant and drains the node, and resumes it once Slurm has it back (IDLE); a
    job without checkpoints fails with Slurm's reason, one that checkpoints is requeued onto
    the other node and resumes there; a node an admin drained meanwhile stays drained."""
    status, job = await submit(app, "tok-bob", nbs.sleeping(120), profile="spare-1gpu")
    assert status == 201, job
    await wait_state(app, "tok-bob", job["id"], {"running"})
    await wait_in_log(app, job["id"], b"sleeping")  # its kernel runs
    node = node_of(app, job["id"])
    try:
        cluster.kill_node(node)
        done = await wait_state(app, "tok-bob", job["id"], {"failed", "succeeded", "queued"},
                                timeout=90)
        assert app.broker.state.nodes[node].cordoned  # drained
        asked = app.jobs.node_return._next
        await asyncio.sleep(1.0)  # Slurm was asked again meanwhile: the node is still down
        assert app.jobs.node_return._next > asked
        assert app.broker.state.nodes[node].cordoned
    finally:
        cluster.restart_node(node)  # until Slurm says idle
    assert done["state"] == "failed", done
    assert f"NODE_FAIL on {node}: its node failed" in done["reason"], done
    assert done["error"]["slurm_state"] == "NODE_FAIL"
    assert done["grant_id"] is None and not app.broker.state.grants  # its grant released
    assert done["gpu_hours"] > 0
    deadline = time.monotonic() + 20
    while app.broker.state.nodes[node].cordoned:  # Slurm has it back: the broker resumes it
        assert time.monotonic() < deadline, cluster.node_states()
        await asyncio.sleep(0.1)
    # a job that checkpoints: requeued as a new attempt, elsewhere, resumed
    status, counter = await submit(app, "tok-bob", nbs.counting(steps=10, delay=0.4),
                                   profile="spare-1gpu", checkpoint=True)
    assert status == 201, counter
    await wait_state(app, "tok-bob", counter["id"], {"running"})
    await wait_in_log(app, counter["id"], b"step 2")
    first = node_of(app, counter["id"])
    try:
        cluster.kill_node(first)
        done = await wait_state(app, "tok-bob", counter["id"], {"succeeded", "failed"},
                                timeout=150)
        assert app.broker.state.nodes[first].cordoned
        status, body = await call(app, "POST", f"/admin/nodes/{first}/drain", "tok-admin")
        assert status == 200, body  # the admin drains it by hand too: it is theirs now
    finally:
        cluster.restart_node(first)
    await asyncio.sleep(1.2)  # Slurm has it back (idle), and the broker leaves it drained
    assert app.broker.state.nodes[first].cordoned and app.jobs.node_return.waiting == []
    app.broker.set_cordon(first, False)
    assert done["state"] == "succeeded" and done["attempt"] == 2, done
    _, events = await call(app, "GET", f"/jobs/{counter['id']}/events", "tok-bob")
    reasons = [e["reason"] for e in events["events"]]
    assert any(f"requeued after node {first} failed" in r for r in reasons), reasons
    assert any("NODE_FAIL" in r for r in reasons), reasons
    ckpt = Path(app.jobs.backend.checkpoint_dir(counter["id"]))
    attempts = (ckpt / "attempts.txt").read_text().split("\n")
    assert attempts[0] == "1 0" and int(attempts[1].split()[1]) >= 2  # resumed
    got = slurm_fields(cluster, cluster.run(
        "squeue", "-h", "--states=all", f"--name=gpushare-{counter['id']}-a2", "-o", "%i"
    ).stdout.strip())
    assert got["NodeList"] != first and got["JobState"] == "COMPLETED", got
    assert not app.broker.state.grants


async def test_a_job_pending_on_a_dead_node_is_placed_again_elsewhere(
    app: Any, cluster: SlurmCluster
) -> None:
    """The broker does not know yet that sl-x-0 died and places a job there: Slurm keeps it
    pending (ReqNodeNotAvail); the backend cancels it and ends the attempt as lost with its
    node, the broker drains the node and the job (it checkpoints) runs on sl-x-1."""
    app.broker.set_cordon("sl-x-1", True)  # so that the broker picks the dead node
    cluster.kill_node("sl-x-0")
    try:
        cluster.wait_nodes(lambda s: s.startswith("down"), ["sl-x-0"], timeout=60)
        status, job = await submit(app, "tok-bob", nbs.counting(steps=3, delay=0.2),
                                   profile="spare-1gpu", checkpoint=True)
        assert status == 201, job
        deadline = time.monotonic() + 60
        while True:
            _, now = await call(app, "GET", f"/jobs/{job['id']}", "tok-bob")
            if now["attempt"] == 2:
                break
            assert time.monotonic() < deadline, now
            await asyncio.sleep(0.3)
        assert now["state"] == "queued", now  # sl-x-1 is still cordoned
        assert app.broker.state.nodes["sl-x-0"].cordoned
        app.broker.set_cordon("sl-x-1", False)
        done = await wait_state(app, "tok-bob", job["id"], {"succeeded", "failed"})
    finally:
        cluster.restart_node("sl-x-0")
        app.broker.set_cordon("sl-x-0", False)
        app.broker.set_cordon("sl-x-1", False)
    assert done["state"] == "succeeded" and done["attempt"] == 2, done
    _, events = await call(app, "GET", f"/jobs/{job['id']}/events", "tok-bob")
    reasons = " | ".join(e["reason"] for e in events["events"])
    assert "could not start: its node sl-x-0 is DOWN" in reasons, reasons
    first = slurm_fields(cluster, cluster.run(
        "squeue", "-h", "--states=all", f"--name=gpushare-{job['id']}-a1", "-o", "%i"
    ).stdout.strip())
    assert first["JobState"] == "CANCELLED", first  # never left to start on its own later
    second = slurm_fields(cluster, cluster.run(
        "squeue", "-h", "--states=all", f"--name=gpushare-{job['id']}-a2", "-o", "%i"
    ).stdout.strip())
    assert second["NodeList"] == "sl-x-1" and second["JobState"] == "COMPLETED", second
    assert not app.broker.state.grants


async def test_a_restarted_broker_reattaches_a_running_slurm_job(
    cluster: SlurmCluster, tmp_path: Path
) -> None:
    app = await start(cluster, tmp_path)
    try:
        status, job = await submit(app, "tok-bob", nbs.counting(steps=15, delay=0.4),
                                   checkpoint=True)
        assert status == 201, job
        running = await wait_state(app, "tok-bob", job["id"], {"running"})
        slurm_id = running and app.jobs.store.live[job["id"]].handle["ref"]["slurm_job_id"]
        deadline = time.monotonic() + 60
        while slurm_fields(cluster, slurm_id)["JobState"] != "RUNNING":
            assert time.monotonic() < deadline, slurm_fields(cluster, slurm_id)
            await asyncio.sleep(0.2)
    finally:
        await app.stop_async()  # the Slurm job goes on without the broker
    assert slurm_fields(cluster, slurm_id)["JobState"] == "RUNNING"
    app = await start(cluster, tmp_path)
    try:
        done = await wait_state(app, "tok-bob", job["id"], {"succeeded", "failed"})
        assert done["state"] == "succeeded" and done["attempt"] == 1, done
        _, events = await call(app, "GET", f"/jobs/{job['id']}/events", "tok-bob")
        assert any("reattached" in e["reason"] for e in events["events"]), events
        assert [n for n in slurm_names(cluster) if job["id"] in n] == [
            f"gpushare-{job['id']}-a1"]  # one Slurm job: nothing was submitted twice
        assert not app.broker.state.grants
    finally:
        await app.stop_async()


def test_submit_is_idempotent_per_job_and_attempt(cluster: SlurmCluster, tmp_path: Path) -> None:
    """A second submit of one attempt returns the first Slurm job, also when the broker died
    before it wrote the job id down (found by name); a new attempt is a new Slurm job."""
    from jupyter_gpushare.backends.base import RunSpec

    backend = SlurmBackend(jobs_dir=str(tmp_path / "jobs"), slurm_conf=cluster.conf_path)
    grant = {"node": "sl-t-0", "team": "vision", "priority": "research", "grace_period_s": 3,
             "cpu_milli": 1000, "memory_mib": 512,
             "gpus": [{"uuid": "GPU-sim-sl-t-0-0", "compute_pct": 100.0}]}
    spec = RunSpec(job_id="job-idem", attempt=1, user="root", notebook=nbs.sleeping(60),
                   parameters={}, output_path=str(tmp_path / "out.ipynb"), cwd=str(tmp_path),
                   env={"PATH": "/usr/bin:/bin"}, max_runtime_s=120, grant=grant)
    first = backend.submit(spec)
    try:
        sid = first.ref["slurm_job_id"]
        assert backend.submit(spec).ref["slurm_job_id"] == sid
        (Path(first.ref["dir"]) / "slurm_id").unlink()  # as if the broker died after sbatch
        again = backend.submit(spec)
        assert again.ref["slurm_job_id"] == sid
        assert slurm_names(cluster).count("gpushare-job-idem-a1") == 1
        assert backend.poll(again).alive is True
        second = backend.submit(RunSpec(**{**spec.__dict__, "attempt": 2}))
        assert second.ref["slurm_job_id"] != sid
        backend.kill(second)
    finally:
        backend.kill(first)
    deadline = time.monotonic() + 30
    while backend.poll(first).alive:
        assert time.monotonic() < deadline
        time.sleep(0.3)
    status = backend.poll(first)
    assert status.finished or "CANCELLED" in (status.error or {}).get("summary", ""), status


async def test_a_job_pending_in_slurm_keeps_its_runtime_until_slurm_runs_it(
    app: Any, cluster: SlurmCluster
) -> None:
    """Work submitted outside Jupyter holds sl-t-0 (the broker's node for job-1gpu), so Slurm
    keeps the broker's job PENDING (reason Resources) for longer than its 4-s runtime limit:
    it is not stopped, and it says it is queued in Slurm with the reason. Once Slurm runs it,
    the limit counts from then and stops it. The grant, and the ledger, run from the
    broker's admission (the pending time is charged: the broker held the GPU meanwhile)."""
    outside = slurmjobs.submit(cluster, "--nodelist=sl-t-0", "--exclusive", "-J", "outside")
    assert outside.job_id, outside.error
    try:
        slurmjobs.wait_job(cluster, outside.job_id, lambda f: f["JobState"] == "RUNNING",
                           what="ran")
        submitted_at = time.time()
        status, job = await submit(app, "tok-alice", nbs.sleeping(60), max_runtime=4)
        assert status == 201, job
        deadline = time.monotonic() + 30
        while "(reason: Resources" not in job["reason"]:
            assert time.monotonic() < deadline, job
            await asyncio.sleep(0.2)
            job = (await call(app, "GET", f"/jobs/{job['id']}", "tok-alice"))[1]
        assert job["state"] == "running", job
        assert job["reason"].startswith("queued in Slurm: job "), job
        assert "pending" in job["reason"] and "waiting for GPUs or CPUs" in job["reason"]
        assert job["started_at"] is None and job["runtime_s"] is None  # it has not run yet
        await asyncio.sleep(6)  # pending for longer than its runtime: not stopped
        held = app.jobs.store.get(job["id"])
        assert held.state.value == "running" and held.handle["engine_queued"] is True
        assert not held.handle.get("over_runtime"), held.handle
        sid = held.handle["ref"]["slurm_job_id"]
        assert slurm_fields(cluster, sid)["JobState"] == "PENDING"
    finally:
        slurmjobs.cancel(cluster, outside.job_id)
    slurmjobs.wait_job(cluster, sid, lambda f: f["JobState"] != "PENDING", what="started")
    ran_at = time.time()
    done = await wait_state(app, "tok-alice", job["id"], {"succeeded", "failed"}, timeout=60)
    assert done["state"] == "failed" and "maximum runtime of 4s" in done["reason"], done
    final = app.jobs.store.get(job["id"])
    began = float(final.handle["started_at"])  # the runtime clock: from Slurm's RUNNING
    assert began >= submitted_at + 6 and began <= ran_at + 3, (submitted_at, began, ran_at)
    assert final.ended_at is not None and final.ended_at - began >= 4
    assert final.started_at == began  # the job's runtime, as shown, is Slurm's too
    assert 4 <= done["runtime_s"] < 15, done
    _, events = await call(app, "GET", f"/jobs/{job['id']}/events", "tok-alice")
    reasons = [e.get("reason") or "" for e in events["events"]]
    assert sum("queued in Slurm" in r for r in reasons) >= 1, reasons
    assert any("the engine admitted it" in r for r in reasons), reasons
    # the ledger charges the grant from the broker's admission, pending time included
    assert done["gpu_hours"] * 3600 >= (began - submitted_at) + 4 - 1, done
    assert not app.broker.state.grants
