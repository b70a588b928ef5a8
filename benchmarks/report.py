"""Report benchmark: a month of a 500-GPU cluster, 200 users, 50,000 grants.

    .venv/bin/python benchmarks/report.py                  # generate, then time every format
    .venv/bin/python benchmarks/report.py --grants 50000 --heartbeats-per-grant 4 --repeat 3

Generates the month in a SQLite broker database (the broker's own tables, through
SQLAlchemy) and times, for each format: reading the month's rows (the report's adapter),
computing the figures and the rule, and rendering. Target: under 5 s end to end in every
format.

The baseline is a plain scan of the same rows, taken beside each report run (scan then
report, or report then scan, alternating): the statements the report's adapter sends (same
columns, the JSON columns as text, same ``WHERE``, the power rows summed per node by the
database as the adapter has them; the requests' spec text in the same statement), every row
fetched, nothing built from them (:func:`fair_scan`). So the ratio says what the report
costs on top of reading its data. Until 2026-12-03 the scan read other rows: every grant
and request of the database (not only the month's), their JSON columns decoded by
SQLAlchemy, every hourly power row instead of the per-node sums; on the 50,000-grant month
it cost the same CPU as this one (1.02x, 0.99-1.15 over 5 pairs), so the ratios printed
before still hold, but now by construction.

On a shared machine the wall time says little: the CPU time of the process
(``time.process_time``) is printed too. ``x CPU`` is a report run's CPU time over its paired
scan's, ``x scan`` the same for wall times; each is printed as the median (min-max) over the
``--repeat`` pairs.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Engine, Text, func, or_, select, type_coerce

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
from jupyter_gpushare.report.source import LIVE, load_month

YEAR, MONTH = 2026, 11
NOW = month_bounds(YEAR, MONTH)[1]  # the whole month (as the report read after it)


def cluster(gpus: int, teams: int) -> Policy:
    """``gpus`` H200s in nodes of 8: 60 % in pool train (whole), 40 % in pool shared."""
    nodes = []
    n_nodes = gpus // 8
    for i in range(n_nodes):
        pool = "train" if i < n_nodes * 6 // 10 else "shared"
        nodes.append(
            Node(
                f"n{i}",
                pool,
                tuple(GPU(f"GPU-n{i}-{k}", "H200", 141000, k) for k in range(8)),
                112000,
                2000000,
            )
        )
    train_gpus = sum(len(n.gpus) for n in nodes if n.pool == "train")
    shared_gpus = gpus - train_gpus
    return Policy(
        nodes=tuple(nodes),
        pools=(Pool("train", SharingMode.EXCLUSIVE), Pool("shared", SharingMode.SHARED)),
        priority_classes=(PriorityClass("interactive", 500, preemptible=False),),
        teams=tuple(
            Team(
                f"t{i}",
                (f"t{i}",),
                (
                    ("train", PoolQuota(train_gpus * 1000 // teams, 8000, 20000.0)),
                    ("shared", PoolQuota(shared_gpus * 1000 // teams, 4000)),
                ),
            )
            for i in range(teams)
        ),
    )


def generate(
    engine: Engine, policy: Policy, grants: int, users: int, beats: int, seed: int
) -> None:
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
            slices = [
                {"uuid": g.uuid, "memory_mib": g.memory_mib, "compute_milli": 1000} for g in gpus
            ]
            units = count * 1000
        else:
            frac = rng.choice((125, 250, 500))
            g = rng.choice(node.gpus)
            slices = [
                {"uuid": g.uuid, "memory_mib": g.memory_mib * frac // 1000, "compute_milli": frac}
            ]
            units = frac
        created = rng.uniform(start - 86400, end - 600)
        granted = created + (rng.expovariate(1 / 120) if rng.random() < 0.3 else 0.0)
        duration = rng.expovariate(1 / (4 * 3600))
        released = granted + duration if granted + duration < end + 86400 else None
        gid, rid = f"g{i}", f"r{i}"
        spec = {"gpu": {"whole": units // 1000, "fraction_milli": units % 1000}}
        g_rows.append(
            dict(
                id=gid,
                request_id=rid,
                username=f"u{user}",
                server="",
                team=team,
                pool=pool,
                profile="",
                kind="interactive",
                node=node.name,
                slices=slices,
                units_milli=units,
                borrowed=rng.random() < 0.1,
                preemptible=False,
                priority="interactive",
                priority_value=500,
                grace_period_s=30,
                spec=spec,
                granted_at=granted,
                released_at=released,
                release_reason=rng.choice(
                    ("released by holder",) * 8 + ("preempted: owner", "culled: idle")
                )
                if released
                else None,
            )
        )
        r_rows.append(
            dict(
                id=rid,
                username=f"u{user}",
                server="",
                team=team,
                pool=pool,
                kind="interactive",
                profile="",
                status="released" if released else "granted",
                reason="",
                code="guaranteed",
                spec=spec,
                grant_id=gid,
                idempotency_key=None,
                created_at=created,
                updated_at=released or granted,
            )
        )
        if released is None or released > start:
            for s in slices:
                util = rng.uniform(0, 100)
                h_rows.append(
                    dict(
                        grant_id=gid,
                        gpu_uuid=s["uuid"],
                        month=f"{YEAR:04d}-{MONTH:02d}",
                        samples=beats,
                        utilization_pct_sum=util * beats,
                        memory_used_mib_sum=s["memory_mib"] * rng.random() * beats,
                        last_ts=granted,
                    )
                )
    for j in range(grants // 10):
        user = rng.randrange(users)
        created = rng.uniform(start, end)
        status = rng.choice(("refused", "refused", "queued", "cancelled"))
        r_rows.append(
            dict(
                id=f"x{j}",
                username=f"u{user}",
                server="",
                team=teams[user % len(teams)],
                pool=rng.choice(("train", "shared")),
                kind="interactive",
                profile="",
                status=status,
                reason="",
                code=rng.choice(("quota", "user_cap", "no_capacity")),
                spec={"gpu": {"whole": 1, "fraction_milli": 0}},
                grant_id=None,
                idempotency_key=None,
                created_at=created,
                updated_at=created + 60,
            )
        )
    p_rows = [
        dict(
            node=n.name,
            hour_start=start + k * 3600.0,
            samples=beats * 30,
            watts_sum=beats * 30 * rng.uniform(1000, 5000),
            watts_max=rng.uniform(5000, 5600),
        )
        for n in policy.nodes
        for k in range(int((end - start) // 3600))
    ]
    with engine.begin() as conn:
        for table, rows in (
            (grants_table, g_rows),
            (requests_table, r_rows),
            (grant_use_table, h_rows),
            (node_power_table, p_rows),
        ):
            for k in range(0, len(rows), 5000):
                conn.execute(table.insert(), rows[k : k + 5000])


@dataclass(frozen=True)
class Spread:
    """The smallest, median and largest of a figure's values over the runs."""

    low: float
    median: float
    high: float

    def text(self, fmt: str = "{:.2f}") -> str:
        return f"{fmt.format(self.median)} ({fmt.format(self.low)}-{fmt.format(self.high)})"


def spread(values: list[float]) -> Spread:
    """Min, median and max of ``values`` (at least one)."""
    if not values:
        raise ValueError("spread: no values (--repeat must be at least 1)")
    ordered = sorted(values)
    return Spread(ordered[0], statistics.median(ordered), ordered[-1])


def paired_ratios(numerators: list[float], denominators: list[float]) -> list[float]:
    """Each run's figure over its paired baseline's: ``numerators[i] / denominators[i]``."""
    if len(numerators) != len(denominators):
        raise ValueError(
            f"paired_ratios: {len(numerators)} runs against {len(denominators)} baselines"
        )
    if any(d <= 0 for d in denominators):
        raise ValueError(f"paired_ratios: a baseline of zero or less in {denominators}")
    return [n / d for n, d in zip(numerators, denominators, strict=True)]


def fair_scan(engine: Engine, year: int, month: int, now: float) -> dict[str, int]:
    """The report adapter's statements (``report.source.load_month``), every row fetched and
    nothing built: rows per table. Same columns, JSON as text, same ``WHERE``; the power
    rows summed per node by the database as the adapter asks; each request's spec text in
    the request statement (the adapter fetches it, in batches, for those without a grant)."""
    start, end = month_bounds(year, month)
    cut = min(end, max(start, now))
    g, r = grants_table.c, requests_table.c
    u, p = grant_use_table.c, node_power_table.c
    statements = {
        "grants": select(
            g.id,
            g.request_id,
            g.username,
            g.team,
            g.pool,
            g.node,
            g.units_milli,
            g.borrowed,
            g.granted_at,
            g.released_at,
            g.release_reason,
            type_coerce(g.slices, Text),
            g.kind,
            g.end_kind,
            g.ended_by_team,
        ).where(g.granted_at < cut, or_(g.released_at.is_(None), g.released_at >= start)),
        "requests": select(
            r.id,
            r.username,
            r.team,
            r.pool,
            r.status,
            r.code,
            r.created_at,
            r.updated_at,
            r.grant_id,
            type_coerce(r.spec, Text),
        ).where(
            r.created_at < cut,
            or_(r.created_at >= start, r.updated_at >= start, r.status.in_(LIVE)),
        ),
        "use": select(
            u.grant_id,
            u.gpu_uuid,
            u.samples,
            u.utilization_pct_sum,
            u.memory_used_mib_sum,
        ).where(u.month == f"{year:04d}-{month:02d}", u.samples > 0),
        "power": select(
            p.node,
            func.count(),
            func.avg(p.watts_sum / p.samples),
            func.max(p.watts_max),
        )
        .where(p.hour_start >= start, p.hour_start < cut, p.samples > 0)
        .group_by(p.node),
    }
    with engine.connect() as conn:
        return {name: len(conn.execute(stmt).all()) for name, stmt in statements.items()}


def timed(run: Callable[[], object]) -> tuple[float, float]:
    """(wall s, CPU s of this process) of ``run()``."""
    c0 = time.process_time()
    t0 = time.perf_counter()
    run()
    return time.perf_counter() - t0, time.process_time() - c0


def report_once(engine: Engine, policy: Policy, fmt: str) -> tuple[float, ...]:
    """One report in ``fmt``: (read, figures, render, total wall s, CPU s, size in bytes)."""
    c1 = time.process_time()
    t1 = time.perf_counter()
    rows = load_month(engine, policy, YEAR, MONTH, now=NOW)
    t2 = time.perf_counter()
    _, _, doc = make_report(rows)
    t3 = time.perf_counter()
    text = render(doc, fmt)
    t4 = time.perf_counter()
    return (t2 - t1, t3 - t2, t4 - t3, t4 - t1, time.process_time() - c1, len(text))


def measure_format(
    engine: Engine, policy: Policy, fmt: str, repeat: int, first_rep: int
) -> tuple[list[tuple[float, ...]], list[tuple[float, float]]]:
    """``repeat`` pairs of (report, scan), the scan first in every other pair."""
    runs, scans = [], []
    for rep in range(repeat):
        scan_first = (first_rep + rep) % 2 == 0
        if scan_first:
            scans.append(timed(lambda: fair_scan(engine, YEAR, MONTH, NOW)))
        runs.append(report_once(engine, policy, fmt))
        if not scan_first:
            scans.append(timed(lambda: fair_scan(engine, YEAR, MONTH, NOW)))
    return runs, scans


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=500)
    ap.add_argument("--users", type=int, default=200)
    ap.add_argument("--teams", type=int, default=20)
    ap.add_argument("--grants", type=int, default=50000)
    ap.add_argument("--heartbeats-per-grant", type=int, default=4)
    ap.add_argument(
        "--repeat",
        type=int,
        default=3,
        help="report runs per format, each paired with a scan; median (min-max)",
    )
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--keep", default=None, help="write the database here and keep it")
    args = ap.parse_args()
    if args.repeat < 1:
        raise SystemExit(f"--repeat: {args.repeat}, must be at least 1")
    policy = cluster(args.gpus, args.teams)
    tmp = tempfile.TemporaryDirectory()
    db = Path(args.keep) if args.keep else Path(tmp.name) / "gpushare.sqlite"
    engine = make_engine(f"sqlite:///{db}")
    t0 = time.perf_counter()
    generate(engine, policy, args.grants, args.users, args.heartbeats_per_grant, args.seed)
    print(
        f"generated {args.gpus} GPUs, {args.users} users, {args.grants} grants, "
        f"{args.heartbeats_per_grant} heartbeats per grant (as use aggregates) in "
        f"{time.perf_counter() - t0:.1f} s ({db.stat().st_size / 2**20:.0f} MiB)"
    )
    counts = fair_scan(engine, YEAR, MONTH, NOW)
    print(
        "baseline: a plain scan of the month's rows, the report adapter's own statements ("
        + ", ".join(f"{n} {c:,} rows" for n, c in counts.items())
        + "), beside each report run; figures: median (min-max) over "
        f"{args.repeat} runs"
    )
    print(
        f"{'format':<6} {'read':>7} {'figures':>8} {'render':>7} {'total s':>17} "
        f"{'x scan':>17} {'CPU s':>17} {'x CPU':>17} {'size':>8}"
    )
    worst = worst_cpu = 0.0
    all_scans: list[tuple[float, float]] = []
    for k, fmt in enumerate(FORMATS):
        runs, scans = measure_format(engine, policy, fmt, args.repeat, k)
        all_scans += scans
        read, figs, rend, _, _, size = (statistics.median(x) for x in zip(*runs, strict=True))
        total = spread([run[3] for run in runs])
        cpu = spread([run[4] for run in runs])
        x_wall = spread(paired_ratios([run[3] for run in runs], [s[0] for s in scans]))
        x_cpu = spread(paired_ratios([run[4] for run in runs], [s[1] for s in scans]))
        worst = max(worst, total.high)
        worst_cpu = max(worst_cpu, cpu.high)
        print(
            f"{fmt:<6} {read:7.2f} {figs:8.2f} {rend:7.3f} {total.text():>17} "
            f"{x_wall.text():>17} {cpu.text():>17} {x_cpu.text():>17} {size / 1024:7.0f}K"
        )
    print(
        f"scan: {spread([s[0] for s in all_scans]).text('{:.3f}')} s wall, "
        f"{spread([s[1] for s in all_scans]).text('{:.3f}')} s CPU over "
        f"{len(all_scans)} scans"
    )
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"worst format end to end, slowest run: {worst:.2f} s wall, {worst_cpu:.2f} s CPU of "
        f"this process (load average {load:.1f} on {os.cpu_count()} cores; target < 5 s): "
        f"{'OK' if worst < 5 else 'MISSED'} wall, {'OK' if worst_cpu < 5 else 'MISSED'} CPU"
    )
    engine.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main())
