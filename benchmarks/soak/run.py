"""One soak run: start the stack, drive it and break it for ``--minutes``, wind down, read
the history back from the hub, the database and the job folders, audit, print the summary."""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from .audit import audit
from .drivers import Faults, SlurmNodeWatch, Snapshotter, User, http
from .faults import Injector, schedule, summary_of
from .history import History
from .prober import Prober
from .reclaim import Reclaimer
from .report import ledger_hours, report_hours
from .stack import Stack, policy_facts, start
from .summary import render
from .world import OWNERS, POLICY, PROBE, SLURM_NODES, users

RECONCILE_S = 5.0
SNAPSHOT_S = 2.0


def settings() -> dict[str, Any]:
    return {
        "reconcile_interval_s": RECONCILE_S,
        # one reconcile interval, the broker's minimum grant age for it, one snapshot and a
        # little for a 2-core machine
        "slack_s": 2 * RECONCILE_S + SNAPSHOT_S + 3.0,
        # the stated time for a request inside its team's guarantee: the longest grace of a
        # preemptible class (3 s), then the hub's wait for the victim's server to stop (up to
        # 10 s: the broker grants the GPU once the victim's process is gone), and 2 s
        "admit_within_s": 15.0,
        "clock_tolerance_s": 0.5,
        "gpu_hours_tolerance": 1e-4,
    }


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1, 10**6)
    print(f"soak: seed {seed}", flush=True)
    tmp = Path(args.tmp or tempfile.mkdtemp(prefix=f"gpushare-soak-{seed}-"))
    h = History(seed=seed, settings=settings())
    with contextlib.ExitStack() as parts:
        pg = start_postgres() if args.db == "postgresql" else None
        if pg is not None:
            parts.callback(pg.stop)
        slurm = start_slurm() if args.slurm else None
        if slurm is not None:
            parts.callback(slurm.cleanup)
        stack = start(
            tmp, POLICY, h.settings, broker_outside=args.broker == "outside", pg=pg, slurm=slurm,
            proxy_outside=args.proxy == "outside",
        )
        h.settings.update(broker=args.broker, db=args.db, slurm=bool(args.slurm),
                          proxy=args.proxy)
        code = 2
        try:
            code = drive_and_audit(args, seed, stack, h)
            return code
        finally:
            shutdown(stack, h)
            if code == 0 and not args.tmp:
                shutil.rmtree(tmp, ignore_errors=True)
            else:  # the hub's and the broker's logs, the databases and the job folders
                say(f"stack folder kept: {tmp}")
    return code


def start_postgres() -> Any:
    """A PostgreSQL server of its own (the tests' ``PgServer``: initdb in a new folder, a
    free port), or an error saying what is missing."""
    from pgserver import PgServer, pg_missing_reason

    reason = pg_missing_reason()
    if reason:
        raise SystemExit(f"--db postgresql: {reason}")
    return PgServer()


def start_slurm() -> Any:
    """A real Slurm cluster (the tests' ``SlurmCluster``) whose nodes are the policy's nodes
    that run jobs (``lab-0``, ``train-0``: 2 GPUs each, as GRES gpu and shard), or an error
    saying what is missing."""
    from slurmcluster import SlurmCluster, have_slurm

    if not have_slurm():
        raise SystemExit("--slurm: slurmctld is not on PATH (apt-get install slurm-wlm munge)")
    cluster = SlurmCluster(nodes=list(SLURM_NODES), gpus_per_node=2, shards_per_gpu=8)
    try:
        return cluster.start()
    except BaseException:
        cluster.cleanup()
        raise


def drive_and_audit(args: argparse.Namespace, seed: int, stack: Stack, h: History) -> int:
    h.policy = policy_facts(stack.policy_file)
    people = users(args.users_per_team)
    for name, team in {**people, PROBE[0]: PROBE[1], "boss": "vision"}.items():
        stack.hub.create_user(name, groups=[team])
    plan = schedule(seed, args.minutes, args.fault_interval, args.faults, args.db, args.slurm)
    say(f"soak: {len(plan)} faults planned: {json.dumps(summary_of(plan))}")
    stop, faults = threading.Event(), Faults()
    seats = threading.Semaphore(args.max_servers)
    drivers: list[threading.Thread] = [
        User(
            name,
            team,
            stack,
            h,
            faults,
            seats,
            random.Random(f"{seed}-{name}"),
            stop,
            (args.hold_min, args.hold_max),
        )
        for name, team in people.items()
    ]
    prober = Prober(stack, h, faults, PROBE[0], stop, args.probe_interval)
    drivers += [prober, Snapshotter(stack, h, stop, SNAPSHOT_S)]
    if stack.slurm is not None:
        drivers.append(SlurmNodeWatch(stack, h, stop, SNAPSHOT_S))
    borrowers = [u for u, team in people.items() if team not in OWNERS][:2]
    owner = next(u for u, team in people.items() if team == OWNERS[0])
    drivers.append(Reclaimer(stack, h, faults, borrowers, owner, stop, args.reclaim_interval))
    injector = Injector(stack, h, faults, plan, random.Random(seed), stop)
    h.started = time.time()
    for d in [*drivers, injector]:
        d.start()
    stop.wait(args.minutes * 60)
    say("soak: load over, winding down")
    stop.set()
    injector.join(180)
    for d in drivers:
        d.join(180)
    wind_down(stack, h)
    h.ended = time.time()
    h.rows = stack.read_rows()
    h.backend["attempts"] = stack.attempts()
    h.figures.update(figures(stack, h))
    out = audit(h)
    print(render(h, out), flush=True)
    if out.violations or args.keep_history:
        path = h.save(args.history or Path.cwd() / f"soak-history-{seed}.json")
        print(
            f"history kept: {path} (re-audit: benchmarks/soak.py --replay {path})", file=sys.stderr
        )
    if injector.errors:
        say("faults that could not be carried out: " + "; ".join(injector.errors))
    return 1 if out.violations else 0


def wind_down(stack: Stack, h: History) -> None:
    """Every server stopped, every job ended (cancelled if still going), no grant live."""
    hub, boss = stack.hub, stack.hub.token_for("boss", note="soak wind-down")
    deadline = time.time() + 120
    while time.time() < deadline:
        status, listed = hub.api("GET", "/users")
        names = [u["name"] for u in listed or [] if u.get("servers")] if status == 200 else []
        for name in names:
            hub.api("DELETE", f"/users/{name}/server")
        status, jobs = http(stack.broker_url + "/jobs?all=1", boss)
        going = (
            [
                j
                for j in (jobs or {}).get("jobs", [])
                if j["state"] not in ("succeeded", "failed", "cancelled", "lost")
            ]
            if status == 200
            else []
        )
        for job in going:
            http(f"{stack.broker_url}/jobs/{job['id']}", boss, "DELETE")
        live = [g for g in stack.read_rows()["grants"] if g["released_at"] is None]
        if not names and not going and not live:
            return
        time.sleep(2)
    h.record(
        "wind_down_incomplete",
        servers=names,
        jobs=[j["id"] for j in going],
        grants=[g["id"] for g in live],
    )


def figures(stack: Stack, h: History) -> dict[str, Any]:
    """The broker's ledger (its team usage answers) and the report's figures for the month
    so far, each with the period it covers; the audit compares them with its own integral."""
    now = time.time()
    month = dt.datetime.fromtimestamp(now, dt.timezone.utc)
    start = month.replace(day=1, hour=0, minute=0, second=0, microsecond=0).timestamp()
    boss = stack.hub.token_for("boss", note="soak figures")
    ledger = ledger_hours(stack, boss)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "jupyter_gpushare.cli",
            "report",
            "--month",
            month.strftime("%Y-%m"),
            "--db",
            stack.db_url,
            "--policy",
            str(stack.policy_file),
            "--format",
            "json",
            "--no-replay-check",
            "--now",
            dt.datetime.fromtimestamp(now, dt.timezone.utc).isoformat(),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    out: dict[str, Any] = {"ledger": {"start": start, "now": now, "hours": ledger}}
    if proc.returncode == 0:
        out["report"] = {"start": start, "now": now, "hours": report_hours(json.loads(proc.stdout))}
    else:
        h.record("report_failed", stderr=proc.stderr[-2000:])
    return out


def shutdown(stack: Stack, h: History) -> None:
    """The hub, the broker outside it if any, and any server of this run still alive (by the
    pids the hub reported)."""
    stack.stop()
    pids = {
        int(s["pid"])
        for e in h.of_kind("hub_snapshot")
        for s in e["servers"].values()
        if s.get("pid")
    }
    port = f":{stack.hub.api_port}/"
    for pid in pids:
        with contextlib.suppress(psutil.Error, ProcessLookupError):
            if port in psutil.Process(pid).environ().get("JUPYTERHUB_API_URL", ""):
                os.kill(pid, signal.SIGKILL)
