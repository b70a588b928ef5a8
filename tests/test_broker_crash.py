"""Crash safety for real: a broker subprocess, a burst of concurrent HTTP requests, ``kill -9``.

After the restart:

* every request that was answered ``granted`` (and not released) still holds its grant;
* every release that was acknowledged stayed released;
* no request has two grants and no idempotency key two requests, and retrying the unanswered
  requests with their idempotency keys creates no duplicates;
* the state rebuilt from the database satisfies every core invariant and equals what the
  restarted broker serves.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from brokerkit import COMMIT_MODE, call, free_port, static_tokens
from brokerpolicies import crash
from pgserver import postgres  # noqa: F401  (fixture)
from sqlalchemy import func, select
from test_core_invariants import check_state

from jupyter_gpushare.broker.store.db import grants_table, make_engine, requests_table
from jupyter_gpushare.broker.store.serial import row_to_grant
from jupyter_gpushare.core.state import ClusterState

pytestmark = pytest.mark.slow
TESTS = Path(__file__).resolve().parent
CLIENTS = 200


def start(db_url: str, port: int, tokens_file: Path, log: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    env["PYTHONPATH"] = f"{TESTS}{os.pathsep}{env.get('PYTHONPATH', '')}"
    cmd = [
        sys.executable,
        "-m",
        "jupyter_gpushare.broker",
        "--BrokerApp.policy_factory=brokerpolicies:crash",
        f"--BrokerApp.db_url={db_url}",
        f"--BrokerApp.port={port}",
        "--BrokerApp.ip=127.0.0.1",
        "--BrokerApp.use_hub=False",
        "--BrokerApp.reconcile_on_start=False",
        "--BrokerApp.reconcile_interval_s=0",
        "--BrokerApp.authenticator_class=jupyter_gpushare.broker.api.auth.StaticTokenAuthenticator",
        f"--StaticTokenAuthenticator.tokens_file={tokens_file}",
        f"--BrokerApp.commit_mode={COMMIT_MODE}",
    ]
    return subprocess.Popen(cmd, stdout=log.open("ab"), stderr=subprocess.STDOUT, env=env)


async def wait_ready(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 30
    while True:
        assert proc.poll() is None, log.read_text()[-3000:]
        try:
            status, body = await call(url, "GET", "/health")
            if status == 200:
                return
        except ConnectionError:
            pass
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        await asyncio.sleep(0.1)


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/crash.sqlite"
    return str(request.getfixturevalue("postgres").new_database("crash"))


async def check_overdue_preemptions(
    url: str, db_url: str, live: set[str], overdue: set[str], restarted_at: float
) -> None:
    """The restarted broker equals its database, which differs from the crash-time live set
    only by overdue preemptions carried out after the restart and the grants they freed."""
    deadline = time.monotonic() + 10
    while True:
        _, first = await call(url, "GET", "/grants", "tok-admin")
        engine = make_engine(db_url)
        with engine.connect() as conn:
            rows = {r.id: r for r in conn.execute(select(grants_table))}
        engine.dispose()
        _, second = await call(url, "GET", "/grants", "tok-admin")
        listed = {g["id"] for g in first["grants"]}
        now_live = {gid for gid, r in rows.items() if r.released_at is None}
        if listed == now_live == {g["id"] for g in second["grants"]}:
            break
        assert time.monotonic() < deadline, "broker and database do not settle"
        await asyncio.sleep(0.2)
    for gid in live - now_live:
        assert gid in overdue, f"grant {gid} lost on restart"
        assert (rows[gid].release_reason or "").startswith("preempted")
        assert rows[gid].released_at >= restarted_at
    for gid in now_live - live:
        assert gid in rows and rows[gid].granted_at >= restarted_at, f"{gid} appeared"


async def test_kill_9_during_a_burst_loses_and_duplicates_nothing(
    db_url: str, tmp_path: Path
) -> None:
    tokens_file = tmp_path / "tokens.json"
    tokens_file.write_text(json.dumps(static_tokens({})))
    port = free_port()
    url = f"http://127.0.0.1:{port}/services/gpushare/api/v1"
    log = tmp_path / "broker.log"
    proc = start(db_url, port, tokens_file, log)
    await wait_ready(url, proc, log)

    granted: dict[str, str] = {}  # idempotency key -> grant id (answered granted)
    released: set[str] = set()  # grant ids whose release was acknowledged
    answered: dict[str, str] = {}  # idempotency key -> request id
    sent: dict[str, dict[str, Any]] = {}
    count = {"answers": 0}
    kill_after = 400
    rng = random.Random(7)

    def body(key: str, i: int) -> dict[str, Any]:
        team = f"t{i % 8}"
        if rng.random() < 0.5:
            ask: dict[str, Any] = {"pool": "train", "gpu": {"count": rng.choice([1, 1, 2])}}
        else:
            ask = {"pool": "shared", "gpu": {"fraction": rng.choice([0.125, 0.25, 0.5])}}
        kind = rng.choice(["interactive", "batch"])
        return {
            **ask,
            "user": f"u{i}",
            "server": key,
            "groups": [team],
            "kind": kind,
            "idempotency_key": key,
            "priority": "training" if kind == "batch" else "interactive",
        }

    async def client(c: int) -> None:
        n = 0
        while proc.poll() is None:
            key = f"c{c}-{n}"
            n += 1
            sent[key] = body(key, c)
            try:
                status, ans = await call(url, "POST", "/requests", "tok-spawner", sent[key])
            except ConnectionError:
                return
            count["answers"] += 1
            if count["answers"] >= kill_after and proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
            answered[key] = ans["request_id"]
            if ans["status"] == "granted":
                granted[key] = ans["grant"]["id"]
                if rng.random() < 0.4:
                    try:
                        status, rel = await call(
                            url, "DELETE", f"/grants/{ans['grant']['id']}", "tok-spawner"
                        )
                    except ConnectionError:
                        return
                    if status == 200:
                        released.add(ans["grant"]["id"])

    await asyncio.wait_for(asyncio.gather(*(client(c) for c in range(CLIENTS))), 120)
    proc.wait(10)
    assert proc.returncode == -signal.SIGKILL
    assert len(granted) > 50, "the burst should have granted many requests"

    # -- the database alone ------------------------------------------------------------------
    engine = make_engine(db_url)
    with engine.connect() as conn:
        live_rows = list(
            conn.execute(select(grants_table).where(grants_table.c.released_at.is_(None)))
        )
        all_grants = {r.id: r for r in conn.execute(select(grants_table))}
        dup_req = conn.execute(
            select(grants_table.c.request_id)
            .group_by(grants_table.c.request_id)
            .having(func.count() > 1)
        ).all()
        dup_key = conn.execute(
            select(requests_table.c.idempotency_key)
            .group_by(requests_table.c.username, requests_table.c.idempotency_key)
            .having(func.count() > 1)
        ).all()
    engine.dispose()
    assert dup_req == [] and dup_key == []
    live = {r.id for r in live_rows}
    for key, gid in granted.items():
        assert gid in all_grants, f"granted answer for {key} lost"
        if gid in released:
            assert gid not in live, f"acknowledged release of {gid} lost"
    for gid in set(granted.values()) - released:
        # answered granted, never released by us: only an unacknowledged release or a
        # preemption (1 s grace periods here) may have ended it
        reason = all_grants[gid].release_reason or ""
        assert gid in live or reason == "released by holder" or reason.startswith("preempted")
    rebuilt = ClusterState(crash(), [row_to_grant(r) for r in live_rows])
    check_state(rebuilt)

    # preemptions planned before the kill: their 1 s deadlines pass while the broker is down,
    # so the restarted broker carries them out at once (victims leave, waiters are granted)
    overdue = {r.id for r in live_rows if r.preempt_for}
    restarted_at = time.time()

    # -- restart and compare -----------------------------------------------------------------
    proc = start(db_url, port, tokens_file, log)
    try:
        await wait_ready(url, proc, log)
        status, listed = await call(url, "GET", "/grants", "tok-admin")
        if not overdue:
            assert {g["id"] for g in listed["grants"]} == live
        else:
            await check_overdue_preemptions(url, db_url, live, overdue, restarted_at)
        # retry everything that was sent: answered keys give back the same request
        for key, b in list(sent.items())[:300]:
            status, ans = await call(url, "POST", "/requests", "tok-spawner", b)
            if key in answered:
                assert ans["request_id"] == answered[key]
        engine = make_engine(db_url)
        with engine.connect() as conn:
            dup_req = conn.execute(
                select(grants_table.c.request_id)
                .group_by(grants_table.c.request_id)
                .having(func.count() > 1)
            ).all()
            live_rows = list(
                conn.execute(select(grants_table).where(grants_table.c.released_at.is_(None)))
            )
        engine.dispose()
        assert dup_req == []
        check_state(ClusterState(crash(), [row_to_grant(r) for r in live_rows]))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(10)
