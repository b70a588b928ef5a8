"""``POST /jobs`` with an ``idempotency_key``: a submission sent again finds its job.

The lab's server sends a key with every submission and sends it again when the broker
died before answering (the soak's broker kill during a submit). Checked on an in-process
broker with the inert backend of test_trust_submit: the same key gives the same job (200,
one row, one request, one grant), across a broker restart on the same database too; another
key or another user makes a new job; a bad key is refused naming the field and stores nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from brokerkit import call
from sqlalchemy import func, select
from test_trust_submit import _start, assert_nothing_stored, submit

from jupyter_gpushare.broker.store.db import jobs_table, requests_table


def count(app: Any, table: Any) -> int:
    with app.engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(table)).scalar_one())


async def test_the_same_key_gives_the_same_job_across_a_restart(tmp_path: Path) -> None:
    app = await _start(tmp_path)
    try:
        status, first = await submit(app, idempotency_key="lab-1")
        assert status == 201, first
        again_status, again = await submit(app, idempotency_key="lab-1")
        assert again_status == 200 and again["id"] == first["id"]
        assert count(app, jobs_table) == 1 and count(app, requests_table) == 1
        assert len(app.broker.state.grants) == 1
        other_status, other = await submit(app, idempotency_key="lab-2")
        assert other_status == 201 and other["id"] != first["id"]
        # the same key from another user is theirs, not bob's job
        alice_status, alice = await submit(
            app, token="tok-alice", profile="debug-quarter", idempotency_key="lab-1"
        )
        assert alice_status == 201 and alice["id"] != first["id"], alice
    finally:
        await app.stop_async()
    # the broker that answered is gone; its successor on the same database finds the job
    app = await _start_again(tmp_path)
    try:
        status, found = await submit(app, idempotency_key="lab-1")
        assert status == 200 and found["id"] == first["id"]
        assert count(app, jobs_table) == 3  # bob's lab-1 and lab-2, alice's lab-1: none new
    finally:
        await app.stop_async()


async def _start_again(tmp_path: Path) -> Any:
    """A new broker on the same database and folders (the homes exist already)."""
    import shutil

    shutil.rmtree(tmp_path / "home")
    return await _start(tmp_path)


@pytest.mark.parametrize("key", ["", "x" * 256, "tab\there", "ünï", 7])
async def test_a_bad_key_is_refused_naming_the_field(tmp_path: Path, key: Any) -> None:
    app = await _start(tmp_path)
    try:
        status, body = await submit(app, idempotency_key=key)
        assert status == 400 and body["field"] == "idempotency_key", body
        await assert_nothing_stored(app)
    finally:
        await app.stop_async()


async def test_without_a_key_each_submission_is_a_job(tmp_path: Path) -> None:
    app = await _start(tmp_path)
    try:
        ids = {(await submit(app))[1]["id"] for _ in range(2)}
        assert len(ids) == 2
        status, listing = await call(app, "GET", "/jobs?all=1", "tok-admin")
        assert status == 200 and len(listing["jobs"]) == 2
    finally:
        await app.stop_async()
