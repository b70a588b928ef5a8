"""Broker start-up: CPU seconds of ``Broker.load`` (the state rebuild) at N live grants, and
the whole start (process start until ``/health`` answers with the state loaded).

Seeds one database per ``--db`` (``broker.seed``: fractions on the ``shared`` pool of
``--nodes`` nodes; SQLite file, PostgreSQL started in a temporary folder like the tests do),
then, ``--reps`` times and alternating between this checkout and, with ``--baseline DIR``
(another checkout, e.g. ``git archive main | tar -x -C DIR``), that one, on the same database:

* times ``Broker.load`` (CPU seconds, in a fresh process);
* with ``--startup``: starts the broker (``python -m jupyter_gpushare.broker``, static
  tokens, no hub) and polls ``/health`` until it answers ``ok``; prints the wall time from
  the process start and the broker's CPU seconds (user + system, /proc) at that moment: the
  machine may be shared, the CPU figure does not count other processes' time::

    .venv/bin/python benchmarks/broker_load.py --grants 100000 --nodes 12000 \\
        --db sqlite,postgresql --startup --baseline DIR
"""

from __future__ import annotations

import argparse
import gc
import http.client
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PATH = "/services/gpushare/api/v1"


def measure(db_url: str, nodes: int, grants: int, reps: int) -> list[float]:
    sys.path[:0] = [str(HERE), str(HERE.parent / "tests")]
    import broker as bench  # noqa: PLC0415

    from jupyter_gpushare.broker.service.broker import Broker  # noqa: PLC0415
    from jupyter_gpushare.broker.store.db import make_engine  # noqa: PLC0415

    policy = bench.bench_policy(nodes)
    out = []
    for _ in range(reps):
        broker = Broker(policy, make_engine(db_url))
        gc.collect()
        t0 = time.process_time()
        broker.load()
        out.append(time.process_time() - t0)
        assert len(broker.state.grants) == grants, len(broker.state.grants)
        broker.close()
    return out


def run(checkout: Path, args: argparse.Namespace, db_url: str) -> list[float]:
    env = dict(os.environ, PYTHONPATH=str(checkout))
    # this script (and its seed policy) for both: only jupyter_gpushare comes from checkout
    cmd = [sys.executable, str(HERE / "broker_load.py"), "--measure", db_url,
           "--grants", str(args.grants), "--nodes", str(args.nodes), "--reps", "1"]
    done = subprocess.run(cmd, env=env, cwd=checkout, check=True, capture_output=True, text=True)
    return [float(x) for x in done.stdout.split()]


def _health(port: int) -> str | None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", PATH + "/health")
        answer = conn.getresponse()
        return str(json.loads(answer.read()).get("status"))
    except (OSError, ValueError):
        return None
    finally:
        conn.close()


def startup(
    checkout: Path, db_url: str, args: argparse.Namespace, tmp: Path
) -> tuple[float, float]:
    """(wall s, broker CPU s) from the process start until /health answers ``ok``."""
    sys.path[:0] = [str(HERE), str(HERE.parent / "tests")]
    import broker as bench  # noqa: PLC0415
    from brokerkit import static_tokens  # noqa: PLC0415

    tokens = tmp / "tokens.json"
    tokens.write_text(json.dumps(static_tokens({})))
    port = bench.free_port()
    env = dict(os.environ, GPUSHARE_BENCH_NODES=str(args.nodes))
    env["PYTHONPATH"] = f"{checkout}{os.pathsep}{checkout / 'tests'}"
    cmd = [
        sys.executable, "-m", "jupyter_gpushare.broker",
        "--BrokerApp.policy_factory=brokerpolicies:bench_nodes",
        f"--BrokerApp.db_url={db_url}", f"--BrokerApp.port={port}", "--BrokerApp.ip=127.0.0.1",
        "--BrokerApp.use_hub=False", "--BrokerApp.reconcile_on_start=False",
        "--BrokerApp.reconcile_interval_s=0", "--BrokerApp.log_level=WARN",
        "--BrokerApp.authenticator_class=jupyter_gpushare.broker.api.auth.StaticTokenAuthenticator",
        f"--StaticTokenAuthenticator.tokens_file={tokens}",
    ]
    log = tmp / "broker.log"
    with open(log, "wb") as out:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, cwd=tmp, stdout=out, stderr=subprocess.STDOUT)
        try:
            while True:
                status = _health(port)
                if status == "ok":
                    return time.perf_counter() - t0, bench.cpu_s(proc.pid)
                if proc.poll() is not None:
                    raise RuntimeError(log.read_text())
                time.sleep(0.02)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)


def summary(label: str, now: list[float], base: list[float], baseline: Any) -> str:
    text = f"{label}, this checkout: min {min(now):.2f} ({' '.join(f'{x:.2f}' for x in now)})"
    if base:
        text += (f"; baseline {baseline}: min {min(base):.2f} "
                 f"({' '.join(f'{x:.2f}' for x in base)}); ratio {min(now) / min(base):.2f}")
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--grants", type=int, default=100000)
    parser.add_argument("--nodes", type=int, default=12000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--db", default="sqlite", help="sqlite, postgresql or both (a,b)")
    parser.add_argument("--startup", action="store_true",
                        help="also time the whole start: process start to /health ok")
    parser.add_argument("--baseline", type=Path, help="another checkout, measured alike")
    parser.add_argument("--measure", help=argparse.SUPPRESS)  # internal: one checkout's run
    args = parser.parse_args()
    if args.measure:
        print(" ".join(f"{x:.3f}" for x in measure(args.measure, args.nodes, args.grants,
                                                   args.reps)))
        return
    sys.path[:0] = [str(HERE), str(HERE.parent / "tests")]
    import broker as bench  # noqa: PLC0415
    from pgserver import PgServer, pg_missing_reason  # noqa: PLC0415

    checkouts = [HERE.parent] + ([args.baseline.resolve()] if args.baseline else [])
    lines = []
    with tempfile.TemporaryDirectory(prefix="gpushare-load-") as tmpdir:
        tmp = Path(tmpdir)
        for name in args.db.split(","):
            pg = None
            if name == "sqlite":
                db_url = f"sqlite:///{tmp}/seed.db"
            else:
                reason = pg_missing_reason()
                if reason:
                    print(f"postgresql: skipped ({reason})")
                    continue
                pg = PgServer()
                db_url = pg.new_database("load")
            try:
                print(f"{name}: seeding {args.grants} grants on {args.nodes} nodes ...",
                      flush=True)
                bench.seed(db_url, args.grants, args.nodes)
                load: dict[Path, list[float]] = {c: [] for c in checkouts}
                wall: dict[Path, list[float]] = {c: [] for c in checkouts}
                cpu: dict[Path, list[float]] = {c: [] for c in checkouts}
                for _ in range(args.reps):
                    for checkout in reversed(checkouts):  # the baseline first
                        load[checkout] += run(checkout, args, db_url)
                        if args.startup:
                            w, c = startup(checkout, db_url, args, tmp)
                            wall[checkout].append(w)
                            cpu[checkout].append(c)
                now, base = HERE.parent, (checkouts[1] if args.baseline else None)
                lines.append(summary(f"{name}: Broker.load CPU s", load[now],
                                     load[base] if base else [], args.baseline))
                if args.startup:
                    lines.append(summary(f"{name}: start to /health ok, wall s", wall[now],
                                         wall[base] if base else [], args.baseline))
                    lines.append(summary(f"{name}: start to /health ok, broker CPU s",
                                         cpu[now], cpu[base] if base else [], args.baseline))
            finally:
                if pg is not None:
                    pg.stop()
    print(f"\n{args.grants} live grants on {args.nodes} nodes")
    print("\n".join(lines))
    print(f"load average now: {' '.join(f'{x:.2f}' for x in os.getloadavg())} "
          f"on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
