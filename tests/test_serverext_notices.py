"""A preemption notice reaches the user's kernel output, with its deadline and time left.

A real jupyter_server with the extension, a real kernel, and a tiny broker stand-in that
serves one preemption notice for the server's grant.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import queue
import re
import time
from typing import Any

import pytest
import pytest_asyncio
from jupyter_core.utils import ensure_async
from pytest_jupyter.jupyter_server import *  # noqa: F403 (fixtures)
from telemetry_fakes import EXT_CONFIG, FakeBroker, grant_env, wait_until

from jupyter_gpushare.serverextension.service import TelemetryService, notice_text


@pytest_asyncio.fixture
async def jp_asyncio_loop():
    yield asyncio.get_running_loop()


@pytest_asyncio.fixture
async def broker():
    b = FakeBroker()
    b.start()
    yield b
    b.stop()


@pytest.fixture
def jp_server_config(monkeypatch: Any, broker: FakeBroker) -> dict[str, Any]:
    grant_env(monkeypatch, broker.url)
    return {**EXT_CONFIG, "GPUShareServerApp": {
        "sample_interval_s": 0.2, "notices_interval_s": 0.3, "heartbeat_interval_s": 60,
        "simulated_background_load": False}}


def test_notice_text_says_when_and_why() -> None:
    deadline = 2_000_000_000.0
    text = notice_text({"reason": "team nlp needs its guarantee back", "deadline_ts": deadline,
                        "seconds_left": 42.4})
    assert "team nlp needs its guarantee back" in text
    assert "stopped at 03:33:20 UTC (in 42 s)" in text
    assert "save your work" in text


async def test_the_running_cell_shows_the_preemption_countdown(
    jp_serverapp: Any, jp_fetch: Any, broker: FakeBroker
) -> None:
    """The notice reaches the output of the cell that runs when it comes (a training loop),
    while it runs, not after it."""
    body = {"path": "train.ipynb", "name": "train.ipynb", "type": "notebook",
            "kernel": {"name": "python3"}}
    r = await jp_fetch("api", "sessions", method="POST", body=json.dumps(body))
    kid = json.loads(r.body)["kernel"]["id"]
    km = jp_serverapp.kernel_manager
    client = km.get_kernel(kid).client()
    client.start_channels()
    await client.wait_for_ready(timeout=60)
    svc: TelemetryService = jp_serverapp.web_app.settings["gpushare_service"]
    await svc.start()
    kernels = svc.kernels
    await wait_until(lambda: kid in kernels._watched and not kernels._telling,
                     what="watcher started")
    cell = client.execute("print('training', flush=True); import time; time.sleep(120)")

    async def iopub(pred: Any) -> dict[str, Any]:
        while True:
            msg = await client.get_iopub_msg()
            if pred(msg):
                return dict(msg)

    await asyncio.wait_for(iopub(lambda m: m["msg_type"] == "stream"
                                 and "training" in m["content"]["text"]), 60)
    deadline = time.time() + 40
    broker.state.notices.append({
        "grant_id": "g-1", "kind": "preemption", "reason": "team nlp needs its guarantee back",
        "deadline": dt.datetime.fromtimestamp(deadline, dt.timezone.utc).isoformat(),
        "deadline_ts": deadline,
    })
    msg = await asyncio.wait_for(iopub(
        lambda m: m["msg_type"] == "stream" and m["content"].get("name") == "stderr"
        and "PREEMPTION" in m["content"]["text"]), 60)
    text = msg["content"]["text"]
    # in the running cell's output, while it still runs
    assert msg["parent_header"]["msg_id"] == cell
    while True:  # the cell has not finished (a late kernel_info reply may be waiting)
        try:
            reply = await ensure_async(client.get_shell_msg(timeout=0.2))
        except queue.Empty:
            break
        assert reply["parent_header"].get("msg_id") != cell, "the cell ended before the notice"
    clock = dt.datetime.fromtimestamp(deadline, dt.timezone.utc).strftime("%H:%M:%S UTC")
    assert f"stopped at {clock}" in text
    left = int(re.search(r"\(in (\d+) s\)", text).group(1))
    assert 0 < left <= 40
    assert "team nlp needs its guarantee back" in text
    # told once per notice (and once more near the deadline), not at every poll
    await asyncio.sleep(1.5)
    assert len([k for k in svc.broker_talk.seen_notices if not k.endswith("#last")]) == 1
    await km.interrupt_kernel(kid)
    client.stop_channels()
