"""While PostgreSQL is down, the broker answers 503 (``db_unavailable``, with Retry-After), not
500, and ``/health`` says the database is unavailable; once it is back, the broker rebuilds
its state and takes writes again.

Found by the soak harness (issue 28, ``--db postgresql``, seed 42): after PostgreSQL was
stopped and started, ``POST /requests`` answered 500 with a traceback for each call (a
SQLAlchemy ``OperationalError`` from the idempotency lookup), and ``/health`` said ``ok``
throughout. A PostgreSQL server of this test's own is stopped (``pg_ctl -m fast stop``: the
broker's connections are cut) and started again on the same port.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import time
from typing import Any

import pytest
from brokerkit import call, start_broker, static_tokens
from brokerpolicies import small
from pgserver import PgServer, pg_missing_reason

pytestmark = pytest.mark.slow
USERS = {"alice": ["a"]}


def ask(server: str) -> dict[str, Any]:
    return {"pool": "shared", "server": server, "gpu": {"fraction": 0.25},
            "idempotency_key": f"k-{server}"}


def pg_ctl(pg: PgServer, *args: str) -> None:
    pg._run([os.path.join(pg.bindir, "pg_ctl"), "-D", pg.data, *args])


def pg_start(pg: PgServer) -> None:
    pg_ctl(pg, "-l", os.path.join(pg.dir, "pg.log"), "-w", "-t", "60", "-o",
           f"-p {pg.port} -k {pg.dir} -h 127.0.0.1 -c fsync=off", "start")


@pytest.mark.parametrize("mode", ["thread", "async"])
async def test_while_postgresql_is_down_writes_get_503_and_health_says_so(mode: str) -> None:
    reason = pg_missing_reason()
    if reason:
        pytest.fail(reason)  # .ci/run installs PostgreSQL: its absence is a broken machine
    pg = PgServer()
    app = None
    try:
        app = await start_broker(small(), pg.new_database("down"), static_tokens(USERS),
                                 commit_mode=mode)
        assert (await call(app, "POST", "/requests", "tok-alice", ask("one")))[0] == 201
        assert await call(app, "GET", "/health") == (200, {"status": "ok"})

        pg_ctl(pg, "-m", "fast", "-w", "stop")
        answers = [await call(app, "POST", "/requests", "tok-alice", ask(f"down{i}"))
                   for i in range(3)]
        for status, body in answers:
            assert status == 503, body
            assert body["code"] == "db_unavailable", body
        status, health = await call(app, "GET", "/health")
        assert status == 503 and health["status"] == "database unavailable", health

        pg_start(pg)
        deadline = time.monotonic() + 30
        while (await call(app, "GET", "/health"))[0] != 200:
            assert time.monotonic() < deadline, "the broker did not take writes again"
            await asyncio.sleep(0.2)
        status, body = await call(app, "POST", "/requests", "tok-alice", ask("back"))
        assert status == 201, body
        status, grants = await call(app, "GET", "/grants", "tok-alice")
        assert {g["server"] for g in grants["grants"]} == {"one", "back"}  # none of the 503s
    finally:
        if app is not None:
            await app.stop_async()
        with contextlib.suppress(subprocess.CalledProcessError):  # already stopped
            pg.stop()
