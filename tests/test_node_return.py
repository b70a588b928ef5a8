"""A node the broker drained because a run was lost with it is resumed once the backend has it
back in service, also after a restart of the broker, and a node an admin drained is not
(``broker/jobs/node_return.py``, the ``broker_drain`` column of ``gpushare_nodes``).

A real in-process broker runs real local jobs; the backend is the local one, told by the
test that a job's node was lost (as Slurm's NODE_FAIL is reported) and when the node is
back. ``tests/test_backend_slurm.py`` does the same on a real Slurm cluster.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import jobnotebooks as nbs
import pytest
from brokerkit import call, start_broker, static_tokens
from sqlalchemy import inspect, select, text
from test_jobs_broker import submit, wait_state
from traitlets.config import Config

from jupyter_gpushare.backends.base import RunHandle, RunStatus
from jupyter_gpushare.backends.local import LocalBackend
from jupyter_gpushare.broker.store.db import (
    make_engine,
    metadata,
    migrate,
    nodes_table,
    schema_table,
)
from jupyter_gpushare.policy import load_policy

POLICY = Path(__file__).resolve().parent / "data" / "jobs_policy.yaml"


class NodeLosingBackend(LocalBackend):
    """The local backend; a job in ``lost`` ends as lost with its node, and the nodes in
    ``back`` are the ones the 'engine' has in service again."""

    lost: dict[str, str] = {}
    back: set[str] = set()
    asked: list[list[str]] = []
    node_return_interval_s = 0.2

    def poll(self, handle: RunHandle) -> RunStatus:
        node = self.lost.get(handle.job_id)
        if node is None:
            return super().poll(handle)
        self.kill(handle)
        return RunStatus(alive=False, finished=False, node_failed=node,
                         error={"summary": f"its node {node} failed"})

    def nodes_in_service(self, nodes: Any) -> set[str]:
        self.asked.append(list(nodes))
        return {n for n in nodes if n in self.back}


async def until(pred: Any, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)


async def lose_a_job(app: Any) -> str:
    status, job = await submit(app, "tok-alice-srv", nbs.sleeping(120))
    assert status == 201, job
    await wait_state(app, "tok-alice", job["id"], {"running"})
    live = app.jobs.store.live[job["id"]]
    node = str(app.broker.state.grants[live.grant_id].placement.node)
    NodeLosingBackend.lost[job["id"]] = node
    done = await wait_state(app, "tok-alice", job["id"], {"failed"})
    assert f"its node {node} failed" in done["reason"], done
    return node


async def start(tmp_path: Path) -> Any:
    """A broker on the test's database file whose jobs run on :class:`NodeLosingBackend`."""
    config = Config()
    config.JobManager.backend_class = NodeLosingBackend
    config.JobManager.jobs_dir = str(tmp_path / "jobs")
    config.JobManager.user_root_template = str(tmp_path / "home" / "{username}")
    config.JobManager.poll_interval_s = 0.05
    (tmp_path / "home" / "alice").mkdir(parents=True, exist_ok=True)
    return await start_broker(load_policy(str(POLICY)), f"sqlite:///{tmp_path}/jobs.sqlite",
                              static_tokens({"alice": ["vision"]}), config=config)


def fresh_backend() -> None:
    NodeLosingBackend.lost.clear()
    NodeLosingBackend.back.clear()
    NodeLosingBackend.asked.clear()


@pytest.mark.slow
async def test_the_broker_resumes_its_own_drain_once_the_node_is_back_never_an_admins(
    tmp_path: Path,
) -> None:
    fresh_backend()
    app = await start(tmp_path)
    try:
        node = await lose_a_job(app)
        assert app.broker.state.nodes[node].cordoned  # drained by the broker
        assert app.jobs.node_return.waiting == [node]
        await until(lambda: len(NodeLosingBackend.asked) >= 3)  # asked, not back yet
        assert app.broker.state.nodes[node].cordoned
        assert NodeLosingBackend.asked[-1] == [node]
        NodeLosingBackend.back.add(node)  # the engine has it in service again
        await until(lambda: not app.broker.state.nodes[node].cordoned)
        assert app.jobs.node_return.waiting == []
        # lost again; an admin drains it by hand meanwhile: it is the admin's now
        NodeLosingBackend.back.clear()
        again = await lose_a_job(app)
        assert again == node and app.broker.state.nodes[node].cordoned
        status, body = await call(app, "POST", f"/admin/nodes/{node}/drain", "tok-admin")
        assert status == 200, body
        NodeLosingBackend.back.add(node)
        asked = len(NodeLosingBackend.asked)
        await until(lambda: app.jobs.node_return.waiting == [])  # forgotten, not resumed
        await asyncio.sleep(0.6)
        assert app.broker.state.nodes[node].cordoned
        assert len(NodeLosingBackend.asked) <= asked + 1  # nothing left to ask about
        # a node an admin drained that no run was lost on is never the broker's to resume
        other = next(n for n in app.broker.state.nodes if n != node)
        status, body = await call(app, "POST", f"/admin/nodes/{other}/drain", "tok-admin")
        assert status == 200, body
        NodeLosingBackend.back.add(other)
        await asyncio.sleep(0.6)
        assert app.broker.state.nodes[other].cordoned and app.jobs.node_return.waiting == []
    finally:
        await app.stop_async()


@pytest.mark.slow
async def test_a_node_the_broker_drained_is_still_its_own_after_a_restart(tmp_path: Path) -> None:
    """The broker's drain is in the database: a new broker on the same file resumes the node
    once the engine has it back; a node an admin drained stays drained."""
    fresh_backend()
    app = await start(tmp_path)
    try:
        node = await lose_a_job(app)
        assert app.jobs.node_return.waiting == [node]
        other = next(n for n in app.broker.state.nodes if n != node)
        status, body = await call(app, "POST", f"/admin/nodes/{other}/drain", "tok-admin")
        assert status == 200, body
    finally:
        await app.stop_async()
    engine = make_engine(f"sqlite:///{tmp_path}/jobs.sqlite")
    with engine.connect() as conn:
        rows = {r.name: r.broker_drain for r in conn.execute(select(nodes_table))}
    engine.dispose()
    assert f"its node {node} failed" in str(rows[node]) and rows[other] is None, rows
    fresh_backend()
    app = await start(tmp_path)  # a new broker, a new job loop, the same database
    try:
        assert app.broker.state.nodes[node].cordoned and app.broker.state.nodes[other].cordoned
        assert app.jobs.node_return.waiting == [node]
        await until(lambda: len(NodeLosingBackend.asked) >= 2)  # asked, not back yet
        assert app.broker.state.nodes[node].cordoned
        NodeLosingBackend.back.update({node, other})  # the engine has both in service again
        await until(lambda: not app.broker.state.nodes[node].cordoned)
        assert app.jobs.node_return.waiting == []
        await asyncio.sleep(0.6)
        assert app.broker.state.nodes[other].cordoned  # the admin's drain stays
        with app.engine.connect() as conn:
            row = conn.execute(select(nodes_table).where(nodes_table.c.name == node)).one()
        assert not row.cordoned and row.broker_drain is None  # resumed: no longer a drain
    finally:
        await app.stop_async()


def test_a_schema_4_database_gets_the_broker_drain_column(tmp_path: Path) -> None:
    """A database from before the column (schema 4) upgrades; its nodes keep their rows."""
    engine = make_engine(f"sqlite:///{tmp_path}/old.sqlite")
    with engine.begin() as conn:
        for table in metadata.sorted_tables:
            if table is not nodes_table:
                table.create(conn)
        conn.execute(text("CREATE TABLE gpushare_nodes (name VARCHAR(255) PRIMARY KEY, "
                          "cordoned BOOLEAN NOT NULL, updated_at FLOAT NOT NULL)"))
        conn.execute(text("INSERT INTO gpushare_nodes VALUES ('train-0', 1, 12.5)"))
        conn.execute(schema_table.insert().values(id=1, version=4))
    assert migrate(engine)[0] == 5  # (then 6, the grant end records)
    with engine.connect() as conn:
        columns = {c["name"] for c in inspect(conn).get_columns("gpushare_nodes")}
        row = conn.execute(select(nodes_table)).one()
    assert "broker_drain" in columns
    assert (row.name, row.cordoned, row.updated_at, row.broker_drain) == (
        "train-0", True, 12.5, None)
    assert migrate(engine) == []  # once
    engine.dispose()
