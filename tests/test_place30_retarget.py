"""A pool keeps its target while the learned mix of shapes barely moves (issue 29).

A new target drops every memo and short list, and each shape's first scan after it reads
every row that fits: at ``--scale 10`` those were most of the slowest 1 % of decisions.
The workload still republishes at its checkpoints; a pool takes the new target only when
it moved ``RETARGET_MARGIN`` (total variation) or more from the one its table was made for.
"""

from __future__ import annotations

from test_placement import make_request, make_state

import jupyter_gpushare.core.packindex as packindex
import jupyter_gpushare.core.placement as placement_mod
from jupyter_gpushare.core.fragmentation import target_drift
from jupyter_gpushare.core.model import Request
from jupyter_gpushare.core.placement import place

A = (1000, 500, 1, ())
B = (2000, 1000, 2, ())
C = (4000, 250, 1, ("T4",))


def test_drift_is_the_total_variation_between_two_targets() -> None:
    assert target_drift([(A, 0.75), (B, 0.25)], [(B, 0.25), (A, 0.75)]) == 0.0
    assert target_drift([(A, 1.0)], [(B, 1.0)]) == 1.0
    assert target_drift([(A, 0.5), (B, 0.5)], [(A, 1.0)]) == 0.5
    assert abs(target_drift([(A, 0.6), (B, 0.4)], [(A, 0.5), (B, 0.3), (C, 0.2)]) - 0.2) < 1e-12


def _ask(i: int, shape: tuple) -> Request:
    """One request of ``shape`` (learned; its placement is not applied)."""
    cpu, milli, num, models = shape
    kind = "whole" if milli == 1000 else "fraction"
    amount = num if milli == 1000 else milli
    return make_request(i, kind, amount, cpu, 1024, models)


def test_a_pool_keeps_its_target_until_the_learned_mix_moves() -> None:
    state = make_state([(4, "T4", 32000, 262144), (8, "A10", 96000, 262144)] * 3, 0.0)
    pattern = [A, A, A, B]  # at every checkpoint from 4 on, exactly 3:1
    seen = 0
    for _ in range(16):
        for shape in pattern:
            assert place(state, _ask(seen, shape)) is not None
            seen += 1
    idx = placement_mod._index(state)
    pidx = idx.pools["shared"]
    table, version = pidx.table, idx.workload.version
    for _ in range(64):  # crosses the checkpoints at 128 and 256 requests
        for shape in pattern:
            place(state, _ask(seen, shape))
            seen += 1
    assert idx.workload.version == version + 2  # the workload republished twice...
    assert pidx.table is table  # ...and the pool kept its table (the same mix)
    for _ in range(256):  # a new shape, half the requests by the next checkpoint
        place(state, _ask(seen, C))
        seen += 1
    assert idx.workload.version == version + 3
    assert pidx.table is not table
    assert any(shape == C for shape, _ in pidx.table.shapes)


def test_a_small_drift_keeps_the_table_and_a_large_one_does_not() -> None:
    state = make_state([(4, "T4", 32000, 262144)] * 2, 0.0)
    place(state, _ask(0, A))
    pidx = placement_mod._index(state).pools["shared"]
    pidx.workload.counts.update({A: 90, B: 10})  # the table's target: A alone
    assert target_drift(pidx.table.shapes, pidx._target()) > packindex.RETARGET_MARGIN
    assert pidx.retarget() is True
    table = pidx.table
    pidx.workload.counts.update({B: 1})  # 91:11 from 91:10
    assert 0.0 < target_drift(table.shapes, pidx._target()) < packindex.RETARGET_MARGIN
    assert pidx.retarget() is False and pidx.table is table
