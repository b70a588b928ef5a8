"""GPU-seconds of the same jobs from Slurm's accounting and from the broker's ledger.

:func:`run_through_broker` plays what a batch backend does for each job, with real parts on
both sides: the broker (:class:`~jupyter_gpushare.broker.service.broker.Broker` on its SQL database)
admits and places a request and writes the grant; the job is submitted with ``sbatch`` to the
export's account, partition and QOS with the grant's GRES (``gpu:N`` for whole GPUs,
``shard:K`` with K = ceil(units x shards per GPU) for a fraction) on the grant's node; the jobs
are polled with ``squeue`` and each grant is released as soon as its job has left the queue.

:func:`slurm_gpu_seconds` reads ``sacct -X --format=JobID,ElapsedRaw,AllocTRES``: elapsed
seconds x (``gres/gpu`` + ``gres/shard`` / shards per GPU). :func:`ledger_gpu_seconds` reads
the ledger (the grants table: units x (released_at - granted_at)) and
:meth:`Broker.gpu_hours_between` gives the same total by team and pool.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select

from jupyter_gpushare.broker.store.db import grants_table
from jupyter_gpushare.core.model import UNIT, GPUAsk, Kind, Request
from jupyter_gpushare.export.slurm import account_name, partition_name, qos_name


@dataclass(frozen=True)
class LedgerJob:
    """One job to run: who, where, how much GPU, at which class, for how long."""

    team: str
    pool: str
    gpu: GPUAsk
    priority: str
    seconds: float


@dataclass
class Ran:
    """A job that ran: its Slurm job id and the broker's grant id."""

    job: LedgerJob
    job_id: str
    grant_id: str
    gres: str


def wave(seconds: float) -> list[LedgerJob]:
    """Jobs of ``tests/data/slurm_policy.yaml`` that fit at once: node1's two whole GPUs
    (vision and nlp), and two quarter GPUs of vision as shards on the shared pool."""
    return [
        LedgerJob("vision", "train", GPUAsk(whole=1), "research", seconds),
        LedgerJob("nlp", "train", GPUAsk(whole=1), "research", round(seconds * 0.8)),
        LedgerJob("vision", "interactive", GPUAsk(fraction_milli=250), "interactive", seconds),
        LedgerJob("vision", "interactive", GPUAsk(fraction_milli=250), "interactive",
                  round(seconds * 0.6)),
    ]


def gres_of(grant: dict[str, Any], shards_per_gpu: int) -> str:
    """The grant's GRES, as a batch backend asks for it."""
    gpus = grant.get("gpus") or []
    if all(float(g.get("compute_pct") or 0) >= 100.0 for g in gpus):
        return f"gpu:{len(gpus)}"
    return f"shard:{max(1, math.ceil(float(grant['units']) * shards_per_gpu - 1e-9))}"


def _in_queue(cluster: Any, job_ids: list[str]) -> set[str]:
    """The jobs still pending or running (a completing job's GPUs are already free)."""
    out = cluster.run("squeue", "-h", "-o", "%i %t", "-j", ",".join(job_ids), check=False)
    words = [line.split() for line in out.stdout.splitlines() if line.strip()]
    return {w[0] for w in words if len(w) > 1 and w[1] not in ("CG", "CD", "F", "CA", "TO")}


def run_through_broker(cluster: Any, broker: Any, jobs: list[LedgerJob], shards_per_gpu: int,
                       *, poll_s: float = 0.1, timeout: float = 300.0) -> list[Ran]:
    """Admit, submit, watch and release each job (module docstring); all run at once."""
    ran: list[Ran] = []
    for i, item in enumerate(jobs):
        answer = broker.submit(Request(
            id=f"ledger-{i}-{time.monotonic_ns()}", user="root", team=item.team,
            pool=item.pool, gpu=item.gpu, priority=item.priority, kind=Kind.BATCH,
            max_runtime_s=int(item.seconds) + 60))
        if answer["status"] != "granted":
            raise AssertionError(f"the broker did not grant {item}: {answer['reason']}")
        grant = answer["grant"]
        gres = gres_of(grant, shards_per_gpu)
        done = cluster.run(
            "sbatch", "--parsable", "--time=10", "-o", "/dev/null",
            f"--account={account_name(item.team, item.pool)}",
            f"--partition={partition_name(item.pool)}", f"--qos={qos_name(item.priority)}",
            f"--gres={gres}", f"--nodelist={grant['node']}", "--wrap", f"sleep {item.seconds}",
            check=False)
        if done.returncode != 0:
            broker.release(grant["id"], "sbatch failed")
            raise AssertionError(f"sbatch refused {item}: {done.stderr}")
        ran.append(Ran(item, done.stdout.strip().split(";")[0], grant["id"], gres))
    live = {r.job_id: r for r in ran}
    deadline = time.monotonic() + timeout
    while live:
        if time.monotonic() > deadline:
            raise AssertionError(f"jobs still in the queue after {timeout:g}s: {list(live)}")
        queued = _in_queue(cluster, list(live))
        for job_id in [j for j in live if j not in queued]:
            broker.release(live.pop(job_id).grant_id, "job ended")
        time.sleep(poll_s)
    return ran


def slurm_gpu_seconds(cluster: Any, job_ids: list[str], shards_per_gpu: int,
                      timeout: float = 60.0) -> dict[str, float]:
    """GPU-seconds per job from ``sacct`` (waits until slurmdbd has every job's end)."""
    deadline = time.monotonic() + timeout
    while True:
        out = cluster.run("sacct", "-X", "-n", "-P", "-j", ",".join(job_ids),
                          "--format=JobID,ElapsedRaw,AllocTRES,State", check=False).stdout
        found: dict[str, float] = {}
        for line in out.splitlines():
            job_id, elapsed, tres, state = line.split("|")[:4]
            if state != "COMPLETED":
                continue
            alloc = dict(item.split("=", 1) for item in tres.split(",") if "=" in item)
            units = int(alloc.get("gres/gpu", 0)) + int(alloc.get("gres/shard", 0)) / \
                shards_per_gpu
            found[job_id] = int(elapsed) * units
        if set(found) >= set(job_ids) or time.monotonic() > deadline:
            missing = set(job_ids) - set(found)
            if missing:
                raise AssertionError(f"sacct has no completed record of {missing}:\n{out}")
            return found
        time.sleep(0.3)


def ledger_gpu_seconds(broker: Any, grant_ids: list[str]) -> dict[str, float]:
    """GPU-seconds per grant from the broker's ledger (the grants table)."""
    with broker.engine.connect() as conn:
        rows = conn.execute(select(grants_table.c.id, grants_table.c.units_milli,
                                   grants_table.c.granted_at, grants_table.c.released_at)
                            .where(grants_table.c.id.in_(grant_ids))).all()
    return {r.id: r.units_milli / UNIT * (r.released_at - r.granted_at) for r in rows}


def compare(cluster: Any, broker: Any, ran: list[Ran], shards_per_gpu: int
            ) -> tuple[float, float, list[tuple[Ran, float, float]]]:
    """(Slurm's total, the ledger's total, per job rows) in GPU-seconds."""
    slurm = slurm_gpu_seconds(cluster, [r.job_id for r in ran], shards_per_gpu)
    ledger = ledger_gpu_seconds(broker, [r.grant_id for r in ran])
    rows = [(r, slurm[r.job_id], ledger[r.grant_id]) for r in ran]
    return sum(slurm.values()), sum(ledger.values()), rows


# -- the same through the broker's jobs and SlurmBackend ----------------------------------------


@dataclass(frozen=True)
class BrokerJob:
    """A notebook job sent to the broker's jobs API: who (token), which profile, how long."""

    token: str
    profile: str
    seconds: float


def jobs_config(cluster: Any, tmp: Any) -> Any:
    """Broker config: batch jobs through ``SlurmBackend`` on ``cluster``, team as
    ``--account`` and class as ``--qos`` (the export's accounts and QOS)."""
    from traitlets.config import Config

    from jupyter_gpushare.backends.slurm import SlurmBackend

    config = Config()
    config.JobManager.backend_class = SlurmBackend
    config.JobManager.jobs_dir = str(tmp / "jobs")
    config.JobManager.user_root_template = str(tmp / "home" / "{username}")
    config.SlurmBackend.slurm_conf = cluster.conf_path
    config.SlurmBackend.pass_account = True
    config.SlurmBackend.pass_qos = True
    config.SlurmBackend.min_poll_interval_s = 0.2
    return config


async def run_jobs(app: Any, jobs: list[BrokerJob], timeout: float = 400.0
                   ) -> list[dict[str, Any]]:
    """Submit every job at once (a notebook that sleeps), wait until all have ended; the
    broker's job views, with their ledger GPU-hours (``gpu_hours``)."""
    import asyncio

    import jobnotebooks as nbs
    from brokerkit import call

    ids = []
    for item in jobs:
        status, body = await call(app, "POST", "/jobs", item.token, {
            "notebook": nbs.sleeping(item.seconds), "profile": item.profile,
            "max_runtime": int(item.seconds) + 120, "path": f"ledger-{len(ids)}.ipynb"})
        if status != 201:
            raise AssertionError(f"the broker refused {item}: {body}")
        ids.append((item.token, body["id"]))
    deadline = time.monotonic() + timeout
    done: dict[str, dict[str, Any]] = {}
    while len(done) < len(ids):
        if time.monotonic() > deadline:
            raise AssertionError(f"jobs not done after {timeout:g}s: {done}")
        for token, job_id in ids:
            if job_id in done:
                continue
            status, body = await call(app, "GET", f"/jobs/{job_id}", token)
            if body["state"] in ("succeeded", "failed", "cancelled"):
                if body["state"] != "succeeded":
                    raise AssertionError(f"job {job_id} {body['state']}: {body}")
                done[job_id] = body
        await asyncio.sleep(0.5)
    return [done[job_id] for _, job_id in ids]


def slurm_gpu_seconds_by_name(cluster: Any, names: list[str], shards_per_gpu: int,
                              timeout: float = 60.0) -> dict[str, tuple[str, float]]:
    """{job name: (Slurm job id, GPU-seconds)} from ``sacct`` for jobs named ``names``."""
    deadline = time.monotonic() + timeout
    while True:
        out = cluster.run("sacct", "-X", "-n", "-P", "-a", f"--name={','.join(names)}",
                          "--format=JobName,JobID,ElapsedRaw,AllocTRES,State",
                          check=False).stdout
        found: dict[str, tuple[str, float]] = {}
        for line in out.splitlines():
            name, job_id, elapsed, tres, state = line.split("|")[:5]
            if state != "COMPLETED":
                continue
            alloc = dict(item.split("=", 1) for item in tres.split(",") if "=" in item)
            units = int(alloc.get("gres/gpu", 0)) + int(alloc.get("gres/shard", 0)) / \
                shards_per_gpu
            found[name] = (job_id, int(elapsed) * units)
        if set(found) >= set(names) or time.monotonic() > deadline:
            missing = set(names) - set(found)
            if missing:
                raise AssertionError(f"sacct has no completed record of {missing}:\n{out}")
            return found
        time.sleep(0.3)


def job_wave(seconds: float) -> list[BrokerJob]:
    """alice (vision) and bob (nlp) each a whole GPU, alice two quarter GPUs (shards)."""
    return [
        BrokerJob("tok-alice", "job-1gpu", seconds),
        BrokerJob("tok-bob", "job-1gpu", round(seconds * 0.8)),
        BrokerJob("tok-alice", "job-quarter", seconds),
        BrokerJob("tok-alice", "job-quarter", round(seconds * 0.6)),
    ]


async def compare_jobs(cluster: Any, policy: Any, tmp: Any, jobs: list[BrokerJob],
                       shards_per_gpu: int) -> tuple[float, float, list[tuple[str, str, float,
                                                                             float]]]:
    """Run ``jobs`` through a real in-process broker with ``SlurmBackend`` on ``cluster``;
    (Slurm's GPU-seconds, the ledger's, rows of (job, Slurm job id, Slurm, ledger))."""
    from brokerkit import start_broker, static_tokens

    for user in ("alice", "bob"):
        (tmp / "home" / user).mkdir(parents=True, exist_ok=True)
    app = await start_broker(policy, f"sqlite:///{tmp}/jobs.sqlite",
                             static_tokens({"alice": ["vision"], "bob": ["nlp"]}),
                             config=jobs_config(cluster, tmp))
    try:
        views = await run_jobs(app, jobs)
    finally:
        await app.stop_async()
    names = {f"gpushare-{v['id']}-a1": v for v in views}
    slurm = slurm_gpu_seconds_by_name(cluster, list(names), shards_per_gpu)
    rows = [(v["id"], slurm[name][0], slurm[name][1], float(v["gpu_hours"]) * 3600)
            for name, v in names.items()]
    return sum(r[2] for r in rows), sum(r[3] for r in rows), rows
