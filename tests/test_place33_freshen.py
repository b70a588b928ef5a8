"""Short lists kept up between requests (issue 29): the stalest brought up to date, those
running low carried on past their reserve (:meth:`ShortLists.freshen`, called by
:func:`make_ahead`, the broker's warmer).

In the broker at ten times the Alibaba cluster (cpu-heavy) most granted decisions over
1 ms were a rarely asked shape's list scoring every node changed since it was last used,
or a list that had run out carrying its scan on past its reserve. Done between requests,
the request finds its list up to date and full; the answers stay the full scan's (the
property test of ``test_place32_ahead.py`` draws ``_STALE`` and ``_LOW_WATER`` too).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from test_place32_ahead import _full_scan
from test_placement import grant_for, make_request, make_state

import jupyter_gpushare.core.packshort as packshort
import jupyter_gpushare.core.placement as placement_mod
from jupyter_gpushare.core.placement import make_ahead, place, shape_of


@pytest.fixture
def small_lists() -> Iterator[None]:
    """Lists of two and a reserve of two more (at 12,000 nodes they are 47 and 94)."""
    saved = packshort._SHORT_LIST, packshort._RESERVE
    packshort._SHORT_LIST, packshort._RESERVE = 2, 2
    yield
    packshort._SHORT_LIST, packshort._RESERVE = saved


def _scans_inside_place(ahead: bool) -> tuple[int, int]:
    """(scans of rows begun inside ``place`` after the first requests, answers that were
    not the full scan's) over a stream that fills nodes one after another."""
    state = make_state([(4, "T4", 64000, 262144)] * 40, 0.0)
    if ahead:
        make_ahead(state, 1)
    asks = [make_request(i, "fraction", 600, 1000, 1024, ()) for i in range(2)]
    filler = make_request(99, "whole", 2, 8000, 1024, ())
    scans, wrong = [0], 0
    rows_for = packshort.RowTable.rows_for

    def counted(self, milli, cpu, heads, lo=0, hi=-1):  # type: ignore[no-untyped-def]
        scans[0] += 1
        return rows_for(self, milli, cpu, heads, lo, hi)

    for i in range(120):
        request = asks[0] if i % 4 else filler  # one shape, and whole GPUs between
        before = scans[0]
        packshort.RowTable.rows_for = counted  # type: ignore[method-assign]
        try:
            got = place(state, request)
        finally:
            packshort.RowTable.rows_for = rows_for  # type: ignore[method-assign]
        if i < 8:
            scans[0] = before  # (the first lists of each shape are scans: not counted)
        wrong += got != _full_scan(state, request)
        if got is None:
            break
        state.apply(grant_for(i, request, got))
        if ahead:
            make_ahead(state, 10_000)
    return scans[0], wrong


def test_lists_carried_on_between_requests_leave_no_scan_to_them(small_lists: None) -> None:
    """With every list brought up between requests (``_STALE`` 1: a list's entries run
    out as other shapes fill their nodes, which only bringing it up shows), a list that
    ran low is carried on before its shape is asked again."""
    without, wrong_without = _scans_inside_place(ahead=False)
    saved, packshort._STALE = packshort._STALE, 1
    try:
        with_ahead, wrong_with = _scans_inside_place(ahead=True)
    finally:
        packshort._STALE = saved
    assert wrong_without == wrong_with == 0
    assert without >= 5  # (the lists run out: the stream is made so that they do)
    assert with_ahead == 0


def test_a_stale_list_is_brought_up_to_date_and_an_idle_pool_reads_nothing(
    small_lists: None,
) -> None:
    state = make_state([(4, "T4", 64000, 262144)] * 20, 0.0)
    make_ahead(state, 1)
    rare = make_request(0, "fraction", 300, 1000, 1024, ())
    common = make_request(1, "fraction", 500, 1000, 1024, ())
    for i, request in enumerate([rare] + [common] * 30):
        got = place(state, request)
        assert got is not None
        state.apply(grant_for(i, request, got))
    while make_ahead(state, 10_000):  # the next targets made, the lists brought up
        pass
    for i in range(12):  # (learning nothing: no new target)
        got = place(state, common, observe=False)
        assert got is not None
        state.apply(grant_for(100 + i, common, got))
    pidx = placement_mod._index(state).pools["shared"]
    listed = pidx._cache[shape_of(rare)]
    assert 12 <= pidx.clock - listed.stamp < packshort._STALE
    assert make_ahead(state, 10_000) == 0  # not stale yet, nor low
    saved = packshort._STALE
    packshort._STALE = 8
    try:
        assert make_ahead(state, 10_000) > 0  # 12 refreshes old: brought up to date
        assert listed.stamp == pidx.clock
        assert make_ahead(state, 10_000) == 0  # nothing left to do: the warmer may rest
    finally:
        packshort._STALE = saved
    assert place(state, rare, observe=False) == _full_scan(state, rare)


def test_a_list_carried_on_is_the_full_scans_and_full_again(small_lists: None) -> None:
    """Each list carried on holds, below its bounds, exactly the nodes a scan of every row
    ranks there, and as many as a list keeps (short list and reserve)."""
    state = make_state([(4, "T4", 64000, 262144), (8, "A10", 96000, 262144)] * 40, 0.0)
    make_ahead(state, 1)
    shapes = [make_request(0, "fraction", m, 500, 1024, ()) for m in (300, 600)]
    shapes.append(make_request(0, "whole", 2, 1000, 1024, ()))
    for i in range(240):
        request = shapes[i % 3] if i % 5 else shapes[(i // 5) % 3]
        got = place(state, request)
        if got is not None:
            state.apply(grant_for(i, request, got))
        if i % 3 == 2:  # (releases leave many nodes part used)
            state.release(sorted(state.grants)[i % len(state.grants)])
    while make_ahead(state, 10_000):
        pass
    for i in range(8):  # nodes on the lists taken (learning nothing: no new target)
        request = shapes[i % 2]
        got = place(state, request, observe=False)
        if got is not None:
            state.apply(grant_for(1000 + i, request, got))
    pidx = placement_mod._index(state).pools["shared"]
    bounded = [r for r in shapes if pidx._cache[shape_of(r)].rbound < float("inf")]
    assert bounded  # (a list with no bound holds every node that fits: none to carry on)
    saved = packshort._LOW_WATER
    packshort._LOW_WATER = 3  # (every list with a bound is carried on)
    try:
        assert make_ahead(state, 10_000) > 0
    finally:
        packshort._LOW_WATER = saved
    keep = pidx._short_len()
    for request in bounded:
        shape = shape_of(request)
        listed = pidx._cache[shape]
        assert listed.stamp == pidx.clock
        every: list = []
        rows = pidx.rows.rows_for(shape[1], shape[0], pidx._kind_heads())
        pidx._scan(rows, shape, 0, every, prune=False)
        every.sort()
        assert [e[0] for e in listed.short] == [e[0] for e in every if e[0] < listed.bound]
        held = sorted(listed.short + [e for e, _ in listed.reserve.values()])
        assert [e[0] for e in held] == [e[0] for e in every if e[0] < listed.rbound]
        assert len(held) == min(len(every), keep * packshort._RESERVE)


def test_the_shape_asked_least_recently_is_the_one_dropped() -> None:
    state = make_state([(4, "T4", 64000, 262144)] * 6, 0.0)
    asks = [make_request(i, "fraction", 100 * (i + 1), 500, 1024, ()) for i in range(4)]
    saved = packshort._CACHE_SHAPES
    packshort._CACHE_SHAPES = 3
    try:
        for request in [asks[0], asks[1], asks[2], asks[0], asks[3]]:
            assert place(state, request, observe=False) is not None
    finally:
        packshort._CACHE_SHAPES = saved
    pidx = placement_mod._index(state).pools["shared"]
    assert list(pidx._cache) == [shape_of(asks[i]) for i in (2, 0, 3)]  # (1: least recent)
