"""How fast a killed broker serves again under ``broker/ops/supervisor.py`` (issue 8 item 14).

Runs the supervisor the way the hub does (this script stands in for the hub: it is the
supervisor's parent), kills the broker with SIGKILL ``--kills`` times and measures the time
from the kill to the first ``/health`` answer, once with the warm standby and once without
(the baseline: a cold start of a new broker process). Without a supervisor the hub's own
service check restarts a dead service after up to 30 s.

    .venv/bin/python benchmarks/restart.py --kills 10

``--signals KILL,TERM`` also stops the broker with SIGTERM (a clean stop, then the next one);
``--baseline DIR`` (an unpacked ``git archive`` of an earlier commit) measures that tree's
supervisor and broker (warm standby) against this tree's, ``--reps`` times alternated,
instead of cold against warm:

    git archive 153c775 | (mkdir -p /tmp/base && tar -x -C /tmp/base)
    .venv/bin/python benchmarks/restart.py --kills 8 --signals KILL,TERM --baseline /tmp/base
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
POLICY = REPO / "hub_config" / "gpushare.yaml"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def healthy(port: int) -> bool:
    try:
        url = f"http://127.0.0.1:{port}/services/gpushare/api/v1/health"
        with urllib.request.urlopen(url, timeout=0.5) as resp:
            return resp.status == 200 and json.loads(resp.read())["status"] == "ok"
    except (OSError, ValueError):
        return False


def broker_pid(tmp: Path, not_pid: int = 0, timeout: float = 30) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            pid = int(json.loads((tmp / "gpushare-broker.pid").read_text())["pid"])
            if pid != not_pid:
                return pid
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.02)
    raise RuntimeError("no broker pid file")


def run(standby: bool, kills: int, sig: int = signal.SIGKILL, code: str | None = None
        ) -> list[float]:
    """Seconds from each signal to the next broker's first /health answer (``code``:
    another tree's supervisor and broker)."""
    tmp = Path(tempfile.mkdtemp(prefix="gpushare-restart-"))
    port = free_port()
    env = dict(os.environ, GPUSHARE_SUPERVISOR_STANDBY="1" if standby else "0")
    if code:
        env["PYTHONPATH"] = os.pathsep.join([code, env.get("PYTHONPATH", "")])
    cmd = [sys.executable, "-m", "jupyter_gpushare.broker.ops.supervisor",
           f"--BrokerApp.policy_file={POLICY}", f"--BrokerApp.db_url=sqlite:///{tmp}/b.sqlite",
           f"--BrokerApp.port={port}", "--BrokerApp.ip=127.0.0.1", "--BrokerApp.use_hub=False",
           "--BrokerApp.reconcile_on_start=False", "--BrokerApp.reconcile_interval_s=0",
           "--BrokerApp.log_level=WARN"]
    log = open(tmp / "supervisor.log", "wb")  # noqa: SIM115 - closed below
    sup = subprocess.Popen(cmd, cwd=tmp, env=env, stdout=log, stderr=subprocess.STDOUT)
    times: list[float] = []
    try:
        deadline = time.monotonic() + 60
        while not healthy(port):
            if time.monotonic() > deadline:
                raise RuntimeError((tmp / "supervisor.log").read_text()[-3000:])
            time.sleep(0.05)
        pid = broker_pid(tmp)
        for _ in range(kills):
            time.sleep(5.0)  # a crash long after the last one: the standby is ready
            os.kill(pid, sig)
            t0 = time.monotonic()
            new = broker_pid(tmp, not_pid=pid)
            while not healthy(port):
                time.sleep(0.01)
            times.append(time.monotonic() - t0)
            pid = new
    finally:
        sup.send_signal(signal.SIGTERM)  # hand over: the broker lingers while we live
        sup.wait(10)
        with contextlib.suppress(RuntimeError, ProcessLookupError):
            os.kill(broker_pid(tmp, timeout=1), signal.SIGTERM)
        log.close()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--signals", default="KILL", help="KILL, TERM or both (KILL,TERM)")
    parser.add_argument("--baseline", metavar="DIR", help="another tree, against this one")
    parser.add_argument("--reps", type=int, default=1, help="runs of each arm, alternated")
    args = parser.parse_args()
    sigs = [getattr(signal, f"SIG{name.strip().upper()}") for name in args.signals.split(",")]
    if args.baseline:
        code = str(Path(args.baseline).resolve())
        for sig in sigs:
            got: dict[str, list[float]] = {"baseline": [], "this tree": []}
            for _ in range(args.reps):
                got["baseline"] += run(True, args.kills, sig, code)
                got["this tree"] += run(True, args.kills, sig)
            print(f"{signal.Signals(sig).name} -> serving again ({args.kills} x {args.reps} "
                  f"each, warm standby, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f})")
            for name, xs in got.items():
                print(row(name, xs))
            print(f"ratio this tree / baseline (median): "
                  f"{statistics.median(got['this tree']) / statistics.median(got['baseline']):.2f}")
        return
    base = run(False, args.kills)
    warm = run(True, args.kills)

    print(f"killed broker -> serving again ({args.kills} kills each, {os.cpu_count()} CPUs)")
    print(row("cold start (no standby)", base))
    print(row("warm standby", warm))
    print(f"ratio warm / cold (median): {statistics.median(warm) / statistics.median(base):.2f}")


def row(name: str, xs: list[float]) -> str:
    xs = sorted(xs)
    p90 = xs[max(0, int(round(0.9 * len(xs))) - 1)]
    return (f"{name:<26} median {statistics.median(xs):5.2f} s   p90 {p90:5.2f} s   "
            f"max {xs[-1]:5.2f} s")


if __name__ == "__main__":
    main()
