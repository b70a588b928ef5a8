"""A month in minutes, with faults: the real stack driven by five teams' users while a
seeded schedule kills and breaks its parts, then an audit of every invariant and every
GPU-hour that does not use the broker's own bookkeeping (issue 28).

    .venv/bin/python benchmarks/soak.py --minutes 30 --seed 7
    .venv/bin/python benchmarks/soak.py --replay soak-history-7.json   # re-audit a history

The seed is printed first. The run ends with a summary (faults by kind, invariants checked,
violations with the history around each, recovery per fault kind, admission p99 during
faults) and the line ``violations: N``; the exit status is 1 when N > 0, and the history
is then kept as a file for ``--replay``. The broker's clock cannot be compressed (it reads
the wall clock; only an in-process broker takes another clock), so the run is real time and
the summary scales its GPU-hours to a 30-day month.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests")]

from soak.audit import audit  # noqa: E402
from soak.history import load  # noqa: E402
from soak.summary import render  # noqa: E402


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=30.0, help="real minutes of load")
    p.add_argument("--seed", type=int, default=None, help="the fault and load seed")
    p.add_argument("--users-per-team", type=int, default=2)
    p.add_argument("--max-servers", type=int, default=6, help="servers running at once")
    p.add_argument(
        "--fault-interval", type=float, default=25.0, help="mean seconds between two faults"
    )
    p.add_argument(
        "--reclaim-interval",
        type=float,
        default=30.0,
        help="seconds between two rounds of borrowing and reclaiming training GPUs",
    )
    p.add_argument(
        "--probe-interval", type=float, default=1.0,
        help="seconds between two admissions of the prober (a p99 over the few probes of the "
        "fault windows at 1 s is their largest: 0.2 gives five times as many)",
    )
    p.add_argument("--hold-min", type=float, default=15.0, help="shortest server session (s)")
    p.add_argument("--hold-max", type=float, default=45.0, help="longest server session (s)")
    p.add_argument(
        "--faults", default=None, type=lambda v: [k for k in v.split(",") if k],
        help="inject only these kinds, comma-separated (default: all); e.g. hub_kill9,hub_term",
    )
    p.add_argument(
        "--broker", choices=("managed", "outside"), default="managed",
        help="managed: the hub starts the broker (and a hub fault takes it along); outside: "
        "the broker runs on its own (setup_gpushare(broker_managed=False)) through hub faults",
    )
    p.add_argument(
        "--proxy", choices=("hub", "outside"), default="hub",
        help="hub: the hub starts configurable-http-proxy (and stops and starts it again when "
        "it restarts, about 4 s of a hub fault's recovery); outside: the proxy runs apart "
        "(ConfigurableHTTPProxy.should_start = False, as z2jh and TLJH deploy it)",
    )
    p.add_argument(
        "--db", choices=("sqlite", "postgresql"), default="sqlite",
        help="the broker's database: SQLite (its fault: locked) or a PostgreSQL server of the "
        "run's own (its fault: stopped and started)",
    )
    p.add_argument(
        "--slurm", action="store_true",
        help="jobs run on a real Slurm cluster started for the run (slurmctld and a slurmd per "
        "job node, in namespaces; needs root), with kill -9 of its nodes among the faults",
    )
    p.add_argument("--tmp", default=None, help="folder for the stack (default: a new one)")
    p.add_argument("--history", default=None, help="where to keep the history")
    p.add_argument("--keep-history", action="store_true", help="keep it even with 0 violations")
    p.add_argument("--replay", default=None, metavar="FILE", help="re-audit a kept history")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.replay:
        h = load(args.replay)
        out = audit(h)
        print(render(h, out))
        return 1 if out.violations else 0
    from soak.run import run

    return run(args)


if __name__ == "__main__":
    sys.exit(main())
