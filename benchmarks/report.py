"""Report benchmark: a month of a 500-GPU cluster, 200 users, 50,000 grants.

    .venv/bin/python benchmarks/report.py                  # generate, then time every format
    .venv/bin/python benchmarks/report.py --grants 50000 --heartbeats-per-grant 4 --repeat 3

Generates the month in a SQLite broker database (the broker's own tables, through
SQLAlchemy) and times, for each format: reading the month's rows (the report's adapter),
computing the figures and the rule, and rendering. The baseline, measured in the same run,
is a plain scan of the same rows (``SELECT`` of the month's grants, requests, measured use per
grant and power per node-hour with SQLAlchemy, nothing done with them): the ratio says what
the report costs on top of reading its data. Target: under 5 s end to end in every format.
On a loaded machine the wall time says little: the CPU time of the process
(``time.process_time``) is printed too, and ``x CPU`` is the report's CPU time over the
scan's (``x scan`` divides wall times, each taken at its own moment of the machine's load).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from sqlalchemy import Engine, select

from jupyter_gpushare.broker.store.db import (
    grant_use_table,
    grants_table,
    make_engine,
    migrate,
    node_power_table,
    requests_table,
)
from jupyter_gpushare.core.ledger import month_bounds
from jupyter_gpushare.core.model import (
    GPU,
    Node,
    Policy,
    Pool,
    PoolQuota,
    PriorityClass,
    SharingMode,
    Team,
)
from jupyter_gpushare.report import make_report
from jupyter_gpushare.report.render import FORMATS, render
from jupyter_gpushare.report.source import load_month

YEAR, MONTH = 2026, 11


def cluster(gpus: int, teams: int) -> Policy:
    """``gpus`` H200s in nodes of 8: 60 % in pool train (whole), 40 % in pool shared."""
    nodes = []
    n_nodes = gpus // 8
    for i in range(n_nodes):
        pool = "train" if i < n_nodes * 6 // 10 else "shared"
        nodes.append(Node(f"n{i}", pool, tuple(
            GPU(f"GPU-n{i}-{k}", "H200", 141000, k) for k in range(8)), 112000, 2000000))
    train_gpus = sum(len(n.gpus) for n in nodes if n.pool == "train")
    shared_gpus = gpus - train_gpus
    return Policy(
        nodes=tuple(nodes),
        pools=(Pool("train", SharingMode.EXCLUSIVE), Pool("shared", SharingMode.SHARED)),
        priority_classes=(PriorityClass("interactive", 500, preemptible=False),),
        teams=tuple(
            Team(f"t{i}", (f"t{i}",), (
                ("train", PoolQuota(train_gpus * 1000 // teams, 8000, 20000.0)),
                ("shared", PoolQuota(shared_gpus * 1000 // teams, 4000)),
            ))
            for i in range(teams)
        ),
    )


def generate(engine: Engine, policy: Policy, grants: int, users: int, beats: int,
             seed: int) -> None:
    """Grants spread over the month, 10 % more requests refused or queued, heartbeats."""
    rng = random.Random(seed)
    start, end = month_bounds(YEAR, MONTH)
    migrate(engine)
    teams = [t.name for t in policy.teams]
    nodes = {p.name: [n for n in policy.nodes if n.pool == p.name] for p in policy.pools}
    g_rows, r_rows, h_rows = [], [], []
    for i in range(grants):
        pool = "train" if rng.random() < 0.5 else "shared"
        node = rng.choice(nodes[pool])
        user = rng.randrange(users)
        team = teams[user % len(teams)]
        if pool == "train":
            count = rng.choice((1, 1, 2, 4, 8))
            gpus = rng.sample(node.gpus, count)
            slices = [{"uuid": g.uuid, "memory_mib": g.memory_mib, "compute_milli": 1000}
                      for g in gpus]
            units = count * 1000
        else:
            frac = rng.choice((125, 250, 500))
            g = rng.choice(node.gpus)
            slices = [{"uuid": g.uuid, "memory_mib": g.memory_mib * frac // 1000,
                       "compute_milli": frac}]
            units = frac
        created = rng.uniform(start - 86400, end - 600)
        granted = created + (rng.expovariate(1 / 120) if rng.random() < 0.3 else 0.0)
        duration = rng.expovariate(1 / (4 * 3600))
        released = granted + duration if granted + duration < end + 86400 else None
        gid, rid = f"g{i}", f"r{i}"
        spec = {"gpu": {"whole": units // 1000, "fraction_milli": units % 1000}}
        g_rows.append(dict(
            id=gid, request_id=rid, username=f"u{user}", server="", team=team, pool=pool,
            profile="", kind="interactive", node=node.name, slices=slices, units_milli=units,
            borrowed=rng.random() < 0.1, preemptible=False, priority="interactive",
            priority_value=500, grace_period_s=30, spec=spec, granted_at=granted,
            released_at=released,
            release_reason=rng.choice(("released by holder",) * 8 + (
                "preempted: owner", "culled: idle")) if released else None,
        ))
        r_rows.append(dict(
            id=rid, username=f"u{user}", server="", team=team, pool=pool,
            kind="interactive", profile="", status="released" if released else "granted",
            reason="", code="guaranteed", spec=spec, grant_id=gid, idempotency_key=None,
            created_at=created, updated_at=released or granted,
        ))
        if released is None or released > start:
            for s in slices:
                util = rng.uniform(0, 100)
                h_rows.append(dict(
                    grant_id=gid, gpu_uuid=s["uuid"], month=f"{YEAR:04d}-{MONTH:02d}",
                    samples=beats, utilization_pct_sum=util * beats,
                    memory_used_mib_sum=s["memory_mib"] * rng.random() * beats,
                    last_ts=granted))
    for j in range(grants // 10):
        user = rng.randrange(users)
        created = rng.uniform(start, end)
        status = rng.choice(("refused", "refused", "queued", "cancelled"))
        r_rows.append(dict(
            id=f"x{j}", username=f"u{user}", server="", team=teams[user % len(teams)],
            pool=rng.choice(("train", "shared")), kind="interactive", profile="",
            status=status, reason="", code=rng.choice(("quota", "user_cap", "no_capacity")),
            spec={"gpu": {"whole": 1, "fraction_milli": 0}}, grant_id=None,
            idempotency_key=None, created_at=created, updated_at=created + 60,
        ))
    p_rows = [
        dict(node=n.name, hour_start=start + k * 3600.0, samples=beats * 30,
             watts_sum=beats * 30 * rng.uniform(1000, 5000), watts_max=rng.uniform(5000, 5600))
        for n in policy.nodes for k in range(int((end - start) // 3600))
    ]
    with engine.begin() as conn:
        for table, rows in ((grants_table, g_rows), (requests_table, r_rows),
                            (grant_use_table, h_rows), (node_power_table, p_rows)):
            for k in range(0, len(rows), 5000):
                conn.execute(table.insert(), rows[k:k + 5000])


def baseline_scan(engine: Engine) -> tuple[float, float]:
    """(wall s, CPU s of this process) of a plain scan of the month's rows."""
    start, end = month_bounds(YEAR, MONTH)
    c0 = time.process_time()
    t0 = time.perf_counter()
    with engine.connect() as conn:
        for table in (grants_table, requests_table):
            for _ in conn.execute(select(table)):
                pass
        for _ in conn.execute(select(grant_use_table)):
            pass
        for _ in conn.execute(select(node_power_table).where(
                node_power_table.c.hour_start >= start, node_power_table.c.hour_start < end)):
            pass
    return time.perf_counter() - t0, time.process_time() - c0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=500)
    ap.add_argument("--users", type=int, default=200)
    ap.add_argument("--teams", type=int, default=20)
    ap.add_argument("--grants", type=int, default=50000)
    ap.add_argument("--heartbeats-per-grant", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--keep", default=None, help="write the database here and keep it")
    args = ap.parse_args()
    policy = cluster(args.gpus, args.teams)
    tmp = tempfile.TemporaryDirectory()
    db = Path(args.keep) if args.keep else Path(tmp.name) / "gpushare.sqlite"
    engine = make_engine(f"sqlite:///{db}")
    t0 = time.perf_counter()
    generate(engine, policy, args.grants, args.users, args.heartbeats_per_grant, args.seed)
    print(f"generated {args.gpus} GPUs, {args.users} users, {args.grants} grants, "
          f"{args.heartbeats_per_grant} heartbeats per grant (as use aggregates) in "
          f"{time.perf_counter() - t0:.1f} s ({db.stat().st_size / 2**20:.0f} MiB)")
    scans = [baseline_scan(engine) for _ in range(args.repeat)]
    base = statistics.median(wall for wall, _ in scans)
    base_cpu = statistics.median(cpu for _, cpu in scans)
    print(f"baseline: plain scan of the month's rows {base:.2f} s wall, {base_cpu:.2f} s CPU")
    print(f"{'format':<6} {'read':>7} {'figures':>8} {'render':>7} {'total':>7} "
          f"{'x scan':>7} {'CPU s':>7} {'x CPU':>7} {'size':>8}")
    worst = worst_cpu = 0.0
    for fmt in FORMATS:
        runs = []
        for _ in range(args.repeat):
            c1 = time.process_time()
            t1 = time.perf_counter()
            rows = load_month(engine, policy, YEAR, MONTH)
            t2 = time.perf_counter()
            _, _, doc = make_report(rows)
            t3 = time.perf_counter()
            text = render(doc, fmt)
            t4 = time.perf_counter()
            cpu = time.process_time() - c1
            runs.append((t2 - t1, t3 - t2, t4 - t3, t4 - t1, cpu, len(text)))
        read, figs, rend, total, cpu, size = (
            statistics.median(x) for x in zip(*runs, strict=True))
        worst = max(worst, total)
        worst_cpu = max(worst_cpu, cpu)
        print(f"{fmt:<6} {read:7.2f} {figs:8.2f} {rend:7.3f} {total:7.2f} "
              f"{total / base:7.2f} {cpu:7.2f} {cpu / base_cpu:7.2f} {size / 1024:7.0f}K")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"worst format end to end: {worst:.2f} s wall, {worst_cpu:.2f} s CPU of this "
          f"process (load average {load:.1f} on {os.cpu_count()} cores; target < 5 s): "
          f"{'OK' if worst < 5 else 'MISSED'} wall, {'OK' if worst_cpu < 5 else 'MISSED'} CPU")
    engine.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main())
