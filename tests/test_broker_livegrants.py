"""Start-up's bulk reader of live grants (``broker/store/livegrants.py``) against the plain reader.

A broker grants, queues and preempts on a real database (SQLite file, real PostgreSQL); a
second broker loads it: its grants must equal the first broker's and those that the plain
row reader (``serial.grant_reader``, used by ``db_live_grants``) reads back, field by field
and type by type. Rows the joined JSON decode cannot vouch for (an older spec layout, a
damaged value) are read one by one; a row that cannot be read at all is released on start
with its reason, and every other grant survives.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from brokerpolicies import small
from corefactory import request
from pgserver import postgres  # noqa: F401  (fixture)
from sqlalchemy import select

from jupyter_gpushare.broker.service.broker import Broker
from jupyter_gpushare.broker.store import livegrants
from jupyter_gpushare.broker.store.db import grants_table, make_engine, requests_table
from jupyter_gpushare.broker.store.serial import request_to_spec, spec_to_request
from jupyter_gpushare.core.model import GPUAsk, Kind, Request

_counter = iter(range(10**6))


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Any) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/live.sqlite"
    pg = request.getfixturevalue("postgres")
    return str(pg.new_database(f"live{next(_counter)}"))


def populated(db_url: str) -> Broker:
    clock = [1000.0]
    b = Broker(small(), make_engine(db_url), clock=lambda: clock[0])
    b.load()
    reqs = [
        request("a", "shared", user="alice", fraction=0.25, cpu_milli=500, memory_mib=1024),
        request("b", "train", user="bob", whole=4),  # borrows team a's idle GPUs
        request("a", "shared", user="ann", fraction=0.5, checkpointing=True, max_runtime_s=60,
                gpu_models=("A100",), profile="p"),
        request("b", "shared", user="bea", fraction=0.125, kind=Kind.BATCH,
                priority="training"),
        request("a", "train", user="carol", whole=2),  # a's guarantee: preempts bob
    ]
    for one in reqs:
        clock[0] += 1.25
        b.submit(one)
    assert b.state.preempting, "the scenario marks a preemption victim"
    return b


def test_load_reads_what_the_plain_reader_reads(db_url: str) -> None:
    first = populated(db_url)
    second = Broker(small(), make_engine(db_url), clock=first.clock)
    assert second.load() == []
    plain = {g.id: g for g in second.db_live_grants()}
    assert second.state.grants == first.state.grants == plain
    for gid, grant in second.state.grants.items():
        # the same types too (an int where a float was, a list where a tuple was, differ)
        assert dataclasses.astuple(grant) == dataclasses.astuple(plain[gid])
        assert [type(v) for v in vars(grant.request).values()] == [
            type(v) for v in vars(plain[gid].request).values()
        ]
        assert type(grant.request.gpu) is GPUAsk and type(grant.request.kind) is Kind
        assert hash(grant.request) == hash(plain[gid].request)
        assert dataclasses.replace(grant.request, user="z").user == "z"
    assert second.state.preempting == first.state.preempting
    assert second.preempt_info == first.preempt_info
    assert second.state.usage == first.state.usage
    first.close()
    second.close()


def test_damaged_and_older_rows(db_url: str) -> None:
    first = populated(db_url)
    grants = sorted(first.state.grants.values(), key=lambda g: (g.granted_at, g.id))
    bad, older, moved = grants[0], grants[1], grants[2]
    old_spec = request_to_spec(older.request)
    old_spec["created_at"] = int(old_spec["created_at"])  # an int, as JSON may hold one
    moved_spec = dict(request_to_spec(moved.request), id="r-other", extra=1)
    del moved_spec["checkpointing"]  # a key an older version did not write
    with first.engine.begin() as conn:
        conn.execute(
            grants_table.update().where(grants_table.c.id == older.id).values(spec=old_spec)
        )
        # a spec naming another request, with a key more: read one by one, as it is
        conn.execute(
            grants_table.update()
            .where(grants_table.c.id == moved.id)
            .values(spec=moved_spec)
        )
        # a value that is no JSON object: the row cannot be read (raw SQL: JSON type bypassed)
        conn.exec_driver_sql(
            f"UPDATE gpushare_grants SET spec = '[1, 2' WHERE id = '{bad.id}'"
            if conn.dialect.name == "sqlite"
            else f"UPDATE gpushare_grants SET spec = '\"text\"' WHERE id = '{bad.id}'"
        )
    second = Broker(small(), make_engine(db_url), clock=first.clock)
    changes = second.load()
    assert len(changes) == 1 and bad.id in changes[0] and "cannot be read" in changes[0]
    assert second.state.grants == {g.id: g for g in second.db_live_grants()}
    assert set(second.state.grants) == set(first.state.grants) - {bad.id}
    for gid, grant in second.state.grants.items():
        if gid != moved.id:
            assert grant == first.state.grants[gid]
    assert second.state.grants[moved.id].request.id == "r-other"
    assert type(second.state.grants[older.id].request.created_at) is float
    assert second.state.grants[moved.id].request.checkpointing is False
    with second.engine.connect() as conn:
        row = conn.execute(
            select(grants_table.c.released_at, grants_table.c.release_reason).where(
                grants_table.c.id == bad.id
            )
        ).one()
        assert row.released_at is not None and "cannot be read" in row.release_reason
        status = conn.execute(
            select(requests_table.c.status).where(requests_table.c.id == bad.request.id)
        ).scalar_one()
        assert status == "released"
    first.close()
    second.close()


def test_request_of_equals_spec_to_request() -> None:
    reqs = [
        Request("r-1", "ann", "t1", "shared", GPUAsk(fraction_milli=250), "interactive",
                created_at=1.5),
        Request("r-2", "bob", "t2", "train", GPUAsk(whole=2), "batch", kind=Kind.BATCH,
                holder="j-1", profile="big", cpu_milli=4000, memory_mib=8192,
                gpu_models=("A100", "H100"), checkpointing=True, max_runtime_s=3600,
                created_at=2.0),
        Request("r-3", "cy", "t1", "shared",
                GPUAsk(fraction_milli=125, memory_mib=4096, compute_milli=300), "debug"),
    ]
    for req in reqs:
        spec = json.loads(json.dumps(request_to_spec(req)))
        assert livegrants.request_of(dict(spec)) == spec_to_request(dict(spec)) == req
    odd = json.loads(json.dumps(request_to_spec(reqs[0])))
    odd["cpu_milli"] = True  # not an int: the plain path converts it
    assert livegrants.request_of(dict(odd)) == spec_to_request(dict(odd))
    assert type(livegrants.request_of(dict(odd)).cpu_milli) is int
    odd["kind"] = "nonsense"
    with pytest.raises(ValueError):
        livegrants.request_of(odd)


def test_a_joined_decode_that_does_not_add_up_is_not_trusted(tmp_path: Any) -> None:
    """Damaged values that happen to decode, joined, into one object per row (SQLite stores
    any text): the objects do not name their rows' requests, so every row is read alone and
    the three damaged ones are released, not given a neighbour's spec."""
    db_url = f"sqlite:///{tmp_path}/shift.sqlite"
    first = populated(db_url)
    a, b, c = sorted(first.state.grants.values(), key=lambda g: (g.granted_at, g.id))[:3]
    texts = {
        a.id: json.dumps(request_to_spec(a.request)) + "," + json.dumps(request_to_spec(b.request)),
        b.id: '{"x": ["',
        c.id: '"]}',
    }
    with first.engine.begin() as conn:
        for gid, text in texts.items():
            conn.exec_driver_sql("UPDATE gpushare_grants SET spec = ? WHERE id = ?", (text, gid))
    second = Broker(small(), make_engine(db_url), clock=first.clock)
    changes = second.load()
    assert sorted(line.split()[2] for line in changes) == sorted(texts)
    assert set(second.state.grants) == set(first.state.grants) - set(texts)
    first.close()
    second.close()
