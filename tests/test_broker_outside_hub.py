"""The broker outside the hub (``setup_gpushare(..., broker_managed=False)``): the hub only
proxies to it, and a kill -9 of the hub does not take it along.

Found by the soak harness (issue 28): with the broker as the hub's managed service, a hub
fault took the broker down with it, and admission waited 7-10 s for the new hub to start a
new broker. Here the hub and its proxy are killed together (kill -9 of their process group)
while a GPU server runs; the same broker process keeps serving (admission and release for
the spawner's token) while no hub runs, the hub restarted on the same ports finds the
server's grant where it was, and SIGTERM of the supervisor stops the broker.

Also the launch file: written 0600 by the hub's config, refused when it is a link, readable
by others, or a field is wrong (the error names the file and the field).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import realhub
from realhub import free_port, proxy_available, start_hub
from test_spawner_userside_hub import POLICY, live_grants, server_pid, spawn, wait_ready

from jupyter_gpushare.broker.ops.external import (
    FORMAT,
    Launch,
    LaunchFileError,
    read_launch_file,
    write_launch_file,
)

PREFIX = "/services/gpushare/api/v1"


def config(policy: Path, broker_port: int) -> str:
    return f"""
from jupyter_gpushare.hubsetup import setup_gpushare
setup_gpushare(c, {str(policy)!r}, spawner="simple", broker_port={broker_port},
               data_dir=HUB_TMP, broker_managed=False,
               broker_args=["--BrokerApp.groups_ttl_s=0.5"])
c.GPUShareSpawner.policy_file = {str(policy)!r}
c.JupyterHub.cleanup_servers = False
c.SimpleLocalProcessSpawner.home_dir_template = HUB_TMP + "/home/{{username}}"
"""


def call(url: str, token: str, method: str = "GET", body: Any = None) -> tuple[int, Any]:
    req = urllib.request.Request(
        url,
        method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"token {token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")
    except OSError as exc:
        return 599, str(exc)


def wait_for(what: str, ok: Any, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not ok():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} within {timeout}s")
        time.sleep(0.2)


@pytest.mark.hub
@pytest.mark.slow
def test_the_broker_outside_the_hub_serves_through_a_hub_kill(tmp_path, monkeypatch) -> None:
    if not proxy_available():
        pytest.fail("configurable-http-proxy is not installed (npm install in hub_config/proxy)")
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    broker_port = free_port()
    base = f"http://127.0.0.1:{broker_port}{PREFIX}"
    hub = start_hub(tmp_path / "hub", extra_config=config(policy, broker_port))
    launch = hub.tmp / "gpushare_broker.json"
    log = open(hub.tmp / "broker.log", "ab")  # noqa: SIM115 - closed below
    broker = subprocess.Popen(
        [sys.executable, "-m", "jupyter_gpushare.broker.ops.external", str(launch)],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    pid = None
    try:
        # the hub did not start a broker of its own; the launch file is the token's keeper
        assert stat.S_IMODE(launch.stat().st_mode) == 0o600
        assert "Starting managed service gpushare" not in hub.log_text()
        spawner = json.loads((hub.tmp / "gpushare_tokens.json").read_text())["spawner"]
        wait_for("the broker serves", lambda: call(base + "/health", spawner)[0] == 200)
        hub.broker_api = base
        hub.create_user("alice", groups=["alpha"])
        assert spawn(hub, "alice", "debug-eighth")[0] in (201, 202)
        wait_ready(hub, "alice")
        (grant,) = live_grants(hub, "alice")
        pid = server_pid(hub, "alice")
        broker_pid = json.loads((hub.tmp / "gpushare-broker.pid").read_text())["pid"]

        proxy_api = int(re.search(r'ConfigurableHTTPProxy.api_url = "http://127.0.0.1:(\d+)"',
                                  (hub.tmp / "jupyterhub_config.py").read_text()).group(1))
        def admit_and_release(key: str) -> float:
            """A request for alice (her groups asked of the hub by the broker) and its
            release; the milliseconds it took to be admitted."""
            t0 = time.monotonic()
            status, answer = call(base + "/requests", spawner, "POST", {
                "user": "alice", "profile": "debug-eighth", "server": "two",
                "idempotency_key": key})
            took_ms = (time.monotonic() - t0) * 1000
            assert status == 201, answer
            assert call(f"{base}/grants/{answer['grant']['id']}", spawner, "DELETE")[0] == 200
            return took_ms

        admit_and_release("outside-1")
        os.killpg(hub.proc.pid, signal.SIGKILL)  # the hub and its proxy, at once
        hub.proc.wait(10)
        time.sleep(1.0)  # alice's groups are past their TTL: the hub would be asked
        # no hub: the same broker admits and releases for the spawner (its token was
        # checked with the hub before and alice's groups read: both stand while it is down)
        assert admit_and_release("outside-2") < 5000
        assert json.loads((hub.tmp / "gpushare-broker.pid").read_text())["pid"] == broker_pid
        assert broker.poll() is None

        ports = iter([hub.port, hub.api_port, proxy_api])
        monkeypatch.setattr(realhub, "free_port", lambda: next(ports))
        new = start_hub(hub.tmp, extra_config=config(policy, broker_port))
        hub.proc, hub.admin_token = new.proc, new.admin_token
        wait_ready(hub, "alice")
        assert [g["id"] for g in live_grants(hub, "alice")] == [grant["id"]]
        assert server_pid(hub, "alice") == pid
        assert json.loads((hub.tmp / "gpushare-broker.pid").read_text())["pid"] == broker_pid

        broker.send_signal(signal.SIGTERM)  # as systemd stops it
        assert broker.wait(40) == 0
        assert call(base + "/health", spawner)[0] == 599
    finally:
        hub.stop()
        if broker.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(broker.pid, signal.SIGKILL)
            broker.wait(10)
        log.close()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def launch_doc(tmp_path: Path) -> Launch:
    return Launch(["--BrokerApp.port=1"], {"JUPYTERHUB_API_TOKEN": "t"}, str(tmp_path))


def test_the_launch_file_is_written_0600_and_read_back(tmp_path: Path) -> None:
    path = tmp_path / "gpushare_broker.json"
    write_launch_file(str(path), launch_doc(tmp_path))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert read_launch_file(str(path)) == launch_doc(tmp_path)


def test_a_launch_file_through_a_link_or_readable_by_others_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "gpushare_broker.json"
    write_launch_file(str(path), launch_doc(tmp_path))
    link = tmp_path / "link.json"
    link.symlink_to(path)
    with pytest.raises(LaunchFileError, match="links are not followed"):
        read_launch_file(str(link))
    path.chmod(0o644)
    with pytest.raises(LaunchFileError, match="mode is 0644"):
        read_launch_file(str(path))


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"format": "other/1"}, "format"),
        ({"broker_args": ["--a", 3]}, "broker_args"),
        ({"environment": {"A": 1}}, "environment"),
        ({"cwd": "relative/dir"}, "cwd"),
    ],
)
def test_a_wrong_field_of_the_launch_file_is_named(
    tmp_path: Path, change: dict[str, Any], field: str
) -> None:
    doc = {"format": FORMAT, "broker_args": [], "environment": {}, "cwd": str(tmp_path)}
    doc.update(change)
    path = tmp_path / "gpushare_broker.json"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f)
    with pytest.raises(LaunchFileError, match=f"field '{field}'"):
        read_launch_file(str(path))


def test_the_launch_file_names_the_hub_api_the_hub_gives_its_services(tmp_path: Path) -> None:
    from traitlets.config import Config

    from jupyter_gpushare.hubsetup import setup_gpushare

    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    c = Config()
    c.JupyterHub.hub_ip = "10.0.0.5"
    c.JupyterHub.hub_port = 18081
    c.JupyterHub.base_url = "/jhub"
    out = setup_gpushare(c, str(policy), data_dir=str(tmp_path), broker_managed=False)
    (service,) = [s for s in c.JupyterHub.services if s["name"] == "gpushare"]
    assert "command" not in service  # the hub starts no broker
    env = read_launch_file(out["launch_file"]).environment
    assert env["JUPYTERHUB_API_URL"] == "http://10.0.0.5:18081/jhub/hub/api"
    assert env["JUPYTERHUB_SERVICE_PREFIX"] == "/jhub/services/gpushare/"
    assert env["JUPYTERHUB_OAUTH_CALLBACK_URL"] == "/jhub/services/gpushare/oauth_callback"
    assert env["JUPYTERHUB_API_TOKEN"] == out["tokens"]["broker"]
    managed = setup_gpushare(Config(), str(policy), data_dir=str(tmp_path / "m"))
    assert managed["launch_file"] is None
