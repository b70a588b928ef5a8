"""Cheaper packing decisions that change no decision (issue 29, decision p99 at scale).

* :class:`~jupyter_gpushare.core.fragmentation.FragTable` goes only through the shape groups
  a (GPU model, CPU level) may host (``FragTable.live``), and computes every fragmentation
  and hostable share bit for bit as the loop through every group did (``ReferenceTable``);
* a shape whose short list is every node that fits it (no bound) answers "nothing has
  room" from that list, without a full scan (late in a full cluster most requests of a
  shape that failed fail again); that answer is the full scan's
  (``test_shape_short_lists_answer_what_the_full_scan_would`` checks every decision).
"""

from __future__ import annotations

import bisect
import itertools
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st
from test_placement import grant_for, make_request, make_state, node_st, request_st
from test_placement_scale import _drive

import jupyter_gpushare.core.placement as placement_mod
from jupyter_gpushare.core.fragmentation import FragTable, target_shapes
from jupyter_gpushare.core.packrows import RowTable
from jupyter_gpushare.core.packscan import gradient_floor
from jupyter_gpushare.core.placement import place

shape_st = st.tuples(
    st.sampled_from([0, 1000, 2500, 4000, 8000, 12000]),
    st.sampled_from([0, 50, 125, 250, 333, 500, 1000]),
    st.integers(1, 8),
    st.sampled_from([(), ("T4",), ("V100", "A10"), ("A10",), ("T4", "A10")]),
).map(lambda s: (s[0], s[1], (s[2] if s[1] == 1000 else 1) if s[1] else 0, s[3] if s[1] else ()))


class ReferenceTable(FragTable):
    """The fragmentation table as it was before ``FragTable.live``: every value is summed
    through every shape group, skipping those the node's model or CPU level shuts out."""

    def hostable(self, model: str, level: int, gpus_sorted: tuple[int, ...]) -> float:
        val = 0.0
        n = len(gpus_sorted)
        for milli, num, models, row in self._groups:
            p = row[level]
            if p == 0.0 or (models and model not in models):
                continue
            if n - bisect.bisect_left(gpus_sorted, milli) >= num:
                val += p
        return val

    def _compute(self, model: str, level: int, gpus: tuple[int, ...]) -> float:
        total = sum(gpus)
        if total == 0:
            return 0.0
        usable = 0.0
        n = len(gpus)
        below = [0, *itertools.accumulate(gpus)]
        for milli, num, models, row in self._groups:
            p = row[level]
            if p == 0.0 or (models and model not in models):
                continue
            k = bisect.bisect_left(gpus, milli)
            if n - k >= num:
                usable += p * (total - below[k])
        return total - usable


@settings(max_examples=150, deadline=None)
@given(
    st.dictionaries(shape_st, st.integers(1, 50), min_size=1, max_size=24),
    st.lists(
        st.tuples(
            st.sampled_from(["T4", "V100", "A10", "P100", "A10|T4"]),
            st.integers(0, 16000),
            st.lists(st.integers(0, 1000), max_size=8),
        ),
        max_size=30,
    ),
)
def test_the_table_computes_exactly_what_the_loop_through_every_group_did(
    counts: dict, nodes: list
) -> None:
    shapes = target_shapes(Counter(counts))
    reference, table = ReferenceTable(shapes), FragTable(shapes)
    for model, cpu_free, free in nodes:
        gpus = tuple(sorted(free))
        level = reference.level(cpu_free)
        # ==, not approximately: the ranking rounds these to steps, so a last bit matters
        assert table.frag(model, level, gpus) == reference.frag(model, level, gpus)
        assert table.hostable(model, level, gpus) == reference.hostable(model, level, gpus)


def test_a_shape_that_found_no_room_is_refused_again_without_a_full_scan() -> None:
    # two 1-GPU nodes with 8 cores each; the 4-core whole-GPU shape fills both
    state = make_state([(1, "T4", 8000, 262144), (1, "T4", 8000, 262144)], 0.0)
    scans: list[int] = []
    rows_for = RowTable.rows_for

    def counted(self, milli, cpu, heads):  # type: ignore[no-untyped-def]
        scans.append(milli)
        return rows_for(self, milli, cpu, heads)

    RowTable.rows_for = counted  # type: ignore[method-assign]
    try:
        for i in range(2):
            request = make_request(i, "whole", 1, 4000, 1024, ())
            got = place(state, request)
            assert got is not None
            state.apply(grant_for(i, request, got))
        # both GPUs are taken: refused, by a full scan the first time
        refused = make_request(2, "whole", 1, 4000, 1024, ())
        assert place(state, refused) is None
        before = len(scans)
        for i in range(3, 8):  # the same shape again, nothing changed: refused from its list
            # (observe=False: a request counted would soon make a new target, a full scan)
            assert place(state, make_request(i, "whole", 1, 4000, 1024, ()), observe=False) is None
        assert len(scans) == before
        # a release changes a node: rescored from the list, and placed there
        state.release(sorted(state.grants)[0])
        again = place(state, make_request(9, "whole", 1, 4000, 1024, ()), observe=False)
        assert again is not None
        assert len(scans) == before
    finally:
        RowTable.rows_for = rows_for  # type: ignore[method-assign]


def test_a_short_list_that_runs_out_is_refilled_from_its_reserve() -> None:
    """A full scan (but a shape's first after a new target) keeps ``_RESERVE`` times the
    short list's length of its best nodes: as the short list's nodes fill up, the next ones
    come from the reserve, without a full scan, and they are the ones a full scan would
    pick (every decision here: the next node)."""
    import jupyter_gpushare.core.packshort as packshort
    from jupyter_gpushare.core.placement import place_on_node

    state = make_state([(2, "T4", 32000, 262144)] * 6, 0.0)
    for i, name in enumerate(sorted(state.nodes)):  # one GPU of two taken on every node
        request = make_request(100 + i, "whole", 1, 1000, 1024, ())
        state.apply(grant_for(100 + i, request, place_on_node(state.nodes[name], request)))
    scans: list[int] = []
    rows_for = RowTable.rows_for

    def counted(self, milli, cpu, heads, lo=0, hi=-1):  # type: ignore[no-untyped-def]
        scans.append((lo, hi))
        return rows_for(self, milli, cpu, heads, lo, hi)

    short, reserve = packshort._SHORT_LIST, packshort._RESERVE
    packshort._SHORT_LIST = 1  # a list of one node: it runs out at every placement
    packshort._RESERVE = 4  # (a reserve of four lists' worth: four of the six nodes)
    RowTable.rows_for = counted  # type: ignore[method-assign]
    try:
        nodes = []
        for i in range(6):
            request = make_request(i, "whole", 1, 1000, 1024, ())
            got = place(state, request, observe=i == 0)  # (one target: no new one midway)
            assert got is not None
            nodes.append(got.node)
            state.apply(grant_for(i, request, got))
        assert nodes == sorted(state.nodes)  # same nodes, same order: lowest position first
        # the first full scan (a shape's first after a new target) keeps no reserve and
        # ends its list at the node of position 1; the second carries on from there
        # (ShortLists._beyond: positions from 1, then those before it) and keeps 4 nodes:
        # its own pick and the next three come from it; the sixth carries on from 5
        assert scans == [(0, -1), (1, -1), (0, 1), (5, -1), (0, 5)]
    finally:
        RowTable.rows_for = rows_for  # type: ignore[method-assign]
        packshort._SHORT_LIST, packshort._RESERVE = short, reserve


@settings(max_examples=80, deadline=None)
@given(
    st.lists(node_st, min_size=1, max_size=10),
    st.lists(request_st, min_size=1, max_size=60),
    st.lists(
        st.tuples(st.sampled_from([0, 50, 125, 333, 500, 999, 1000]), st.integers(1, 4)),
        min_size=1,
        max_size=6,
    ),
    st.data(),
)
def test_no_gradient_is_below_its_floor(
    node_specs: list, reqs: list, shapes: list, data: st.DataObject
) -> None:
    """A scan skips a row whose ``gradient_floor`` (from the node's fragmentation and
    hostable share by size at its CPU level now and at the one left after) cannot beat
    what it found; that bound, less the scan's rounding margin, is at most the gradient
    computed, for every node, learned target, shape and CPU level the request may leave."""
    import jupyter_gpushare.core.packshort as packshort

    state = make_state(node_specs, data.draw(st.sampled_from([0.0, 0.2])))
    short = packshort._SHORT_LIST
    packshort._SHORT_LIST = 1  # (lists of one: scans prune by the bound in small pools too)
    try:
        _drive(state, reqs, data)
    finally:
        packshort._SHORT_LIST = short
    pidx = placement_mod._index(state).pools["shared"]
    levels = pidx.table.cpu_levels
    for view in pidx.by_pos:
        units = view.sorted_units
        before = pidx.table.level(view.ns.free_cpu)
        now = pidx._floor(view, before)
        for milli, num in shapes:
            num = 0 if milli == 0 else (num if milli == 1000 else 1)
            if num and (len(units) < num or units[-num] < milli):
                continue
            for after in range(before + 1):  # any CPU the request may take
                if after and levels[after - 1] > view.ns.free_cpu:
                    continue
                low = gradient_floor(now, pidx._floor(view, after), units, milli, num, view.total)
                low -= 1e-6 * (1.0 + abs(low))  # (the scan's margin)
                delta = pidx._gradient(view, after, milli, num)[0]
                assert delta >= low, (units, milli, num, before, after, delta, low)
        # the bounds the scans memoised (per shape and node state) hold under this target
        stride = len(levels) + 1
        for (milli, num), memo in pidx._by_shape.items():
            for after in range(before + 1):
                key = view.sig * stride * stride + before * stride + after
                if ~key in memo:
                    delta = pidx._gradient(view, after, milli, num)[0]
                    assert delta >= memo[~key][0], (units, milli, num, before, after)
