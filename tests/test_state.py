"""ClusterState's change log, which placement indices follow."""

from __future__ import annotations

import random

from corefactory import policy, request

from jupyter_gpushare.core.admission import decide
from jupyter_gpushare.core.model import SharingMode
from jupyter_gpushare.core.placement import _best_fit_scan, place
from jupyter_gpushare.core.state import ClusterState


def test_changed_since_names_the_nodes_of_each_change() -> None:
    state = ClusterState(policy({"a": {"train": (8, 0)}}, {"train": SharingMode.EXCLUSIVE},
                                node_count=2))
    v0 = state.version
    g = decide(state, request("a", "train", whole=4), "g1").grant
    assert g is not None
    state.apply(g)
    assert state.changed_since(v0) == {g.placement.node}
    v1 = state.version
    state.cordon("train-n1")
    state.release("g1")
    assert state.changed_since(v1) == {"train-n1", g.placement.node}
    assert state.changed_since(state.version) == set()
    assert state.changed_since(state.version + 1) is None


def test_an_index_that_fell_behind_a_trimmed_log_refreshes_everything() -> None:
    state = ClusterState(policy({"a": {"train": (12, 12)}}, {"train": SharingMode.EXCLUSIVE},
                                node_count=6))
    state.LOG_LIMIT = 4  # type: ignore[misc]
    rng = random.Random(7)
    for step in range(300):
        if state.grants and rng.random() < 0.45:
            state.release(rng.choice(sorted(state.grants)))
            if rng.random() < 0.5:  # several changes between two placements
                continue
        req = request("a", "train", whole=rng.choice([1, 2, 4]))
        assert place(state, req) == _best_fit_scan(state, req)
        decision = decide(state, req, f"g{step}")
        if decision.grant is not None:
            state.apply(decision.grant)
    assert len(state._log) <= 4
