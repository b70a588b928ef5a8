"""A warm standby builds the service ahead (broker/ops/standby.py: AheadBuild, BrokerApp.ahead).

Checked in process: what the standby built is what serves after the takeover while the policy
file is unchanged; a policy file changed after the standby read it is read again at the
takeover (the new profile is there); a broken policy file does not kill the standby (the
start reports it, as any start does); the standby writes nothing to the database it checks;
``wait_for_go`` refreshes while it waits and tells a go from the supervisor's end of file.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import time
from pathlib import Path
from typing import Any

import pytest
from brokerkit import start_broker, static_tokens
from realhub import REPO

from jupyter_gpushare.broker.app import BrokerApp
from jupyter_gpushare.broker.ops import standby
from jupyter_gpushare.policy import load_policy
from jupyter_gpushare.policy.issues import PolicyError

POLICY = REPO / "hub_config" / "gpushare.yaml"


def standby_app(tmp_path: Path, policy_file: Path, monkeypatch: pytest.MonkeyPatch) -> BrokerApp:
    listener = socket.create_server(("127.0.0.1", 0))
    # (monkeypatch: a start that fails before it listens leaves it set; no later broker of
    # this process may inherit it)
    monkeypatch.setenv("GPUSHARE_LISTEN_FDS", str(listener.detach()))
    app = BrokerApp()
    app.initialize(
        [
            f"--BrokerApp.policy_file={policy_file}",
            f"--BrokerApp.db_url=sqlite:///{tmp_path}/b.sqlite",
            "--BrokerApp.ip=127.0.0.1",
            "--BrokerApp.use_hub=False",
            "--BrokerApp.reconcile_on_start=False",
            "--BrokerApp.reconcile_interval_s=0",
        ]
    )
    return app


async def prepared(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str = "") -> BrokerApp:
    """A standby prepared on the migrated database, with a policy file of its own (a copy of
    the demo's, or ``text``)."""
    await migrated_database(tmp_path)
    policy = tmp_path / "policy.yaml"
    policy.write_text(text or POLICY.read_text())
    app = standby_app(tmp_path, policy, monkeypatch)
    app.ahead.prepare(app)  # never raises: a broken file is the start's to report
    return app


async def migrated_database(tmp_path: Path) -> None:
    """The database as the running broker left it (the standby comes after it)."""
    app = await start_broker(
        load_policy(str(POLICY)),
        f"sqlite:///{tmp_path}/b.sqlite",
        static_tokens({"alice": ["vision"]}),
    )
    await app.stop_async()


def profile_slugs(app: BrokerApp) -> set[str]:
    return {p.slug for p in app.broker.policy.profiles}


async def test_what_the_standby_built_serves_while_the_policy_is_unchanged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    await migrated_database(tmp_path)
    policy = tmp_path / "policy.yaml"
    shutil.copy(POLICY, policy)
    app = standby_app(tmp_path, policy, monkeypatch)
    before = (tmp_path / "b.sqlite").read_bytes()
    app.ahead.prepare(app)
    assert (tmp_path / "b.sqlite").read_bytes() == before  # checked, nothing written
    built = app.web_app, app.broker
    await app.start_async()
    try:
        assert (app.web_app, app.broker) == built
    finally:
        await app.stop_async()


async def test_a_policy_changed_after_the_standby_read_it_is_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = await prepared(tmp_path, monkeypatch)
    policy = tmp_path / "policy.yaml"
    old = profile_slugs(app)
    built = app.broker
    text = policy.read_text()
    first = next(p for p in load_policy(str(POLICY)).profiles)
    renamed = text.replace(f"slug: {first.slug}\n", "slug: renamed-profile\n", 1)
    assert renamed != text
    time.sleep(0.01)
    policy.write_text(renamed)
    await app.start_async()
    try:
        assert app.broker is not built
        assert profile_slugs(app) == (old - {first.slug}) | {"renamed-profile"}
    finally:
        await app.stop_async()


async def test_a_broken_policy_does_not_stop_the_standby_and_the_start_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = await prepared(tmp_path, monkeypatch, "teams: [\n")  # the standby waits on
    with pytest.raises(PolicyError, match=r"policy\.yaml:2: malformed YAML"):
        await app.start_async()


def test_wait_for_go_refreshes_while_it_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(standby, "REFRESH_S", 0.05)
    refreshed: list[float] = []
    read, write = os.pipe()
    with os.fdopen(read, "rb", buffering=0) as stream:
        loop = asyncio.new_event_loop()
        try:
            loop.call_later(0.3, os.write, write, b"g")
            go: Any = loop.run_in_executor(
                None, standby.wait_for_go, stream, lambda: refreshed.append(time.time())
            )
            assert loop.run_until_complete(go) is True
        finally:
            loop.close()
        assert len(refreshed) >= 3
        os.close(write)  # the supervisor went away: leave
        assert standby.wait_for_go(stream, lambda: None) is False


def test_the_start_clock_says_each_step_in_milliseconds(monkeypatch: pytest.MonkeyPatch) -> None:
    from jupyter_gpushare.broker.ops import standby

    now = iter([100.0, 100.007, 100.013, 100.014])
    monkeypatch.setattr(standby.time, "monotonic", lambda: next(now))
    clock = standby.StartClock()
    clock.mark("state")
    clock.mark("jobs")
    clock.mark("listen")
    assert clock.text() == "ready 14 ms after the start: state 7 ms, jobs 6 ms, listen 1 ms"
