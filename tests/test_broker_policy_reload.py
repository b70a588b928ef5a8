"""Reloading the policy in a running broker (issue 8, item 13), with the real YAML loader.

The broker reads a copy of the demo policy file; the file is then broken (the last good
policy stays in force, and the broker says so), and changed (a guarantee cut below its use:
the grant becomes borrowed with a notice; the file watch picks a change up by itself).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from brokerkit import call, start_broker, static_tokens

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "hub_config" / "gpushare.yaml"
VISION_INTERACTIVE = "interactive: {guaranteed: 1.5, borrow_limit: 1, gpu_hours_per_month: 600"


@pytest.fixture
async def app(tmp_path: Path) -> Any:
    policy = tmp_path / "gpushare.yaml"
    policy.write_text(DEMO.read_text())
    broker = await start_broker(
        None,
        f"sqlite:///{tmp_path}/b.sqlite",
        static_tokens({"alice": ["vision"], "bob": ["nlp"]}),
        policy_file=str(policy),
    )
    broker.policy_path = policy
    yield broker
    await broker.stop_async()


async def test_reload_keeps_the_last_good_policy_and_demotes_what_it_no_longer_allows(
    app: Any,
) -> None:
    path: Path = app.policy_path
    status, first = await call(app, "GET", "/admin/policy", "tok-admin")
    assert status == 200 and first["version"] and first["last_error"] is None
    assert (await call(app, "GET", "/admin/policy", "tok-alice"))[0] == 403
    assert (await call(app, "POST", "/admin/policy/reload", "tok-alice"))[0] == 403
    status, ans = await call(app, "POST", "/requests", "tok-alice", {"profile": "lab-small"})
    assert status == 201 and ans["grant"]["borrowed"] is False, ans
    assert ans["policy_version"] == first["version"]
    gid = ans["grant"]["id"]

    # a broken file: nothing changes, and the broker says so
    good = path.read_text()
    path.write_text(good + "\nteams: [\n")
    status, bad = await call(app, "POST", "/admin/policy/reload", "tok-admin")
    assert status == 422 and bad["last_result"] == "error", bad
    assert "gpushare.yaml" in bad["last_error"] and bad["version"] == first["version"]
    status, metrics = await call(app, "GET", "/metrics", "tok-metrics")
    assert "gpushare_policy_reload_failing 1.0" in metrics
    assert 'gpushare_policy_reloads_total{result="error"} 1.0' in metrics
    status, other = await call(app, "POST", "/requests", "tok-bob", {"profile": "lab-small"})
    assert status == 201 and other["policy_version"] == first["version"]

    # vision's interactive guarantee cut to 0: alice's grant is kept, but borrowed
    assert VISION_INTERACTIVE in good
    path.write_text(good.replace(VISION_INTERACTIVE, VISION_INTERACTIVE.replace("1.5", "0"), 1))
    status, done = await call(app, "POST", "/admin/policy/reload", "tok-admin")
    assert status == 200 and done["last_result"] == "ok" and done["last_error"] is None, done
    assert done["version"] != first["version"]
    assert [(c["grant_id"], c["change"]) for c in done["changes"]] == [(gid, "borrowed")]
    status, grant = await call(app, "GET", f"/grants/{gid}", "tok-alice")
    assert grant["borrowed"] is True and grant["preemptible"] is True and not grant["released_at"]
    status, notices = await call(app, "GET", "/notices", "tok-alice")
    kinds = [(n["grant_id"], n["kind"]) for n in notices["notices"]]
    assert (gid, "policy") in kinds and "guarantee" in notices["notices"][0]["reason"]
    status, metrics = await call(app, "GET", "/metrics", "tok-metrics")
    assert "gpushare_policy_reload_failing 0.0" in metrics
    status, usage = await call(app, "GET", "/teams/vision/usage", "tok-alice")
    assert usage["pools"]["interactive"]["guaranteed"] == 0.0
    assert usage["pools"]["interactive"]["borrowed"] == ans["grant"]["units"]
    status, profiles = await call(app, "GET", "/policy/profiles", "tok-alice")
    assert profiles["policy_version"] == done["version"]

    # the file watch picks up a change by itself
    app.ctx.reloader.check_interval_s = 0.2
    path.write_text(path.read_text() + "\n# edited\n")
    deadline = time.monotonic() + 20
    while True:
        status, now = await call(app, "GET", "/admin/policy", "tok-admin")
        if now["version"] not in (first["version"], done["version"]):
            break
        assert time.monotonic() < deadline, now
        await asyncio.sleep(0.2)
    assert app.broker.policy_version == now["version"]
