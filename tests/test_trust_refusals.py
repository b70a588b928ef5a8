"""Issue 23, finding 18: a refusal names its actual cause, at the exact boundaries.

"no idle GPU to borrow" was said while 3 GPUs were idle: the true cause was that no node had
4 free together. Each test builds the state by hand (grants placed on named nodes and cards)
and checks the reason one GPU, one MiB or one core either side of the boundary.
"""

from __future__ import annotations

import dataclasses

from corefactory import policy, request

from jupyter_gpushare.core.admission import AdmissionFacts, Outcome, decide
from jupyter_gpushare.core.model import GPUAsk, GPUSlice, Kind, Placement, Request, SharingMode
from jupyter_gpushare.core.state import ClusterState

TRAIN = {"train": SharingMode.EXCLUSIVE}
SHARED = {"shared": SharingMode.SHARED}
CARD = 65536  # shareable MiB of a simulated 80 GiB card with the pool's 20 % headroom


def hold(state: ClusterState, req: Request, gid: str, node: str, cards: list[int],
         mib: int | None = None, compute: int | None = None) -> None:
    """Apply ``req`` as a grant on ``node``'s cards (indices), bypassing placement."""
    decision = decide(state, dataclasses.replace(req, pool=req.pool), gid)
    assert decision.grant is not None, decision.reason
    ns = state.nodes[node]
    slices = tuple(
        GPUSlice(ns.gpus[i].gpu.uuid,
                 mib if mib is not None else req.gpu.memory_on(ns.gpus[i].gpu,
                                                               ns.gpus[i].capacity_mib),
                 compute if compute is not None else req.gpu.compute_on())
        for i in cards
    )
    state.apply(dataclasses.replace(decision.grant, placement=Placement(node, slices)))


def split_train(free_per_node: list[int]) -> ClusterState:
    """Pool train of 4-GPU nodes; team b holds all but ``free_per_node[i]`` GPUs of node i;
    team a has no guarantee and may borrow 8."""
    state = ClusterState(policy({"a": {"train": (0, 8)}, "b": {"train": (12, 0)}}, TRAIN,
                                node_count=len(free_per_node)))
    for i, free in enumerate(free_per_node):
        busy = 4 - free
        if busy:
            hold(state, request("b", "train", whole=busy), f"b{i}", f"train-n{i}",
                 list(range(busy)))
    return state


def test_free_gpus_spread_over_nodes_name_the_largest() -> None:
    state = split_train([2, 2, 3])
    d = decide(state, request("a", "train", whole=4), "g")
    assert d.outcome is Outcome.REFUSED and d.code == "no_capacity"
    assert ("enough free GPUs in total (7) but no node has 4 free together "
            "(largest: 3 on node train-n2)") in d.reason, d.reason
    assert "no idle GPU" not in d.reason
    # one more free GPU on the largest node: exactly 4 together, granted
    assert decide(split_train([2, 2, 4]), request("a", "train", whole=4), "g").outcome \
        is Outcome.GRANTED


def test_fewer_free_than_asked_is_no_free_capacity() -> None:
    d = decide(split_train([1, 1, 1]), request("a", "train", whole=4), "g")
    assert "no free capacity in the pool: 3 of 12 GPUs free, 4 asked" in d.reason, d.reason
    d = decide(split_train([2, 1, 1]), request("a", "train", whole=4), "g")
    assert "enough free GPUs in total (4) but no node has 4 free together" in d.reason, d.reason


def test_inside_the_guarantee_the_cause_comes_before_no_preemption() -> None:
    state = ClusterState(policy({"a": {"train": (4, 0)}, "b": {"train": (8, 0)}}, TRAIN,
                                node_count=3))
    for i in range(3):
        hold(state, request("b", "train", whole=2), f"b{i}", f"train-n{i}", [0, 1])
    d = decide(state, request("a", "train", whole=4, kind=Kind.BATCH, priority="training"), "g")
    assert d.outcome is Outcome.QUEUED and d.code == "no_capacity"
    assert ("no GPU in the pool fits 4 GPUs: enough free GPUs in total (6) but no node has 4 "
            "free together (largest: 2 on node train-n0); nothing may be preempted") in d.reason
    # decided again (a queued retry) the reason is not recomputed, the outcome is the same
    again = decide(state, request("a", "train", whole=4, kind=Kind.BATCH, priority="training"),
                   "g", AdmissionFacts(retry=True))
    assert again.outcome is Outcome.QUEUED and again.code == "no_capacity"


def test_borrow_limit_at_its_boundary_is_the_quota() -> None:
    state = ClusterState(policy({"a": {"train": (1, 2)}, "b": {"train": (1, 0)}}, TRAIN))
    hold(state, request("a", "train", whole=1), "a0", "train-n0", [0])
    over = decide(state, request("a", "train", whole=3), "g")
    assert over.code == "quota" and "would pass its borrow limit of 2" in over.reason
    assert decide(state, request("a", "train", whole=2), "g").outcome is Outcome.GRANTED


def shared_state(used: list[list[float]]) -> ClusterState:
    """Pool shared, one node with len(used) cards; team b holds the fractions listed per card."""
    state = ClusterState(policy({"a": {"shared": (0, 4)}, "b": {"shared": (4, 0)}}, SHARED,
                                gpus=len(used)))
    n = 0
    for card, fractions in enumerate(used):
        for f in fractions:
            hold(state, request("b", "shared", fraction=f, user=f"u{n}"), f"b{n}",
                 "shared-n0", [card])
            n += 1
    return state


def test_memory_fragmented_across_cards() -> None:
    state = shared_state([[0.5, 0.25], [0.5, 0.25]])  # a quarter (16384 MiB) free on each
    d = decide(state, request("a", "shared", fraction=0.5), "g")
    assert d.code == "no_capacity"
    assert ("memory fragmented across cards: 32768 MiB free in total but at most 16384 MiB on "
            "one card") in d.reason and "32768 MiB needed" in d.reason, d.reason
    assert decide(state, request("a", "shared", fraction=0.25), "g").outcome is Outcome.GRANTED


def test_too_little_memory_in_total_is_no_free_capacity() -> None:
    state = shared_state([[0.5, 0.5], [0.5, 0.25]])
    d = decide(state, request("a", "shared", fraction=0.5), "g")
    assert ("no free capacity in the pool: 16384 MiB of GPU memory free in total, 32768 MiB "
            "needed") in d.reason, d.reason


def test_compute_taken_while_memory_is_free() -> None:
    state = ClusterState(policy({"a": {"shared": (0, 1)}, "b": {"shared": (1, 0)}}, SHARED,
                                gpus=1))
    small = Request("s", "b-user", "b", "shared", GPUAsk(fraction_milli=250, memory_mib=1000),
                    "interactive", holder="h")
    for i in range(3):
        hold(state, dataclasses.replace(small, id=f"s{i}", holder=f"h{i}"), f"b{i}",
             "shared-n0", [0], mib=1000, compute=250)
    assert decide(state, request("a", "shared", fraction=0.25), "g").outcome is Outcome.GRANTED
    hold(state, dataclasses.replace(small, id="s3", holder="h3"), "b3", "shared-n0", [0],
         mib=1000, compute=250)
    d = decide(state, request("a", "shared", fraction=0.25), "g")
    assert "compute taken" in d.reason and "at most 0 % of their compute free, 25 % asked" \
        in d.reason, d.reason


def test_node_short_of_cpu_names_the_figures() -> None:
    state = ClusterState(policy({"a": {"train": (4, 0)}}, TRAIN))
    ok = dataclasses.replace(request("a", "train", whole=1), cpu_milli=64000)
    assert decide(state, ok, "g").outcome is Outcome.GRANTED
    d = decide(state, dataclasses.replace(ok, cpu_milli=64001), "g")
    assert ("the 1 node with 1 free GPU lacks CPU (64.001 cores asked, at most 64 free on node "
            "train-n0)") in d.reason, d.reason


def test_no_gpu_of_the_models_asked_and_cordoned_nodes() -> None:
    state = ClusterState(policy({"a": {"train": (4, 0)}}, TRAIN))
    d = decide(state, dataclasses.replace(request("a", "train", whole=1), gpu_models=("A100",)),
               "g")
    assert "no GPU of model A100 in pool train" in d.reason, d.reason
    state.cordon("train-n0")
    d = decide(state, request("a", "train", whole=1), "g")
    assert "every node of pool train is cordoned" in d.reason, d.reason


def test_the_reason_follows_the_state() -> None:
    # the cause is remembered per shape only while the state stays as it is
    state = split_train([1, 1, 3])
    first = decide(state, request("a", "train", whole=4), "g")
    assert "enough free GPUs in total (5)" in first.reason, first.reason
    state.cordon("train-n2")
    again = decide(state, request("a", "train", whole=4), "g")
    assert "no free capacity in the pool: 2 of 8 GPUs free, 4 asked" in again.reason, again.reason
