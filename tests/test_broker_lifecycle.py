"""The broker next to a real JupyterHub: shutdown, kill -9 of the hub, kill -9 of the broker.

Issue 8 item 14, with the real hub and proxy, the broker started by the hub from
``setup_gpushare`` (under ``broker/ops/supervisor.py``) and a real single-user server:

* on SIGTERM the hub stops its services before its servers; the server's grant must still be
  released by its spawner during that shutdown (not left live until the next start), at the
  time the server stops, and the broker must then exit;
* a broker killed with ``kill -9`` serves again within seconds (target 3 s; the time is
  printed), not at the hub's next 30 s service check;
* after ``kill -9`` of the hub the old broker exits and frees its port, so the next hub's
  broker starts on the same port.

Only processes these tests started are signalled (by the pids they know).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sqlite3
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from realhub import REPO, free_port, proxy_available, start_hub

pytestmark = [pytest.mark.hub, pytest.mark.slow]

POLICY = REPO / "hub_config" / "gpushare.yaml"


def config(port: int) -> str:
    return f"""
from jupyter_gpushare.hubsetup import setup_gpushare
setup_gpushare(c, {str(POLICY)!r}, spawner="simple", broker_port={port}, data_dir=HUB_TMP,
               broker_args=["--BrokerApp.reconcile_interval_s=0",
                            "--BrokerApp.reconcile_on_start=False"])
c.SimpleLocalProcessSpawner.home_dir_template = HUB_TMP + "/home/{{username}}"
c.JupyterHub.cleanup_servers = True
"""


def health(port: int, timeout: float = 2) -> bool:
    url = f"http://127.0.0.1:{port}/services/gpushare/api/v1/health"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status == 200 and json.loads(resp.read())["status"] == "ok"
    except (OSError, ValueError):
        return False


def wait_for(check: Any, timeout: float, what: str, log: Any = None) -> float:
    """Seconds until ``check()`` held; fails after ``timeout``."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if check():
            return time.monotonic() - t0
        time.sleep(0.05)
    raise AssertionError(f"{what} not within {timeout}s" + (f"\n{log()[-4000:]}" if log else ""))


def broker_pid(tmp: Path) -> int:
    return int(json.loads((tmp / "gpushare-broker.pid").read_text())["pid"])


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def kill_quietly(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)


@pytest.fixture
def hub_dir(tmp_path: Path) -> Any:
    if not proxy_available():
        pytest.skip("configurable-http-proxy is not installed in hub_config/proxy (npm install)")
    started: list[int] = []
    yield tmp_path, started
    for pid in started:  # brokers/supervisors these tests started, should any be left
        kill_quietly(pid)


def test_releases_at_hub_shutdown_succeed_and_the_broker_then_exits(hub_dir: Any) -> None:
    tmp, started = hub_dir
    port = free_port()
    hub = start_hub(tmp, config(port))
    try:
        wait_for(lambda: health(port), 60, "the broker answering", hub.log_text)
        pid = broker_pid(tmp)
        started.append(pid)
        hub.create_user("alice", ["vision"])
        status, body = hub.api("POST", "/users/alice/server", {"profile": "debug-eighth"})
        assert status in (201, 202), (status, body)
        wait_for(lambda: (hub.api("GET", "/users/alice")[1].get("servers") or {}).get(
            "", {}).get("ready"), 90, "alice's server ready", hub.log_text)
        db = sqlite3.connect(tmp / "gpushare.sqlite")
        live = db.execute("SELECT id FROM gpushare_grants WHERE username='alice' "
                          "AND released_at IS NULL").fetchall()
        assert len(live) == 1, live
        sigterm_at = time.time()
    finally:
        hub.stop()  # SIGTERM; the hub stops the broker's supervisor, then alice's server
    exited_at = time.time()
    wait_for(lambda: not alive(pid), 30, "the broker exiting after its hub")
    row = sqlite3.connect(tmp / "gpushare.sqlite").execute(
        "SELECT released_at FROM gpushare_grants WHERE id=?", (live[0][0],)).fetchone()
    log = hub.log_text()
    assert row[0] is not None, f"the grant stayed live over the shutdown\n{log[-4000:]}"
    # released by the spawner while the server stopped, not later by a reconcile
    assert sigterm_at - 1 <= row[0] <= exited_at + 1, (row, sigterm_at, exited_at)
    assert "could not release grant" not in log, log[-4000:]
    assert port_free(port)


def test_killed_broker_serves_again_and_a_killed_hub_leaves_no_broker(hub_dir: Any) -> None:
    tmp, started = hub_dir
    port = free_port()
    hub = start_hub(tmp, config(port))
    try:
        wait_for(lambda: health(port), 60, "the broker answering", hub.log_text)
        first = broker_pid(tmp)
        started.append(first)
        # kill -9 of the broker: its supervisor starts a new one at once
        os.kill(first, signal.SIGKILL)
        t0 = time.monotonic()
        wait_for(lambda: not alive(first), 10, "the killed broker gone")
        wait_for(lambda: health(port, 0.5), 20, "the broker serving again", hub.log_text)
        back = time.monotonic() - t0
        second = broker_pid(tmp)
        started.append(second)
        print(f"\nkilled broker serving again after {back:.2f} s (target 3 s)")
        assert second != first
        # kill -9 of the hub: the broker notices its hub is gone and frees the port
        hub_pid = hub.proc.pid
        os.kill(hub_pid, signal.SIGKILL)
        hub.proc.wait(10)
        gone = wait_for(lambda: not alive(second), 15, "the orphaned broker exiting")
        print(f"orphaned broker exited {gone:.2f} s after the hub's kill -9")
        wait_for(lambda: port_free(port), 5, "the broker's port freed")
    finally:
        hub.stop()
    # the next hub in the same place gets a broker on the same port
    hub = start_hub(tmp, config(port))
    try:
        wait_for(lambda: health(port), 60, "the next hub's broker answering", hub.log_text)
        third = broker_pid(tmp)
        started.append(third)
        assert third not in (first, second)
    finally:
        hub.stop()
    wait_for(lambda: not alive(third), 30, "the broker exiting after its hub")
