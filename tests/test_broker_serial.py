"""Grant rows read back into grants: the fast start-up reader agrees with the plain one."""

from __future__ import annotations

import json
from collections import namedtuple
from typing import Any

import pytest

from jupyter_gpushare.broker.store.serial import (
    grant_reader,
    grant_row,
    request_to_spec,
    row_to_grant,
    spec_to_request,
)
from jupyter_gpushare.core.model import GPUAsk, GPUSlice, Grant, Kind, Placement, Request


def requests() -> list[Request]:
    return [
        Request("r-1", "ann", "t1", "shared", GPUAsk(fraction_milli=250), "interactive",
                created_at=1.5),
        Request("r-2", "bob", "t2", "train", GPUAsk(whole=2), "batch", kind=Kind.BATCH,
                holder="j-1", profile="big", cpu_milli=4000, memory_mib=8192,
                gpu_models=("A100", "H100"), checkpointing=True, max_runtime_s=3600,
                created_at=2.0),
        Request("r-3", "cy", "t1", "shared",
                GPUAsk(fraction_milli=125, memory_mib=4096, compute_milli=300), "debug"),
        Request("r-4", "dee", "t3", "cpu", GPUAsk(), "interactive"),
    ]


def as_rows(grants: list[Grant], reverse: bool) -> list[Any]:
    """Database-like rows (JSON columns decoded), in a column order of our choosing."""
    dicts = [json.loads(json.dumps(grant_row(g))) for g in grants]
    names = sorted(dicts[0], reverse=reverse)
    row = namedtuple("row", names)  # type: ignore[misc]  # noqa: PYI024
    return [row(*(d[n] for n in names)) for d in dicts]


def test_spec_round_trip_and_shared_asks() -> None:
    for req in requests():
        spec = json.loads(json.dumps(request_to_spec(req)))
        assert spec_to_request(spec) == req
    a = spec_to_request(request_to_spec(requests()[0]))
    b = spec_to_request(request_to_spec(requests()[0]))
    assert a.gpu is b.gpu  # immutable, so shared by every grant that asks the same


def test_spec_values_keep_their_type_and_bad_kinds_fail() -> None:
    spec = request_to_spec(requests()[2])
    spec["gpu"]["memory_mib"] = 4096.0  # a float the cache must not turn into the int's ask
    assert isinstance(spec_to_request(spec).gpu.memory_mib, float)
    spec["gpu"]["memory_mib"] = [1]  # unhashable: built as it is, as before the cache
    assert spec_to_request(spec).gpu.memory_mib == [1]
    spec["kind"] = "nonsense"
    with pytest.raises(ValueError):
        spec_to_request(spec)


@pytest.mark.parametrize("reverse", [False, True])
def test_grant_reader_reads_what_row_to_grant_reads(reverse: bool) -> None:
    grants = [
        Grant(f"g-{i}", req, Placement(f"n{i}", tuple(
            GPUSlice(f"GPU-{i}-{k}", 1000 * (k + 1), 125) for k in range(max(1, req.gpu.whole))
        ) if req.gpu.whole or req.gpu.fraction_milli else ()), req.gpu.units_milli,
            i % 2 == 0, 10 * i, i % 3 == 0, 100.0 + i, 30 + i)
        for i, req in enumerate(requests())
    ]
    rows = as_rows(grants, reverse)
    read = grant_reader(rows[0]._fields)
    assert [read(r) for r in rows] == grants
    assert [row_to_grant(r) for r in rows] == grants
