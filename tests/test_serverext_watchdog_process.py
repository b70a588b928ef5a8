"""The memory limit holds for every process of the server, not only kernels.

A real jupyter_server with the terminals extension; real processes (``python train.py``
typed into a real JupyterLab terminal, and a plain child process); the simulated sampler
makes them "use" 11.2 GiB against a 10 GiB grant. The watchdog stops them (SIGTERM, then
SIGKILL after the grace period) and tells the user in the terminal and on the stream.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from typing import Any

import psutil
import pytest
import pytest_asyncio
from pytest_jupyter.jupyter_server import *  # noqa: F403 (fixtures)
from telemetry_fakes import EXT_CONFIG, grant_env, wait_until

from jupyter_gpushare.serverextension.service import TelemetryService

GPU = "GPU-sim-node0-0"
OVER = 11.2 * 1024

TRAIN = """
import signal, sys, time
if sys.argv[1:] == ["stubborn"]:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # must be killed
print("training", flush=True)
time.sleep(300)
"""


@pytest_asyncio.fixture
async def jp_asyncio_loop():
    yield asyncio.get_running_loop()


@pytest.fixture
def jp_server_config(monkeypatch: Any) -> dict[str, Any]:
    grant_env(monkeypatch, None, GPUSHARE_ENFORCEMENT="env")
    return {
        "ServerApp": {"jpserver_extensions": {
            **EXT_CONFIG["ServerApp"]["jpserver_extensions"],
            "jupyter_server_terminals": True,
        }},
        "GPUShareServerApp": {
            "sample_interval_s": 0.1,
            "watchdog_grace_samples": 2,
            "watchdog_cooldown_s": 600,
            "watchdog_kill_grace_s": 1.0,
            "simulated_background_load": False,
        },
    }


def service_of(app: Any) -> TelemetryService:
    svc: TelemetryService = app.web_app.settings["gpushare_service"]
    return svc


async def child_of(pid: int, needle: str, timeout: float = 60) -> psutil.Process:
    async def find() -> psutil.Process:
        while True:
            for c in psutil.Process(pid).children(recursive=True):
                try:
                    if needle in " ".join(c.cmdline()):
                        return c
                except psutil.Error:
                    continue
            await asyncio.sleep(0.1)

    return await asyncio.wait_for(find(), timeout)


@pytest.mark.parametrize("mode", ["stubborn", "polite"])
async def test_python_in_a_terminal_over_the_limit_is_stopped_and_the_terminal_says_so(
    jp_serverapp: Any, jp_fetch: Any, jp_ws_fetch: Any, jp_root_dir: Any, mode: str
) -> None:
    (jp_root_dir / "train.py").write_text(TRAIN)
    svc = service_of(jp_serverapp)
    await svc.start()
    r = await jp_fetch("api", "terminals", method="POST", body="{}")
    name = json.loads(r.body)["name"]
    term_ws = await jp_ws_fetch("terminals", "websocket", name)
    stream = await jp_ws_fetch("gpushare", "api", "metrics", "stream")
    term = jp_serverapp.web_app.settings["terminal_manager"].terminals[name]
    term.ptyproc.write(f"cd {jp_root_dir} && {sys.executable} train.py {mode}\n")
    proc = await child_of(term.ptyproc.pid, "train.py")
    # not before it says so: a stubborn one ignores SIGTERM only from then on (a CI run on
    # a loaded machine had it stopped by SIGTERM before it got there)
    shown = ""
    while "training\r\n" not in shown and "training\n" not in shown:
        msg = json.loads(await asyncio.wait_for(term_ws.read_message(), 30))
        if msg[0] == "stdout":
            shown += msg[1]
    sim = svc.simulated_sampler
    assert sim is not None
    sim.set_process_memory(proc.pid, OVER, GPU, sm_util_pct=50)
    await wait_until(lambda: not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE,
                     what="train.py stopped", timeout=30)
    ev = await wait_until(lambda: svc.events and svc.events[-1], what="watchdog event")
    expect = "killed" if mode == "stubborn" else "terminated"
    assert ev["outcome"] == expect, ev
    assert ev["pid"] == proc.pid and ev["terminal"] == name and ev["kernel_id"] is None
    assert "train.py" in ev["process"]
    assert ev["message"].startswith(
        f"GPU memory limit 10.0 GiB exceeded: process {proc.pid} (")
    assert "used 11.2 GiB; it was " in ev["message"]
    # the terminal it ran in shows the message (attached views and the replay buffer) ...
    said = ""
    while "[gpushare]" not in said:
        msg = json.loads(await asyncio.wait_for(term_ws.read_message(), 30))
        if msg[0] == "stdout":
            said += msg[1]
    assert ev["message"] in said
    assert any(ev["message"] in chunk for chunk in term.read_buffer)
    # ... and so does the stream
    while True:
        m = json.loads(await asyncio.wait_for(stream.read_message(), 30))
        if m["type"] == "watchdog":
            break
    assert m["message"] == ev["message"] and m["terminal"] == name
    # the simulated memory of the dead process is gone
    assert proc.pid not in sim.process_memory()
    term_ws.close()
    stream.close()


async def test_a_child_process_outside_terminals_is_stopped_too(
    jp_serverapp: Any, jp_root_dir: Any
) -> None:
    (jp_root_dir / "train.py").write_text(TRAIN)
    svc = service_of(jp_serverapp)
    await svc.start()
    child = subprocess.Popen([sys.executable, str(jp_root_dir / "train.py")],
                             stdout=subprocess.DEVNULL)
    try:
        sim = svc.simulated_sampler
        assert sim is not None
        sim.set_process_memory(child.pid, OVER, GPU)
        ev = await wait_until(lambda: svc.events and svc.events[-1], what="watchdog event",
                              timeout=30)
        assert ev["outcome"] == "terminated" and ev["pid"] == child.pid
        assert ev["terminal"] is None
        assert child.wait(10) is not None
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)


async def test_the_server_process_itself_is_never_signalled(jp_serverapp: Any) -> None:
    import os

    svc = service_of(jp_serverapp)
    await svc.start()
    sim = svc.simulated_sampler
    assert sim is not None
    sim.set_process_memory(os.getpid(), OVER, GPU)
    start = svc.sampler.ticks
    await wait_until(lambda: svc.sampler.ticks >= start + 6, what="6 more samples")
    assert all(e.get("pid") is None for e in svc.events)
    sim.set_process_memory(os.getpid(), 0, GPU)
