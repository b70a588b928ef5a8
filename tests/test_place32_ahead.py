"""A pool's next target made ahead (issue 29): its short lists are built between requests,
and it is taken once they are made (:mod:`jupyter_gpushare.core.packnext`).

A new target dropped every list and memo, and each shape's first request after it was a
full scan with cold memos: on cpu-heavy at ``--scale 10`` most of the broker's decisions
over 10 ms left. With :func:`make_ahead` called between requests (the broker's warmer),
the new target waits while its lists are made a window of positions at a time; every
answer is still the full scan's under the target in use, and a list made in windows is
the one a full scan makes.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from test_placement import grant_for, make_request, make_state, node_st, request_st

import jupyter_gpushare.core.packindex as packindex
import jupyter_gpushare.core.packshort as packshort
import jupyter_gpushare.core.placement as placement_mod
from jupyter_gpushare.core.placement import make_ahead, place, shape_of

_FRESH = ("_cache", "_memo", "_by_shape", "_floors")


def _full_scan(state, request):  # type: ignore[no-untyped-def]
    """What a full scan answers under each pool's target in use (no list, no learning),
    every gradient computed afresh (none of the index's memos: a memo made ahead for the
    wrong target or signatures would be read by both sides otherwise)."""
    idx = placement_mod._index(state)
    saved = {name: [getattr(pidx, a) for a in _FRESH] for name, pidx in idx.pools.items()}
    for pidx in idx.pools.values():
        for attr in _FRESH:
            setattr(pidx, attr, {})
    try:
        return place(state, request, observe=False)
    finally:
        for name, pidx in idx.pools.items():
            for attr, value in zip(_FRESH, saved[name], strict=True):
                setattr(pidx, attr, value)


@settings(max_examples=80, deadline=None)
@given(
    st.lists(node_st, min_size=3, max_size=12),
    st.lists(request_st, min_size=1, max_size=80),
    st.data(),
)
def test_answers_stay_the_full_scans_while_the_next_target_is_made_ahead(
    node_specs: list, reqs: list, data: st.DataObject
) -> None:
    short, reserve, sigs = packshort._SHORT_LIST, packshort._RESERVE, packindex._SIG_LIMIT
    stale, low, shapes = packshort._STALE, packshort._LOW_WATER, packshort._CACHE_SHAPES
    packshort._SHORT_LIST = 1  # (lists of one and a short reserve: they run out, and the
    packshort._RESERVE = data.draw(st.sampled_from([1, 2]))  # windows' cuts bite)
    # (lists brought up to date between requests: every one, or the oldest few)
    packshort._STALE = data.draw(st.sampled_from([0, 3, 64]))
    packshort._LOW_WATER = data.draw(st.sampled_from([1, 3]))  # (3: carried on every time)
    packshort._CACHE_SHAPES = data.draw(st.sampled_from([512, 2]))  # (2: lists dropped)
    # (a few signatures: they are made again now and then, a next target waiting or not)
    packindex._SIG_LIMIT = data.draw(st.sampled_from([1 << 20, 6]))
    try:
        state = make_state(node_specs, 0.0)
        pool = data.draw(st.lists(st.sampled_from(reqs), min_size=1, max_size=4))
        for i in range(80):
            if data.draw(st.booleans()):
                make_ahead(state, data.draw(st.integers(1, 12)))  # windows of 1-12 positions
            kind, amount, cpu, ram, models = data.draw(st.sampled_from(pool))
            request = make_request(i, kind, amount, cpu, ram, models)
            got = place(state, request)
            assert got == _full_scan(state, request), i
            if got is not None:
                state.apply(grant_for(i, request, got))
            if state.grants and data.draw(st.integers(0, 3)) == 0:
                state.release(data.draw(st.sampled_from(sorted(state.grants))))
            if data.draw(st.integers(0, 19)) == 0:
                name = data.draw(st.sampled_from(sorted(state.nodes)))
                state.cordon(name, not state.nodes[name].cordoned)
    finally:
        packshort._SHORT_LIST, packshort._RESERVE = short, reserve
        packindex._SIG_LIMIT, packshort._STALE, packshort._LOW_WATER = sigs, stale, low
        packshort._CACHE_SHAPES = shapes


def test_a_new_target_waits_for_its_lists_and_comes_with_them() -> None:
    state = make_state([(4, "T4", 32000, 262144), (8, "A10", 96000, 262144)] * 8, 0.0)
    asks = [make_request(i, "fraction", 250 + 250 * (i % 3), 1000, 1024, ()) for i in range(3)]
    make_ahead(state, 1)  # (nothing to make yet: from now on, new targets wait)
    for i in range(7):  # the checkpoints at 1, 2 and 4 requests publish new targets...
        request = asks[i % 3]
        got = place(state, request)
        assert got is not None
        state.apply(grant_for(100 + i, request, got))
    pidx = placement_mod._index(state).pools["shared"]
    nxt = pidx.next
    assert nxt is not None  # ...the last one waits, with the shapes that have lists to make
    new, shapes = nxt.table, {shape_of(r) for r in asks}
    assert set(nxt.todo) == shapes and new is not pidx.table
    n = len(pidx.by_pos)
    read = [make_ahead(state, 5) for _ in range(3 * n)]
    assert pidx.next is None and pidx.table is new  # taken, once its lists were made
    assert sum(read) == len(shapes) * n  # every position once per shape
    assert set(pidx._cache) == shapes
    scans: list[int] = []
    rows_for = packshort.RowTable.rows_for

    def counted(self, milli, cpu, heads, lo=0, hi=-1):  # type: ignore[no-untyped-def]
        scans.append(milli)
        return rows_for(self, milli, cpu, heads, lo, hi)

    packshort.RowTable.rows_for = counted  # type: ignore[method-assign]
    try:
        for request in asks:  # answered from the lists made ahead: no scan
            assert place(state, request, observe=False) == _full_scan(state, request)
    finally:
        packshort.RowTable.rows_for = rows_for  # type: ignore[method-assign]
    assert scans == [r.gpu.fraction_milli for r in asks]  # (only _full_scan's own)


def test_a_next_target_not_made_in_time_is_taken_at_the_next_one() -> None:
    state = make_state([(4, "T4", 32000, 262144)] * 4, 0.0)
    make_ahead(state, 1)
    ask = make_request(0, "fraction", 500, 1000, 1024, ())
    other = make_request(1, "whole", 1, 1000, 1024, ())
    for request in [ask, other]:  # checkpoints at 1 and 2: new targets (the mix moved)
        place(state, request)
    pidx = placement_mod._index(state).pools["shared"]
    waiting = pidx.next
    assert waiting is not None
    new = waiting.table
    for request in [other, other]:  # the checkpoint at 4: a new target, the waiting one taken
        place(state, request)
    assert pidx.table is new
    assert pidx.next is not None and pidx.next is not waiting
    assert pidx.next.todo == [shape_of(other), shape_of(ask)]  # (its shapes: most asked first)


def test_signatures_made_again_take_the_waiting_target_first() -> None:
    """A waiting target's memos are keyed by node signatures: when the pool makes its
    signatures again (too many interned), it takes the waiting target first, so that
    those memos are dropped with the others rather than read under new numbers."""
    state = make_state([(4, "T4", 32000, 262144)] * 4, 0.0)
    make_ahead(state, 1)
    for request in [
        make_request(0, "fraction", 500, 1000, 1024, ()),
        make_request(1, "whole", 1, 1000, 1024, ()),
    ]:
        place(state, request)
    pidx = placement_mod._index(state).pools["shared"]
    waiting = pidx.next
    assert waiting is not None
    new = waiting.table
    pidx._reintern()
    assert pidx.next is None and pidx.table is new
    assert not pidx._memo and not pidx._by_shape and not pidx._floors
