"""Limit watchdog in a real jupyter_server with real kernels (simulated GPU memory).

The simulated sampler makes the kernel's real process "use" 11.2 GiB against a
10 GiB grant; the watchdog must stop the kernel as configured and the message must
reach the user: in the API, on the stream, and on the kernel's own output.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import pytest_asyncio
from pytest_jupyter.jupyter_server import *  # noqa: F403 (fixtures)
from telemetry_fakes import EXT_CONFIG, grant_env, wait_until

from jupyter_gpushare.serverextension.service import TelemetryService

GPU = "GPU-sim-node0-0"
MESSAGE = "GPU memory limit 10.0 GiB exceeded: kernel of analysis.ipynb used 11.2 GiB"


@pytest_asyncio.fixture
async def jp_asyncio_loop():
    yield asyncio.get_running_loop()


@pytest.fixture
def enforcement(request: Any) -> str:
    return str(getattr(request, "param", "env"))


@pytest.fixture
def action(request: Any) -> str:
    return str(getattr(request, "param", "restart"))


@pytest.fixture
def jp_server_config(monkeypatch: Any, enforcement: str, action: str) -> dict[str, Any]:
    grant_env(monkeypatch, None, GPUSHARE_ENFORCEMENT=enforcement)
    return {
        **EXT_CONFIG,
        "GPUShareServerApp": {
            "sample_interval_s": 0.1,
            "watchdog_action": action,
            "watchdog_grace_samples": 2,
            "watchdog_cooldown_s": 600,
            "simulated_background_load": False,
        },
    }


@pytest_asyncio.fixture
async def session(jp_fetch: Any, jp_serverapp: Any) -> dict[str, Any]:
    body = {"path": "analysis.ipynb", "name": "analysis.ipynb", "type": "notebook",
            "kernel": {"name": "python3"}}
    r = await jp_fetch("api", "sessions", method="POST", body=json.dumps(body))
    model = json.loads(r.body)
    kid = model["kernel"]["id"]
    km = jp_serverapp.kernel_manager
    client = km.get_kernel(kid).client()
    client.start_channels()
    await client.wait_for_ready(timeout=60)
    yield {"kernel_id": kid, "client": client, "km": km}
    client.stop_channels()


def service_of(app: Any) -> TelemetryService:
    svc: TelemetryService = app.web_app.settings["gpushare_service"]
    return svc


def kernel_pid(km: Any, kid: str) -> int:
    return int(km.get_kernel(kid).provisioner.process.pid)


async def stderr_text(client: Any, needle: str, timeout: float = 60) -> str:
    """Read iopub until a stderr stream message containing ``needle`` arrives."""

    async def scan() -> str:
        while True:
            msg = await client.get_iopub_msg()
            c = msg["content"]
            if msg["msg_type"] == "stream" and c.get("name") == "stderr" and needle in c["text"]:
                return str(c["text"])

    return await asyncio.wait_for(scan(), timeout)


async def over_limit(svc: TelemetryService, pid: int) -> None:
    await svc.start()
    await wait_until(lambda: any(k.pid == pid for k in svc.kernels), what="kernel seen")
    sim = svc.simulated_sampler
    assert sim is not None
    sim.set_process_memory(pid, 11.2 * 1024, GPU, sm_util_pct=50)


@pytest.mark.parametrize("action", ["restart"], indirect=True)
async def test_restart_over_limit_kernel_and_tell_the_user(
    jp_serverapp: Any, jp_fetch: Any, jp_ws_fetch: Any, session: dict[str, Any]
) -> None:
    svc, km, kid = service_of(jp_serverapp), session["km"], session["kernel_id"]
    old_pid = kernel_pid(km, kid)
    ws = await jp_ws_fetch("gpushare", "api", "metrics", "stream")
    await over_limit(svc, old_pid)
    text = await stderr_text(session["client"], "GPU memory limit")
    assert text.strip() == f"[gpushare] {MESSAGE}; the kernel was restarted"
    assert kernel_pid(km, kid) != old_pid  # really restarted
    # on the stream ...
    while True:
        m = json.loads(await asyncio.wait_for(ws.read_message(), 60))
        if m["type"] == "watchdog":
            break
    assert m["message"] == f"{MESSAGE}; the kernel was restarted"
    assert m["kernel_id"] == kid and m["path"] == "analysis.ipynb" and m["outcome"] == "done"
    ws.close()
    # ... and in the API
    r = json.loads((await jp_fetch("gpushare", "api", "metrics")).body)
    (ev,) = r["watchdog"]["events"]
    assert ev["message"] == m["message"] and ev["level"] == "error"
    assert ev["limit_mib"] == 10240 and ev["used_mib"] == pytest.approx(11468.8)
    # the freed memory is gone from the simulation
    assert svc.simulated_sampler is not None
    assert old_pid not in svc.simulated_sampler.process_memory()


@pytest.mark.parametrize("action", ["interrupt"], indirect=True)
async def test_interrupt_stops_the_running_cell_with_an_error(
    jp_serverapp: Any, session: dict[str, Any]
) -> None:
    svc, km, kid, client = (service_of(jp_serverapp), session["km"], session["kernel_id"],
                            session["client"])
    pid = kernel_pid(km, kid)
    msg_id = client.execute("print('cell started', flush=True); import time; time.sleep(300)")

    async def started() -> None:
        while True:
            m = await client.get_iopub_msg()
            if m["msg_type"] == "stream" and "cell started" in m["content"]["text"]:
                return

    await asyncio.wait_for(started(), 60)  # the cell is running: now go over the limit
    await over_limit(svc, pid)

    async def reply() -> dict[str, Any]:
        while True:
            r = await client.get_shell_msg()
            if r["parent_header"].get("msg_id") == msg_id:
                return dict(r["content"])

    content = await asyncio.wait_for(reply(), 120)
    assert content["status"] == "error" and content["ename"] == "KeyboardInterrupt"
    text = await stderr_text(client, "GPU memory limit")
    assert f"{MESSAGE}; the kernel was interrupted" in text
    assert kernel_pid(km, kid) == pid  # same kernel, cell stopped
    ev = await wait_until(lambda: svc.events and svc.events[-1], what="watchdog event")
    assert ev["action"] == "interrupt"


@pytest.mark.parametrize("action", ["shutdown"], indirect=True)
async def test_shutdown_removes_the_kernel(jp_serverapp: Any, session: dict[str, Any]) -> None:
    svc, km, kid = service_of(jp_serverapp), session["km"], session["kernel_id"]
    await over_limit(svc, kernel_pid(km, kid))
    await wait_until(lambda: kid not in km.list_kernel_ids(), what="kernel shut down")
    ev = await wait_until(lambda: svc.events and svc.events[-1], what="watchdog event")
    assert ev["message"] == f"{MESSAGE}; the kernel was shut down"


@pytest.mark.parametrize("enforcement", ["mps"], indirect=True)
async def test_no_watchdog_where_mps_holds_memory(
    jp_serverapp: Any, jp_fetch: Any, session: dict[str, Any]
) -> None:
    svc, km, kid = service_of(jp_serverapp), session["km"], session["kernel_id"]
    pid = kernel_pid(km, kid)
    await over_limit(svc, pid)
    start = svc.sampler.ticks
    await wait_until(lambda: svc.sampler.ticks >= start + 10, what="10 more samples")
    assert list(svc.events) == [] and kernel_pid(km, kid) == pid
    m = json.loads((await jp_fetch("gpushare", "api", "metrics")).body)
    assert m["watchdog"]["active"] is False and "mps" in m["watchdog"]["reason"]
    (k,) = m["attribution"]["kernels"]  # usage is still shown, attributed to the notebook
    assert k["path"] == "analysis.ipynb" and k["memory_mib"] == pytest.approx(11468.8)
    assert m["gpus"][0]["own_memory_mib"] == pytest.approx(11468.8)
