"""Found by the soak harness (issue 28): a hub restarted while its GPU servers run waited the
whole ``init_spawners_timeout`` (10 s) before it started its proxy and its services.

The spawner's after-restart grant check asked the broker through its retrying client, which
keeps trying a refused connection for ``broker_retry_window_s`` (10 s); but the broker is the
hub's own managed service, started only after ``init_spawners``, so every restart with a
running GPU server stalled the hub (and kept the broker down) for those 10 s. The check now
asks once and, when the broker is not there yet, asks again later (``grant_check_retry_s``).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time

import pytest
import realhub
from realhub import free_port, proxy_available, start_hub
from test_spawner_restart_hub import Forwarder, config
from test_spawner_userside_hub import POLICY, live_grants, server_pid, spawn, wait_ready

pytestmark = [pytest.mark.hub, pytest.mark.slow]

if not proxy_available():
    pytest.skip(
        "configurable-http-proxy is not installed (npm install in hub_config/proxy)",
        allow_module_level=True,
    )


def test_a_hub_restart_with_a_gpu_server_does_not_wait_for_its_broker(
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
        proxy_api = int(
            re.search(
                r'ConfigurableHTTPProxy.api_url = "http://127.0.0.1:(\d+)"',
                (hub.tmp / "jupyterhub_config.py").read_text(),
            ).group(1)
        )
        hub.stop()
        fwd.refuse.set()  # the broker cannot be reached while the new hub starts
        ports = iter([hub.port, hub.api_port, proxy_api])
        monkeypatch.setattr(realhub, "free_port", lambda: next(ports))
        new = start_hub(hub.tmp, extra_config=extra)
        hub.proc, hub.admin_token = new.proc, new.admin_token
        log = hub.log_text()
        took = re.search(r"Initialized 1 spawners in ([\d.]+) seconds", log)
        assert took, log[-4000:]
        assert "init_spawners did not complete" not in log, log[-4000:]
        # it took 10.0x s (the client's retry window) before the fix; a loaded 2-core
        # machine gets some room below that
        assert float(took.group(1)) < 6.0, took.group(0)
        assert "cannot check grant" in log  # it asked once, and will ask again
        fwd.refuse.clear()
        confirmed = f"grant {grant['id']} of alice confirmed by the broker"
        deadline = time.monotonic() + 60
        while confirmed not in hub.log_text() and time.monotonic() < deadline:
            time.sleep(0.3)
        assert confirmed in hub.log_text(), hub.log_text()[-4000:]
        assert server_pid(hub, "alice") == pid
    finally:
        hub.stop()
        fwd.close()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
