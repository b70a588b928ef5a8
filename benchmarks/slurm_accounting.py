"""Slurm's accounting and the broker's ledger: GPU-hours of the same jobs.

A real Slurm cluster (slurmctld + 3 slurmd in network namespaces, ``tests/slurmcluster.py``)
with slurmdbd on a private MariaDB (``tests/slurmdb.py``) is configured by
``jupyter-gpushare export slurm tests/data/slurm_policy.yaml``. Real jobs (whole GPUs in the
training pool, quarter GPUs as shards in the shared pool, two teams) are admitted by the broker
and run either as notebooks through its jobs API with ``SlurmBackend`` (``--through jobs``,
the default: team as --account, class as --qos, the grant's GRES and node) or as plain
``sbatch`` jobs for grants made by the broker and released when they leave the queue
(``--through sbatch``; ``tests/slurmledger.py``). Prints, in GPU-seconds and GPU-hours,
``sacct``'s elapsed x (gres/gpu + gres/shard / shards per GPU) and the broker's ledger for the
same jobs, per job and in total, and the ratio ledger / Slurm (the baseline).

    .venv/bin/python benchmarks/slurm_accounting.py [--seconds 60] [--through jobs|sbatch]

Needs root (network namespaces), slurm-wlm, slurmdbd, munge and mariadb-server.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from slurmdb import exported_cluster  # noqa: E402
from slurmledger import (  # noqa: E402
    compare,
    compare_jobs,
    job_wave,
    run_through_broker,
    wave,
)

from jupyter_gpushare.broker.service.broker import Broker  # noqa: E402
from jupyter_gpushare.broker.store.db import make_engine  # noqa: E402
from jupyter_gpushare.export.slurm import account_name  # noqa: E402
from jupyter_gpushare.policy import load_policy  # noqa: E402

POLICY = REPO / "tests" / "data" / "slurm_policy.yaml"
SHARDS = 8


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="longest job (s)")
    parser.add_argument("--waves", type=int, default=1, help="rounds of jobs, one at a time")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--through", choices=("jobs", "sbatch"), default="jobs",
                        help="jobs: notebooks through the broker's jobs API and SlurmBackend "
                             "(default); sbatch: the broker's grants and plain sbatch jobs")
    args = parser.parse_args(argv)

    policy = load_policy(POLICY)
    accounts = [account_name("vision", "train"), account_name("vision", "interactive"),
                account_name("nlp", "train"), "vision", "nlp"]
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gpushare-slurm-acct-") as tmp, \
            exported_cluster(policy, shards_per_gpu=SHARDS, gpus_per_node=2, cpus_per_node=4,
                             memory_mib=4000, users={"root": accounts}) as (
                                 cluster, _db, _export, results):
        bad = [r for r in results if r.returncode != 0 and " add " not in " ".join(r.args)]
        if bad:
            print("sacctmgr commands failed:", [r.stderr for r in bad], file=sys.stderr)
            return 1
        rows: list[tuple[str, str, str, float, float]] = []
        totals: dict = {}
        if args.through == "jobs":
            for _ in range(args.waves):
                _, _, got = asyncio.run(compare_jobs(cluster, policy, Path(tmp),
                                                     job_wave(args.seconds), SHARDS))
                rows += [(slurm_id, f"job {job}", "", s, g) for job, slurm_id, s, g in got]
        else:
            broker = Broker(policy, make_engine(f"sqlite:///{tmp}/broker.sqlite"))
            broker.load()
            ran = []
            for _ in range(args.waves):
                ran += run_through_broker(cluster, broker, wave(args.seconds), SHARDS)
            _, _, got_ran = compare(cluster, broker, ran, SHARDS)
            rows = [(r.job_id, account_name(r.job.team, r.job.pool), r.gres, s, g)
                    for r, s, g in got_ran]
            totals = broker.gpu_hours_between(0, time.time() + 1)
            broker.close()
        slurm = sum(r[3] for r in rows)
        ledger = sum(r[4] for r in rows)
    figures = {
        "through": args.through,
        "jobs": len(rows),
        "slurm_gpu_seconds": round(slurm, 3),
        "ledger_gpu_seconds": round(ledger, 3),
        "slurm_gpu_hours": round(slurm / 3600, 6),
        "ledger_gpu_hours": round(ledger / 3600, 6),
        "ledger_by_team_pool_gpu_hours": {f"{t}/{p}": round(h, 6)
                                          for (t, p), h in totals.items()},
        "ratio_ledger_over_slurm": round(ledger / slurm, 5) if slurm else None,
        "difference_pct": round(100 * abs(ledger - slurm) / slurm, 3) if slurm else None,
        "wall_s": round(time.monotonic() - started, 1),
    }
    if args.json:
        print(json.dumps(figures, indent=2))
        return 0
    print(f"through {args.through}: {len(rows)} jobs of up to {args.seconds:g} s")
    print(f"{'slurm id':>8} {'what':<28} {'gres':<8} {'slurm GPU-s':>12} {'ledger GPU-s':>13}")
    for slurm_id, what, gres, s, g in rows:
        print(f"{slurm_id:>8} {what:<28} {gres:<8} {s:12.2f} {g:13.2f}")
    print(f"total  Slurm (sacct) {slurm:.2f} GPU-s = {slurm / 3600:.5f} GPU-h; broker ledger "
          f"{ledger:.2f} GPU-s = {ledger / 3600:.5f} GPU-h")
    print(f"ratio ledger / Slurm = {figures['ratio_ledger_over_slurm']} "
          f"(difference {figures['difference_pct']} %), {len(rows)} jobs, "
          f"{figures['wall_s']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
