"""The placement's indices that keep a decision's cost flat as the cluster grows.

They must change no decision: each is checked against the plain answer it replaces.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_placement import grant_for, make_request, make_state, node_st, request_st

import jupyter_gpushare.core.packindex as packindex
import jupyter_gpushare.core.packrows as packrows
import jupyter_gpushare.core.packscan as packscan
import jupyter_gpushare.core.packshort as packshort
import jupyter_gpushare.core.placement as placement_mod
from jupyter_gpushare.core.placement import place
from jupyter_gpushare.core.roomtree import RoomTree

op_st = st.one_of(
    st.tuples(st.just("set"), st.integers(0, 40), st.integers(0, 9), st.integers(0, 9)),
    st.tuples(st.just("clear"), st.integers(0, 40), st.just(0), st.just(0)),
    st.tuples(st.just("first"), st.just(0), st.integers(0, 10), st.integers(0, 10)),
)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 41), st.lists(op_st, max_size=80))
def test_room_tree_finds_the_first_position_with_room(n: int, ops: list) -> None:
    tree = RoomTree(n)
    room: dict[int, tuple[int, int]] = {}
    for op, pos, cpu, mem in ops:
        pos %= n
        if op == "set":
            tree.set(pos, cpu, mem)
            room[pos] = (cpu, mem)
        elif op == "clear":
            tree.clear(pos)
            room.pop(pos, None)
        else:
            want = min((p for p, (c, m) in room.items() if c >= cpu and m >= mem), default=None)
            assert tree.first(cpu, mem) == want


@settings(max_examples=40, deadline=None)
@given(
    st.lists(node_st, min_size=2, max_size=10),
    st.lists(request_st, min_size=1, max_size=80),
    st.data(),
)
def test_decisions_do_not_depend_on_how_often_signatures_are_interned_again(
    node_specs: list, reqs: list, data: st.DataObject
) -> None:
    """With a signature table that starts over every few changes, every decision is the
    one made with the default table (through grants, releases and re-targets)."""
    default = make_state(node_specs, 0.0)
    tiny = make_state(node_specs, 0.0)
    limit = packindex._SIG_LIMIT
    try:
        for i, (kind, amount, cpu, ram, models) in enumerate(reqs):
            request = make_request(i, kind, amount, cpu, ram, models)
            packindex._SIG_LIMIT = limit
            want = place(default, request)
            packindex._SIG_LIMIT = 3
            got = place(tiny, request)
            assert got == want
            if got is not None:
                default.apply(grant_for(i, request, got))
                tiny.apply(grant_for(i, request, got))
            if default.grants and data.draw(st.integers(0, 3)) == 0:
                gid = data.draw(st.sampled_from(sorted(default.grants)))
                default.release(gid)
                tiny.release(gid)
    finally:
        packindex._SIG_LIMIT = limit


def test_a_cpu_only_request_takes_the_first_full_node_with_room() -> None:
    """Nodes whose GPUs are all taken host CPU-only work at no fragmentation cost: the
    first one (in pool order) with CPU and RAM left wins, wherever the others stand."""
    state = make_state([(1, "T4", 8000, 16000)] * 5, 0.0)
    for i, name in enumerate(sorted(state.nodes)):
        # every GPU taken; CPU left: 1000, 6000, 1000, 6000, 6000 on n0..n4
        cpu = 7000 if i in (0, 2) else 2000
        request = make_request(100 + i, "whole", 1, cpu, 1000, ())
        got = placement_mod.place_on_node(state.nodes[name], request)
        assert got is not None
        state.apply(grant_for(100 + i, request, got))
    assert place(state, make_request(1, "cpu", 0, 4000, 1000, ())).node == "n1"
    assert place(state, make_request(2, "cpu", 0, 500, 1000, ())).node == "n0"
    assert place(state, make_request(3, "cpu", 0, 7000, 1000, ())) is None


@pytest.mark.parametrize("grow", [1, 3])
def test_retargeting_costs_nothing_per_node(grow: int) -> None:
    """A new target workload re-describes no node (signatures do not depend on it)."""
    state = make_state([(2, "T4", 8000, 16000)] * (10 * grow), 0.0)
    place(state, make_request(0, "fraction", 500, 1000, 1000, ()))
    pidx = placement_mod._index(state).pools["shared"]
    calls = []
    original = pidx._describe
    pidx._describe = lambda view: (calls.append(view), original(view))  # type: ignore[method-assign]
    pidx.retarget()
    assert calls == []


@pytest.mark.parametrize("switch", ["_PRUNE", "_ORDERED"])
@settings(max_examples=60, deadline=None)
@given(
    st.lists(node_st, min_size=2, max_size=16),
    st.lists(request_st, min_size=1, max_size=80),
    st.data(),
)
def test_rows_skipped_by_their_lower_bound_change_no_decision(
    switch: str, node_specs: list, reqs: list, data: st.DataObject
) -> None:
    """Scans skip rows whose gradient's lower bound cannot beat what they have found, and
    full scans stop where no later position can; every decision (short lists of 1 and of
    the default length, through releases) is the one made without that (``_PRUNE`` off:
    a scan that scores every row; ``_ORDERED`` off: no stop on position)."""
    short = packshort._SHORT_LIST
    packshort._SHORT_LIST = data.draw(st.sampled_from([1, 2, short]))
    fresh = data.draw(st.booleans())  # no short lists: every decision a full scan
    pruned = make_state(node_specs, 0.0)
    full = make_state(node_specs, 0.0)
    try:
        for i, (kind, amount, cpu, ram, models) in enumerate(reqs):
            request = make_request(i, kind, amount, cpu, ram, models)
            if fresh:
                for state in (pruned, full):
                    for pidx in placement_mod._index(state).pools.values():
                        pidx._cache.clear()
            setattr(packscan, switch, True)
            got = place(pruned, request)
            setattr(packscan, switch, False)
            want = place(full, request)
            assert got == want
            if got is not None:
                pruned.apply(grant_for(i, request, got))
                full.apply(grant_for(i, request, got))
            if pruned.grants and data.draw(st.integers(0, 3)) == 0:
                gid = data.draw(st.sampled_from(sorted(pruned.grants)))
                pruned.release(gid)
                full.release(gid)
    finally:
        setattr(packscan, switch, True)
        packshort._SHORT_LIST = short


def _drive(state, reqs: list, data: st.DataObject) -> None:  # type: ignore[no-untyped-def]
    """Place ``reqs`` (learning the workload), releasing and cordoning now and then."""
    for i, (kind, amount, cpu, ram, models) in enumerate(reqs):
        request = make_request(i, kind, amount, cpu, ram, models)
        got = place(state, request)
        if got is not None:
            state.apply(grant_for(i, request, got))
        if state.grants and data.draw(st.integers(0, 3)) == 0:
            state.release(data.draw(st.sampled_from(sorted(state.grants))))
        if data.draw(st.integers(0, 14)) == 0:
            name = data.draw(st.sampled_from(sorted(state.nodes)))
            state.cordon(name, not state.nodes[name].cordoned)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(node_st, min_size=1, max_size=10),
    st.lists(request_st, min_size=1, max_size=60),
    st.lists(
        st.tuples(st.sampled_from([0, 50, 125, 333, 500, 1000]), st.integers(1, 4)),
        min_size=1,
        max_size=6,
    ),
    st.data(),
)
def test_no_gradient_is_below_the_least_one(
    node_specs: list, reqs: list, shapes: list, data: st.DataObject
) -> None:
    """Whatever the learned target, placing ``demand`` milli on a node lowers its
    fragmentation by at most ``demand``, and a CPU-only request never lowers it (exactly,
    as computed): the bound on which ordered scans stop."""
    state = make_state(node_specs, data.draw(st.sampled_from([0.0, 0.2])))
    _drive(state, reqs, data)
    pidx = placement_mod._index(state).pools["shared"]
    levels = pidx.table.cpu_levels
    for view in pidx.by_pos:
        units = view.sorted_units
        before = pidx.table.level(view.ns.free_cpu)
        for milli, num in shapes:
            num = 0 if milli == 0 else (num if milli == 1000 else 1)
            if num and (len(units) < num or units[-num] < milli):
                continue
            for after in range(before + 1):  # any CPU the request may take
                if after and levels[after - 1] > view.ns.free_cpu:
                    continue
                delta = pidx._gradient(view, after, milli, num)[0]
                least = packscan.least_gradient(milli * num)
                assert delta >= least, (units, milli, num, before, after)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(node_st, min_size=1, max_size=12),
    st.lists(request_st, min_size=1, max_size=60),
    st.data(),
)
def test_scanned_rows_are_the_nodes_with_room_in_position_order(
    node_specs: list, reqs: list, data: st.DataObject
) -> None:
    """The rows a full scan reads (``RowTable.rows_for``, from bit sets by bucket and by free CPU)
    are, in position order, at least every used, uncordoned node with a GPU big enough and
    the CPU asked for, and the head of each kind of untouched node; and the bit sets are
    those of the nodes as they stand."""
    state = make_state(node_specs, 0.0)
    _drive(state, reqs, data)
    pidx = placement_mod._index(state).pools["shared"]
    rows = pidx.rows
    for view in pidx.by_pos:
        b = rows.bucket_of[view.pos]
        row = rows.row_at[view.pos]
        assert (row is None) == (b < 0)
        if row is not None:
            assert row == packrows.row_of(view)
        for k, bits in enumerate(rows.bits):
            assert bool(bits >> view.pos & 1) == (b == k)
        for k, bits in enumerate(rows.cpu_bits):
            want = b >= 0 and view.ns.free_cpu >= packrows.CPU_STEPS[k]
            assert bool(bits >> view.pos & 1) == want
    for cpu in (0, 999, 4000, 100000):
        for mem in (0, 1024, 100000):
            room = [p for p, row in rows.slivers.items() if row[0] >= cpu and row[1] >= mem]
            assert rows.sliver_room.first(cpu, mem) == min(room, default=None)
    heads = pidx._kind_heads()
    for milli in (0, 50, 100, 250, 999, 1000):
        for cpu in (0, 999, 1000, 4000, 16000, 100000):
            got = [row[8] for row in rows.rows_for(milli, cpu, heads)]
            assert got == sorted(set(got))
            low = min(milli, 1000) // packrows.BUCKET
            need = {
                v.pos for v in pidx.by_pos
                if rows.bucket_of[v.pos] >= low and v.ns.free_cpu >= cpu
            } | {v.pos for v in heads}  # fmt: skip
            assert need <= set(got)
