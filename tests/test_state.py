"""ClusterState: its change log (which placement indices follow) and its capacity checks."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from corefactory import policy, request
from test_core_invariants import _snapshot, recount

from jupyter_gpushare.core.admission import decide
from jupyter_gpushare.core.model import GPUSlice, Grant, Placement, SharingMode
from jupyter_gpushare.core.placement import _best_fit_scan, place
from jupyter_gpushare.core.state import CapacityError, ClusterState


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


# -- apply refuses grants that over-commit (made by hand: placement never proposes them) ------


def _hand_grant(gid: str, pool: str, node: str, slices: list[tuple[str, int, int]],
                whole: int = 0, fraction: float = 0.0) -> Grant:
    req = request("a", pool, whole=whole, fraction=fraction)
    placement = Placement(node, tuple(GPUSlice(u, mib, c) for u, mib, c in slices))
    return Grant(gid, req, placement, req.gpu.units_milli, False, 500, False, 0.0)


def _shared_state() -> ClusterState:
    # 81920 MiB cards, 20 % headroom: 65536 MiB shareable per card
    return ClusterState(policy({"a": {"shared": (4, 0), "train": (4, 0)}},
                               {"shared": SharingMode.SHARED, "train": SharingMode.EXCLUSIVE}))


def _refused(state: ClusterState, grant: Grant, words: str) -> None:
    before = _snapshot(state)
    with pytest.raises(CapacityError, match=words):
        state.apply(grant)
    assert _snapshot(state) == before, "a refused grant changed the state"
    recount(state)


def test_apply_refuses_a_second_share_that_overfills_a_gpus_memory() -> None:
    state = _shared_state()
    gpu = "GPU-shared-n0-0"
    state.apply(_hand_grant("g1", "shared", "shared-n0", [(gpu, 40000, 100)], fraction=0.1))
    # compute is plenty (100 + 100 of 1000): only the memory check can refuse this one
    _refused(state, _hand_grant("g2", "shared", "shared-n0", [(gpu, 30000, 100)],
                                fraction=0.1), "MiB")
    # what still fits is accepted, up to the shareable memory exactly
    state.apply(_hand_grant("g3", "shared", "shared-n0", [(gpu, 65536 - 40000, 100)],
                            fraction=0.1))
    recount(state)
    _refused(state, _hand_grant("g4", "shared", "shared-n0", [(gpu, 1, 1)], fraction=0.001),
             "MiB")


def test_apply_refuses_a_share_beyond_the_gpus_compute() -> None:
    state = _shared_state()
    gpu = "GPU-shared-n0-1"
    state.apply(_hand_grant("g1", "shared", "shared-n0", [(gpu, 1000, 600)], fraction=0.6))
    # memory is plenty (2000 of 65536 MiB): only the compute check can refuse this one
    _refused(state, _hand_grant("g2", "shared", "shared-n0", [(gpu, 1000, 500)],
                                fraction=0.5), "compute")
    state.apply(_hand_grant("g3", "shared", "shared-n0", [(gpu, 1000, 400)], fraction=0.4))
    recount(state)


def test_apply_refuses_a_whole_gpu_that_is_not_idle() -> None:
    state = _shared_state()
    gpu = "GPU-shared-n0-2"
    state.apply(_hand_grant("g1", "shared", "shared-n0", [(gpu, 1000, 10)], fraction=0.01))
    # a whole-GPU grant on a card that already holds a small share
    _refused(state, _hand_grant("g2", "shared", "shared-n0", [(gpu, 81920, 1000)], whole=1),
             "not idle")
    # the same in an exclusive pool: two whole grants on one card
    train = "GPU-train-n0-0"
    state.apply(_hand_grant("t1", "train", "train-n0", [(train, 81920, 1000)], whole=1))
    _refused(state, _hand_grant("t2", "train", "train-n0", [(train, 81920, 1000)], whole=1),
             "not idle")
    _refused(state, _hand_grant("t3", "train", "train-n0",
                                [("GPU-train-n0-1", 81920, 1000), (train, 81920, 1000)],
                                whole=2), "not idle")
    # and a share on a card held whole
    state.apply(_hand_grant("g3", "shared", "shared-n0", [("GPU-shared-n0-3", 81920, 1000)],
                            whole=1))
    _refused(state, _hand_grant("g4", "shared", "shared-n0", [("GPU-shared-n0-3", 1, 1)],
                                fraction=0.001), "MiB")


def test_apply_refuses_node_cpu_and_ram_overcommit_and_malformed_placements() -> None:
    state = _shared_state()
    cpu_hog = replace(request("a", "shared", fraction=0.1), cpu_milli=64001)
    _refused(state, Grant("c1", cpu_hog, Placement("shared-n0", (
        GPUSlice("GPU-shared-n0-0", 100, 100),)), 100, False, 500, False, 0.0), "CPU or RAM")
    _refused(state, _hand_grant("m1", "shared", "shared-n0",
                                [("GPU-shared-n0-0", 100, 100), ("GPU-shared-n0-1", 100, 100)],
                                fraction=0.1), "distinct GPU")
    _refused(state, _hand_grant("m2", "shared", "train-n0", [("GPU-train-n0-0", 100, 100)],
                                fraction=0.1), "pool")
    _refused(state, _hand_grant("m3", "shared", "shared-n0", [("GPU-train-n0-0", 100, 100)],
                                fraction=0.1), "not on node")
    state.apply(_hand_grant("ok", "shared", "shared-n0", [("GPU-shared-n0-0", 100, 100)],
                            fraction=0.1))
    _refused(state, _hand_grant("ok", "shared", "shared-n0", [("GPU-shared-n0-1", 100, 100)],
                                fraction=0.1), "already applied")


def test_recount_sees_an_overcommit_the_counters_do_not() -> None:
    """The invariant check does not trust the state: a grant slipped past ``apply`` (here
    written straight into ``grants``) is found by the recount from the grants."""
    state = _shared_state()
    gpu = "GPU-shared-n0-0"
    state.apply(_hand_grant("g1", "shared", "shared-n0", [(gpu, 40000, 100)], fraction=0.1))
    recount(state)
    state.grants["sneak"] = _hand_grant("sneak", "shared", "shared-n0", [(gpu, 30000, 100)],
                                        fraction=0.1)
    with pytest.raises(AssertionError, match="MiB granted"):
        recount(state)
