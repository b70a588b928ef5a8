"""SIGHUP to a standalone broker process reloads its policy file (the admin endpoint and the
file watch are in ``test_broker_policy_reload.py``).

The broker runs as a real process (``python -m jupyter_gpushare.broker``, static tokens, no
hub) with the file watch off, so only the signal can pick a change up: a broken file keeps
the last good version and reports the error; a good change puts the new version in force.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from brokerkit import BASE, call, static_tokens
from realhub import free_port

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "hub_config" / "gpushare.yaml"
VISION_INTERACTIVE = "interactive: {guaranteed: 1.5, borrow_limit: 1, gpu_hours_per_month: 600"


async def until(check: Callable[[], Awaitable[Any]], proc: subprocess.Popen[bytes], log: Path,
                what: str, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        assert proc.poll() is None, log.read_text()[-3000:]
        try:
            found = await check()
        except ConnectionError:
            found = None
        if found:
            return found
        assert time.monotonic() < deadline, f"{what}: not in time\n{log.read_text()[-3000:]}"
        await asyncio.sleep(0.1)


async def test_sighup_reloads_the_policy_and_a_broken_file_keeps_the_old_one(
    tmp_path: Path,
) -> None:
    policy = tmp_path / "gpushare.yaml"
    good = DEMO.read_text()
    assert VISION_INTERACTIVE in good
    policy.write_text(good)
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps(static_tokens({"alice": ["vision"]})))
    port = free_port()
    url = f"http://127.0.0.1:{port}{BASE}"
    log = tmp_path / "broker.log"
    cmd = [
        sys.executable, "-m", "jupyter_gpushare.broker",
        f"--BrokerApp.policy_file={policy}",
        f"--BrokerApp.db_url=sqlite:///{tmp_path}/b.sqlite",
        f"--BrokerApp.port={port}", "--BrokerApp.ip=127.0.0.1",
        "--BrokerApp.use_hub=False", "--BrokerApp.reconcile_on_start=False",
        "--BrokerApp.reconcile_interval_s=0",
        "--BrokerApp.authenticator_class=jupyter_gpushare.broker.api.auth.StaticTokenAuthenticator",
        f"--StaticTokenAuthenticator.tokens_file={tokens}",
        "--PolicyReloader.check_interval_s=0",  # no file watch: only SIGHUP reloads
    ]
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=log.open("ab"), stderr=subprocess.STDOUT,
                            env=dict(os.environ))

    async def admin_policy() -> dict[str, Any]:
        status, body = await call(url, "GET", "/admin/policy", "tok-admin")
        assert status == 200, body
        return dict(body)

    async def guaranteed() -> float:
        status, usage = await call(url, "GET", "/teams/vision/usage", "tok-alice")
        assert status == 200, usage
        return float(usage["pools"]["interactive"]["guaranteed"])

    try:
        first = await until(admin_policy, proc, log, "the broker answering")
        assert first["version"] and first["last_error"] is None and first["check_interval_s"] == 0
        assert await guaranteed() == 1.5

        # a broken file on SIGHUP: the old version stays in force, the error names the file
        policy.write_text(good + "\nteams: [\n")
        proc.send_signal(signal.SIGHUP)

        async def failed() -> dict[str, Any] | None:
            now = await admin_policy()
            return now if now["last_result"] == "error" else None

        bad = await until(failed, proc, log, "the broken file reported")
        assert bad["version"] == first["version"], bad
        assert "gpushare.yaml" in bad["last_error"], bad
        assert await guaranteed() == 1.5
        status, metrics = await call(url, "GET", "/metrics", "tok-metrics")
        assert "gpushare_policy_reload_failing 1.0" in metrics

        # a good change on SIGHUP: the new version is in force, the error is cleared
        policy.write_text(good.replace(VISION_INTERACTIVE,
                                       VISION_INTERACTIVE.replace("1.5", "0.5"), 1))
        time.sleep(0.05)
        proc.send_signal(signal.SIGHUP)

        async def reloaded() -> dict[str, Any] | None:
            now = await admin_policy()
            return now if now["version"] != first["version"] else None

        done = await until(reloaded, proc, log, "the new policy in force")
        assert done["last_result"] == "ok" and done["last_error"] is None, done
        assert await guaranteed() == 0.5
        assert "SIGHUP" in log.read_text()
        assert proc.poll() is None  # SIGHUP does not stop the broker
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
