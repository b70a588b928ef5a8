"""Fewer objects per decision (issue 29): an untouched node's row is made once and kept.

The kept row must stay the row of the node as it stands: a node used and freed again, or
a signature table made again (its numbers change), gets a fresh one.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from test_placement import grant_for, make_request, make_state, node_st, request_st

from jupyter_gpushare.core import packindex
from jupyter_gpushare.core.packrows import head_row, row_of
from jupyter_gpushare.core.placement import _index, place


def _heads_are_current(state) -> None:  # type: ignore[no-untyped-def]
    pidx = _index(state).pools["shared"]
    for view in pidx._kind_heads():
        assert head_row(view) == row_of(view)


@settings(max_examples=80, deadline=None)
@given(
    st.lists(node_st, min_size=2, max_size=8),
    st.lists(request_st, min_size=1, max_size=50),
    st.data(),
)
def test_a_kept_head_row_is_the_nodes_row_as_it_stands(
    node_specs: list, reqs: list, data: st.DataObject
) -> None:
    """Red without ``view.head = None`` in ``PoolIndex._reintern``: a head's row would
    carry a signature number the table has since given to another signature."""
    state = make_state(node_specs, 0.0)
    limit = packindex._SIG_LIMIT
    packindex._SIG_LIMIT = 3  # signatures made again every few changes
    try:
        for i, (kind, amount, cpu, ram, models) in enumerate(reqs):
            request = make_request(i, kind, amount, cpu, ram, models)
            got = place(state, request)
            _heads_are_current(state)
            if got is not None:
                state.apply(grant_for(i, request, got))
            if state.grants and data.draw(st.integers(0, 2)) == 0:
                state.release(data.draw(st.sampled_from(sorted(state.grants))))
        place(state, make_request(len(reqs), "cpu", 0, 0, 0, ()))  # (sync after the last change)
        _heads_are_current(state)
    finally:
        packindex._SIG_LIMIT = limit
