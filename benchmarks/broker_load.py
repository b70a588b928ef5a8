"""Broker start-up: CPU seconds of ``Broker.load`` (the state rebuild) at N live grants.

Seeds one SQLite database (``broker.seed``: fractions on the ``shared`` pool of ``--nodes``
nodes), then times ``Broker.load`` ``--reps`` times in this checkout and, with
``--baseline DIR`` (another checkout, e.g. ``git worktree add --detach DIR main``), in that
one too, alternating, on the same database::

    .venv/bin/python benchmarks/broker_load.py --grants 100000 --nodes 12000 --baseline DIR
"""

from __future__ import annotations

import argparse
import gc
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def measure(db: str, nodes: int, grants: int, reps: int) -> list[float]:
    sys.path[:0] = [str(HERE), str(HERE.parent / "tests")]
    import broker as bench  # noqa: PLC0415

    from jupyter_gpushare.broker.db import make_engine  # noqa: PLC0415
    from jupyter_gpushare.broker.service import Broker  # noqa: PLC0415

    policy = bench.bench_policy(nodes)
    out = []
    for _ in range(reps):
        broker = Broker(policy, make_engine(f"sqlite:///{db}"))
        gc.collect()
        t0 = time.process_time()
        broker.load()
        out.append(time.process_time() - t0)
        assert len(broker.state.grants) == grants, len(broker.state.grants)
    return out


def run(checkout: Path, args: argparse.Namespace, db: str) -> list[float]:
    env = dict(os.environ, PYTHONPATH=str(checkout))
    cmd = [sys.executable, str(checkout / "benchmarks" / "broker_load.py"), "--measure", db,
           "--grants", str(args.grants), "--nodes", str(args.nodes), "--reps", "1"]
    if not (checkout / "benchmarks" / "broker_load.py").exists():  # an older checkout
        cmd[1] = str(HERE / "broker_load.py")
    done = subprocess.run(cmd, env=env, cwd=checkout, check=True, capture_output=True, text=True)
    return [float(x) for x in done.stdout.split()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--grants", type=int, default=100000)
    parser.add_argument("--nodes", type=int, default=12000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--baseline", type=Path, help="another checkout, measured alike")
    parser.add_argument("--measure", help=argparse.SUPPRESS)  # internal: one checkout's run
    args = parser.parse_args()
    if args.measure:
        print(" ".join(f"{x:.3f}" for x in measure(args.measure, args.nodes, args.grants,
                                                   args.reps)))
        return
    sys.path[:0] = [str(HERE), str(HERE.parent / "tests")]
    import broker as bench  # noqa: PLC0415

    with tempfile.TemporaryDirectory() as tmp:
        db = f"{tmp}/seed.db"
        print(f"seeding {args.grants} grants on {args.nodes} nodes ...", flush=True)
        bench.seed(f"sqlite:///{db}", args.grants, args.nodes)
        now: list[float] = []
        base: list[float] = []
        for _ in range(args.reps):
            if args.baseline:
                base += run(args.baseline.resolve(), args, db)
            now += run(HERE.parent, args, db)
        print(f"Broker.load CPU s, this checkout: min {min(now):.2f} ({' '.join(map(str, now))})")
        if base:
            print(f"baseline {args.baseline}: min {min(base):.2f} ({' '.join(map(str, base))}); "
                  f"ratio {min(now) / min(base):.2f}")


if __name__ == "__main__":
    main()
