"""broker/ops/supervisor.py without JupyterHub: a stand-in hub process runs the supervisor.

The stand-in "hub" is a small Python process whose child is the supervisor (as under the
hub). Checked: a broker killed with SIGKILL is replaced and serves again; on SIGTERM to the
supervisor (what the hub does first at shutdown) the broker keeps serving while its hub
lives; when the hub is gone the broker (and the warm standby) exit and the port is free.
Needs no proxy, so it runs where the real-hub tests skip.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from realhub import REPO, free_port
from test_broker_lifecycle import alive, health, port_free, wait_for

POLICY = REPO / "hub_config" / "gpushare.yaml"


def children(pid: int) -> set[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return {int(p) for p in f.read().split()}
    except OSError:
        return set()


def test_supervisor_restarts_lingers_and_leaves_with_its_hub(tmp_path: Path) -> None:
    port = free_port()
    broker_args = [f"--BrokerApp.policy_file={POLICY}",
                   f"--BrokerApp.db_url=sqlite:///{tmp_path}/b.sqlite",
                   f"--BrokerApp.port={port}", "--BrokerApp.ip=127.0.0.1",
                   "--BrokerApp.use_hub=False", "--BrokerApp.reconcile_on_start=False",
                   "--BrokerApp.reconcile_interval_s=0", "--BrokerApp.watch_interval_s=0.2"]
    hub_code = ("import subprocess, sys, time\n"
                "p = subprocess.Popen([sys.executable, '-m',"
                " 'jupyter_gpushare.broker.ops.supervisor',"
                f" *{broker_args!r}])\n"
                "print(p.pid, flush=True)\n"
                "time.sleep(3600)\n")
    hub = subprocess.Popen([sys.executable, "-c", hub_code], cwd=tmp_path, text=True,
                           stdout=subprocess.PIPE, start_new_session=True)
    pids: list[int] = []
    try:
        assert hub.stdout is not None
        supervisor = int(hub.stdout.readline())
        pids.append(supervisor)
        wait_for(lambda: health(port), 60, "the broker answering")
        pid_file = tmp_path / "gpushare-broker.pid"
        first = int(json.loads(pid_file.read_text())["pid"])
        pids.append(first)
        assert json.loads(pid_file.read_text())["hub_pid"] == hub.pid
        # kill -9 of the broker: replaced, serving again
        os.kill(first, signal.SIGKILL)
        wait_for(lambda: not alive(first), 10, "the killed broker gone")
        wait_for(lambda: health(port, 0.5) and json.loads(pid_file.read_text())["pid"] != first,
                 30, "a new broker serving")
        second = int(json.loads(pid_file.read_text())["pid"])
        pids.append(second)
        pids.extend(children(supervisor))  # the warm standby
        # the hub stops its services: the supervisor exits, the broker keeps serving
        os.kill(supervisor, signal.SIGTERM)
        wait_for(lambda: not alive(supervisor), 10, "the supervisor leaving")
        time.sleep(1.0)  # several watch intervals
        assert alive(second) and health(port), "the broker stopped with its supervisor"
        # the hub goes: so does the broker, and the port is free
        os.kill(hub.pid, signal.SIGKILL)
        hub.wait(10)
        wait_for(lambda: not alive(second), 15, "the broker leaving after its hub")
        wait_for(lambda: port_free(port), 5, "the port freed")
        assert not pid_file.exists()
        wait_for(lambda: not any(alive(p) for p in pids), 10, "every process of ours gone")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(hub.pid, signal.SIGKILL)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_a_new_broker_takes_the_port_from_a_stale_one(tmp_path: Path) -> None:
    # a broker whose hub died without it noticing (watching switched off here) holds the
    # port; the next broker (same pid file) stops it and listens
    port = free_port()
    fake_hub = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    args = [sys.executable, "-m", "jupyter_gpushare.broker", f"--BrokerApp.policy_file={POLICY}",
            f"--BrokerApp.db_url=sqlite:///{tmp_path}/b.sqlite", f"--BrokerApp.port={port}",
            "--BrokerApp.ip=127.0.0.1", "--BrokerApp.use_hub=False",
            "--BrokerApp.reconcile_on_start=False", "--BrokerApp.reconcile_interval_s=0",
            "--BrokerApp.pid_file=broker.pid"]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        old = subprocess.Popen([*args, "--BrokerApp.watch_interval_s=3600"], cwd=tmp_path,
                               env=dict(os.environ, GPUSHARE_HUB_PID=str(fake_hub.pid)))
        procs.append(old)
        wait_for(lambda: health(port), 60, "the old broker answering")
        fake_hub.kill()
        fake_hub.wait(10)
        time.sleep(0.5)
        assert old.poll() is None and health(port)  # stale: it did not notice
        new = subprocess.Popen(args, cwd=tmp_path, env=dict(os.environ))
        procs.append(new)
        wait_for(lambda: old.poll() is not None, 30, "the stale broker stopped")
        wait_for(lambda: health(port) and json.loads((tmp_path / "broker.pid").read_text())[
            "pid"] == new.pid, 30, "the new broker serving on the port")
        assert new.poll() is None
    finally:
        fake_hub.kill()
        for proc in procs:
            proc.kill()
            proc.wait(10)
