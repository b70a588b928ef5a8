"""After a hub restart, a running server's grant is checked with the broker until the broker
answers, not once: a REAL JupyterHub restarted while the spawner cannot reach the broker.

The spawner reaches the broker through a small TCP forwarder of this test that can refuse
connections (the broker "unreachable") or pass them on. The single-user servers and the
broker are real; the server outlives the hub (``cleanup_servers = False``).
"""

from __future__ import annotations

import contextlib
import re
import socket
import threading
import time
from pathlib import Path

import pytest
import realhub
from realhub import free_port, proxy_available, start_hub
from test_spawner_userside_hub import POLICY, live_grants, server_pid, spawn, wait_ready

pytestmark = [pytest.mark.hub, pytest.mark.slow]

if not proxy_available():
    pytest.skip("configurable-http-proxy is not installed (npm install in hub_config/proxy)",
                allow_module_level=True)


class Forwarder(threading.Thread):
    """127.0.0.1:<port> -> 127.0.0.1:<target>; while ``refuse`` is set, connections are closed."""

    def __init__(self, target: int) -> None:
        super().__init__(daemon=True)
        self.target = target
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.refuse = threading.Event()
        self.refused = 0
        self.stopped = False

    def run(self) -> None:
        while not self.stopped:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            if self.refuse.is_set():
                self.refused += 1
                conn.close()
                continue
            try:
                up = socket.create_connection(("127.0.0.1", self.target), timeout=10)
            except OSError:
                conn.close()
                continue
            for a, b in ((conn, up), (up, conn)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(a: socket.socket, b: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := a.recv(65536):
                b.sendall(data)
        with contextlib.suppress(OSError):
            b.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self.stopped = True
        self.sock.close()


def config(policy: Path, broker_port: int, forward_port: int) -> str:
    return f"""
from jupyter_gpushare.hubsetup import setup_gpushare
setup_gpushare(c, {str(policy)!r}, spawner="simple", broker_port={broker_port},
               data_dir=HUB_TMP)
c.GPUShareSpawner.policy_file = {str(policy)!r}
c.GPUShareSpawner.broker_url = "http://127.0.0.1:{forward_port}/services/gpushare/api/v1"
c.GPUShareSpawner.grant_check_retry_s = 1.0
c.JupyterHub.cleanup_servers = False
c.SimpleLocalProcessSpawner.home_dir_template = HUB_TMP + "/home/{{username}}"
"""


def test_grant_check_after_restart_is_retried_until_the_broker_answers(
    tmp_path, monkeypatch
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    broker_port = free_port()
    fwd = Forwarder(broker_port)
    fwd.start()
    extra = config(policy, broker_port, fwd.port)
    hub = start_hub(tmp_path / "hub", extra_config=extra)
    pid = None
    try:
        hub.broker_api = f"http://127.0.0.1:{broker_port}/services/gpushare/api/v1"
        hub.create_user("alice", groups=["alpha"])
        assert spawn(hub, "alice", "debug-eighth")[0] in (201, 202)
        wait_ready(hub, "alice")
        (grant,) = live_grants(hub, "alice")
        pid = server_pid(hub, "alice")
        proxy_api = int(re.search(r'ConfigurableHTTPProxy.api_url = "http://127.0.0.1:(\d+)"',
                                  (hub.tmp / "jupyterhub_config.py").read_text()).group(1))
        hub.stop()
        fwd.refuse.set()  # the broker cannot be reached when the new hub looks
        ports = iter([hub.port, hub.api_port, proxy_api])
        monkeypatch.setattr(realhub, "free_port", lambda: next(ports))
        new = start_hub(hub.tmp, extra_config=extra)
        hub.proc, hub.admin_token = new.proc, new.admin_token
        deadline = time.monotonic() + 60
        while "cannot check grant" not in hub.log_text() and time.monotonic() < deadline:
            time.sleep(0.3)
        assert "cannot check grant" in hub.log_text(), hub.log_text()[-4000:]
        assert fwd.refused >= 1
        fwd.refuse.clear()  # the broker is back
        confirmed = f"grant {grant['id']} of alice confirmed by the broker"
        deadline = time.monotonic() + 60
        while confirmed not in hub.log_text() and time.monotonic() < deadline:
            time.sleep(0.3)
        assert confirmed in hub.log_text(), hub.log_text()[-4000:]
        # and the server and its grant are as they were
        assert server_pid(hub, "alice") == pid
        assert [g["id"] for g in live_grants(hub, "alice")] == [grant["id"]]
        status, _ = hub.api("DELETE", "/users/alice/server")
        assert status in (202, 204)
        deadline = time.monotonic() + 60
        while live_grants(hub, "alice") and time.monotonic() < deadline:
            time.sleep(0.3)
        assert live_grants(hub, "alice") == []
    finally:
        hub.stop()
        fwd.close()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                import os
                import signal

                os.kill(pid, signal.SIGKILL)
