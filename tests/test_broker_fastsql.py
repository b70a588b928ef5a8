"""The raw driver path of the broker's hot writes (``fastsql``) against the SQLAlchemy path.

The same sequence of changes (grant, refuse, queue, preempt, release, queue drain) runs on
one broker with ``raw_sql=True`` and one with ``raw_sql=False``; the rows they leave in the
database must be the same, column by column (ids and clocks aside), on SQLite and on a real
PostgreSQL. Failed writes must leave neither the database nor the in-memory state changed.
"""

from __future__ import annotations

import dataclasses
import sqlite3
from typing import Any

import pytest
from brokerpolicies import small
from corefactory import request
from pgserver import postgres  # noqa: F401  (fixture)
from sqlalchemy import select

from jupyter_gpushare.broker.service.broker import Broker
from jupyter_gpushare.broker.store import fastsql
from jupyter_gpushare.broker.store.db import grants_table, make_engine, requests_table
from jupyter_gpushare.core.model import Kind

_counter = iter(range(10**6))


@pytest.fixture(params=["sqlite", "postgresql"])
def db_urls(request: pytest.FixtureRequest, tmp_path: Any) -> tuple[str, str]:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/raw.sqlite", f"sqlite:///{tmp_path}/orm.sqlite"
    pg = request.getfixturevalue("postgres")
    n = next(_counter)
    return str(pg.new_database(f"raw{n}")), str(pg.new_database(f"orm{n}"))


def req(team: str, pool: str, user: str, rid: str, **kw: Any) -> Any:
    """A core request with a fixed id and holder (the factory numbers them globally)."""
    return dataclasses.replace(request(team, pool, user=user, **kw), id=rid, holder=f"h-{rid}")


def scenario(b: Broker, clock: list[float]) -> None:
    """Grant, refuse, queue, preempt, release and drain (ids made deterministic)."""
    reqs = [
        req("a", "shared", "alice", "r1", fraction=0.25),
        req("b", "train", "bob", "r2", whole=4),  # borrows team a's idle GPUs
        req("a", "train", "carol", "r3", whole=2),  # a's guarantee: preempts bob
        req("zz", "shared", "nobody", "r4", fraction=0.25),  # unknown team: refused
        req("b", "train", "bob", "r5", whole=4, kind=Kind.BATCH, priority="training"),
    ]
    for i, one in enumerate(reqs):
        clock[0] += 1
        b.submit(one, idempotency_key=f"k{i}")
    clock[0] += 5
    for victim in [g for g in list(b.state.grants.values()) if g.id in b.state.preempting]:
        b.release(victim.id, "preempted: test")
    b.retry("r3")
    clock[0] += 1
    for gid in list(b.state.grants):
        b.release(gid)  # releases drain the queue: r5 is granted
    clock[0] += 1
    for gid in list(b.state.grants):
        b.release(gid, "released: end")


def rows(url: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    engine = make_engine(url)
    with engine.connect() as conn:
        grants = [dict(r._mapping) for r in conn.execute(select(grants_table))]
        reqs = [dict(r._mapping) for r in conn.execute(select(requests_table))]
    engine.dispose()
    grant_req = {g["id"]: g["request_id"] for g in grants}
    for g in grants:
        g.pop("id")
        for key in ("spec",):
            g[key] = {k: v for k, v in g[key].items() if k != "created_at"}
    for r in reqs:
        if r["grant_id"] is not None:
            r["grant_id"] = grant_req[r["grant_id"]]  # the request the grant belongs to
    return (
        sorted(grants, key=lambda g: (g["request_id"], g["granted_at"])),
        sorted(reqs, key=lambda r: r["id"]),
    )


def test_raw_and_sqlalchemy_paths_write_the_same_rows(db_urls: tuple[str, str]) -> None:
    results = []
    for url, raw in zip(db_urls, (True, False), strict=True):
        clock = [1_700_000_000.0]
        engine = make_engine(url)
        b = Broker(small(), engine, clock=lambda c=clock: c[0], raw_sql=raw)  # type: ignore[misc]
        assert (b.fast is not None) is raw
        b.load()
        scenario(b, clock)
        assert not b.state.grants and not b.queue and not b.pending
        b.close()
        engine.dispose()
        results.append(rows(url))
    raw_rows, orm_rows = results
    assert raw_rows == orm_rows
    grants, reqs = raw_rows
    assert {r["status"] for r in reqs} >= {"released", "refused"}
    assert any(g["preempt_for"] for g in grants)  # the preemption mark was written
    assert all(g["released_at"] is not None for g in grants)
    # a restart from the raw path's rows rebuilds an equal (empty) state with the ledger
    engine = make_engine(db_urls[0])
    b2 = Broker(small(), engine, clock=lambda: 1_700_000_100.0)
    b2.load()
    assert not b2.state.grants
    assert b2.team_usage("a")["pools"]["train"]["gpu_hours_month"] > 0
    b2.close()
    engine.dispose()


def test_failed_raw_write_changes_nothing(db_urls: tuple[str, str]) -> None:
    engine = make_engine(db_urls[0])
    b = Broker(small(), engine)
    b.load()
    assert b.fast is not None
    b.submit(req("a", "shared", "alice", "dup", fraction=0.25))
    before = dict(b.state.grants)
    with pytest.raises(Exception):  # noqa: B017 - the driver's IntegrityError
        b.submit(req("a", "shared", "alice", "dup", fraction=0.25))
    assert b.state.grants == before
    assert len(b.db_live_grants()) == 1
    # the writer is usable again after the failed transaction
    b.submit(req("a", "shared", "alice", "ok", fraction=0.25))
    assert len(b.db_live_grants()) == 2 == len(b.state.grants)
    b.close()
    engine.dispose()


def test_fast_path_support_and_sqlite_checkpoints(tmp_path: Any) -> None:
    assert not fastsql.supported(make_engine("sqlite://"))
    memory = Broker(small(), make_engine("sqlite://"))
    assert memory.fast is None  # in-memory SQLite keeps the SQLAlchemy path
    memory.load()
    memory.submit(request("a", "shared", fraction=0.25, user="alice"))
    assert len(memory.db_live_grants()) == 1

    path = tmp_path / "wal.sqlite"
    engine = make_engine(f"sqlite:///{path}")
    b = Broker(small(), engine)
    b.load()
    assert b.fast is not None
    for i in range(40):
        b.submit(request("a", "shared", fraction=0.125, user=f"u{i}"))
        for gid in list(b.state.grants):
            b.release(gid)
    assert b.fast._checkpointer is not None and b.fast._checkpointer.is_alive()
    # another process's view (a plain sqlite3 connection) sees every committed row
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT count(*) FROM gpushare_grants").fetchone()[0] == 40
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()
    b.close()
    assert b.fast._checkpointer is None
    engine.dispose()



def _back_to_back(path: Any, restart_bytes: int, cycles: int, by_hand: bool) -> Broker:
    """A broker after ``cycles`` admissions and releases back to back; ``by_hand``: the
    test runs the checkpoint step itself every 20 cycles (the thread sleeps), else the
    checkpoint thread runs every 20 ms."""
    engine = make_engine(f"sqlite:///{path}")
    b = Broker(small(), engine, checkpoint_interval_s=3600 if by_hand else 0.02,
               wal_restart_bytes=restart_bytes)
    b.load()
    assert b.fast is not None
    other = sqlite3.connect(path, timeout=30)
    frame = int(other.execute("PRAGMA page_size").fetchone()[0]) + 24
    for i in range(cycles):
        b.submit(request("a", "shared", fraction=0.125, user=f"u{i}"))
        for gid in list(b.state.grants):
            b.release(gid)
        if by_hand and i % 20 == 19:
            b.fast.checkpoint(other, frame)
    # nothing committed is lost by the restarts
    assert other.execute("SELECT count(*) FROM gpushare_grants").fetchone()[0] == cycles
    live = "SELECT count(*) FROM gpushare_grants WHERE released_at IS NULL"
    assert other.execute(live).fetchone()[0] == 0
    other.close()
    return b


@pytest.mark.parametrize("by_hand", [True, False])
def test_sqlite_wal_starts_over_under_back_to_back_commits(tmp_path: Any, by_hand: bool) -> None:
    # a passive checkpoint alone never lets the WAL start over while commits follow each
    # other without a pause (seeding 100,000 grants left a 5.5 GB WAL, ~70 KiB per cycle
    # here): past the limit the checkpoint step restarts it
    path = tmp_path / "wal.sqlite"
    b = _back_to_back(path, 256 << 10, 1200, by_hand)
    assert b.fast is not None
    size = path.with_name(path.name + "-wal").stat().st_size
    if by_hand:
        # the limit plus what 20 cycles add (~1.4 MiB), never the 80 MiB of all of them
        assert b.fast.wal_restarts >= 10, b.fast.wal_restarts
        assert size < 4 << 20, size
    else:  # the thread competes with the writer for the GIL: restarts, fewer
        assert b.fast.wal_restarts >= 1
    b.close()
    b.engine.dispose()
