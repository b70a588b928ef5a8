"""A hub whose proxy runs apart (``realhub.start_hub(proxy_outside=True)``, the soak's
``--proxy outside``): a hub killed with SIGKILL and started again from its own config answers
through the same proxy process, which it neither stopped nor replaced (with the proxy started
by the hub, JupyterHub stops the old proxy, two SIGTERMs a second apart, and starts a new one:
about 4 s of each hub restart in the soak)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from realhub import proxy_available, start_hub

pytestmark = pytest.mark.skipif(not proxy_available(), reason="configurable-http-proxy missing")


def test_a_restarted_hub_answers_through_the_proxy_it_did_not_start(tmp_path: Path) -> None:
    hub = start_hub(tmp_path / "hub", proxy_outside=True)
    try:
        proxy = hub.proxy_proc
        assert proxy is not None and proxy.poll() is None
        os.killpg(hub.proc.pid, signal.SIGKILL)
        hub.proc.wait(10)
        assert proxy.poll() is None  # not in the hub's process group
        path = f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}"
        with open(hub.tmp / "hub.log", "ab") as log:
            hub.proc = subprocess.Popen(
                [sys.executable, "-m", "jupyterhub", "-f", str(hub.tmp / "jupyterhub_config.py")],
                cwd=hub.tmp, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                env=dict(os.environ, PATH=path),
            )
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            assert hub.proc.poll() is None, hub.log_text()[-3000:]
            try:
                if hub.api("GET", "/user", timeout=2)[0] == 200:
                    break
            except OSError:
                pass
            time.sleep(0.2)
        else:
            raise AssertionError("the restarted hub did not answer:\n" + hub.log_text()[-3000:])
        assert proxy.poll() is None and hub.proxy_proc is proxy
        assert "Proxy still running" not in hub.log_text()  # the hub never touched it
    finally:
        hub.stop()
    assert proxy.poll() is not None  # stop() takes the proxy run apart along
