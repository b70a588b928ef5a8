"""A refusal's cause from the kept tables (``why_nothing_fits``) says exactly what one pass over
the pool says (``why_by_scan``), through grants, releases and cordons in any order.

The tables exist because the pass cost ~35 ms per refusal on a pool ten times the Alibaba
cluster (``benchmarks/placement_broker.py --scale 10``): they read only the nodes changed since
they were last asked. What could go wrong is a figure kept stale: a sum not moved, a largest
value whose node changed, a node left among the hosts sorted by free CPU. Each is caught here
by comparing the words after every step of random histories.
"""

from __future__ import annotations

import random

import pytest

from jupyter_gpushare.core import placement_why
from jupyter_gpushare.core.model import (
    GPU,
    GPUAsk,
    Grant,
    Node,
    Policy,
    Pool,
    PriorityClass,
    Request,
    SharingMode,
    Team,
)
from jupyter_gpushare.core.placement import place
from jupyter_gpushare.core.placement_why import why_by_scan, why_nothing_fits
from jupyter_gpushare.core.state import ClusterState

MODELS = ("A100", "V100", "T4")


def cluster(rng: random.Random) -> ClusterState:
    nodes = []
    for pool, n in (("shared", 7), ("train", 5)):
        for i in range(n):
            model = rng.choice(MODELS)
            gpus = tuple(
                GPU(f"{pool}{i}/gpu{k}", model, rng.choice([16000, 32000]), index=k)
                for k in range(rng.choice([1, 2, 4, 8]))
            )
            cpu, mem = rng.choice([8000, 16000, 32000]), rng.choice([32000, 64000])
            nodes.append(Node(f"{pool}{i}", pool, gpus, cpu, mem))
    policy = Policy(
        nodes=tuple(nodes),
        pools=(Pool("shared", SharingMode.SHARED), Pool("train", SharingMode.EXCLUSIVE)),
        priority_classes=(PriorityClass("p", 1, False),),
        teams=(Team("t", ("t",)),),
    )
    return ClusterState(policy)


def ask(rng: random.Random, n: int) -> Request:
    pool = rng.choice(["shared", "train"])
    kind = rng.random()
    if kind < 0.15:
        gpu = GPUAsk()
    elif kind < 0.5 or pool == "train":
        gpu = GPUAsk(whole=rng.choice([1, 1, 2, 4, 8]))
    elif kind < 0.9:
        gpu = GPUAsk(fraction_milli=rng.choice([100, 250, 500, 750]))
    else:  # explicit memory and compute
        gpu = GPUAsk(fraction_milli=250, memory_mib=rng.choice([3000, 9000]),
                     compute_milli=rng.choice([100, 600]))
    models = () if rng.random() < 0.6 else tuple(rng.sample(MODELS, rng.choice([1, 2])))
    return Request(
        id=f"r{n}", user=f"u{n}", team="t", pool=pool, gpu=gpu, priority="p",
        cpu_milli=rng.choice([0, 1000, 4000, 8000, 12000]),
        memory_mib=rng.choice([0, 4000, 16000, 40000]),
        gpu_models=models, holder=f"h{n}",
    )


def change(state: ClusterState, rng: random.Random, n: int) -> None:
    """One random grant, release or cordon."""
    roll = rng.random()
    if roll < 0.55:
        req = ask(rng, n)
        placement = place(state, req)
        if placement is not None:
            state.apply(Grant(f"g{n}", req, placement, req.gpu.units_milli, False, 1,
                              False, 0.0))
    elif roll < 0.85 and state.grants:
        state.release(rng.choice(sorted(state.grants)))
    else:
        name = rng.choice(sorted(state.nodes))
        state.cordon(name, not state.nodes[name].cordoned)


def history(seed: int, steps: int, log_limit: int | None = None) -> int:
    """Random grants, releases and cordons; after each, a few refusals' words compared.
    Returns how many were compared."""
    rng = random.Random(seed)
    state = cluster(rng)
    if log_limit is not None:
        state.LOG_LIMIT = log_limit  # type: ignore[misc] - a short log: tables read again whole
    compared = 0
    for n in range(steps):
        change(state, rng, n)
        for _ in range(3):
            req = ask(rng, n)
            assert why_nothing_fits(state, req) == why_by_scan(state, req), (seed, n, req)
            compared += 1
    return compared


@pytest.mark.parametrize("seed", range(30))
def test_the_tables_say_what_a_pass_over_the_pool_says(seed: int) -> None:
    assert history(seed, 120) == 360


@pytest.mark.parametrize("seed", range(5))
def test_a_table_behind_a_short_change_log_is_read_again_whole(seed: int) -> None:
    history(100 + seed, 150, log_limit=4)


def test_more_asks_than_tables_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(placement_why, "KEEP_NODE_PARTS", 14)  # two tables of 7 nodes at most
    history(200, 150)


def test_the_cause_read_from_a_table_follows_the_state() -> None:
    """By hand: the largest idle node changes, is cordoned, and the hosts' free CPU moves."""
    rng = random.Random(7)
    state = cluster(rng)
    req = Request("r", "u", "t", "train", GPUAsk(whole=8), "p", holder="h")
    for _ in range(60):
        first = why_nothing_fits(state, req)
        assert first == why_by_scan(state, req)
        name = rng.choice([ns.node.name for ns in state.by_pool["train"]])
        state.cordon(name, not state.nodes[name].cordoned)


@pytest.mark.parametrize("seed", range(10))
def test_fragmented_memory_and_taken_compute_name_the_same_card(seed: int) -> None:
    """Fractions only, so that cards are partly full: the card with the most free memory
    (the first such card), and the most free compute, as a pass finds them."""
    rng = random.Random(300 + seed)
    state = cluster(rng)
    said = set()
    for n in range(200):
        req = Request(
            f"r{n}", f"u{n}", "t", "shared",
            GPUAsk(fraction_milli=rng.choice([250, 500]), compute_milli=rng.choice([None, 600])),
            "p", holder=f"h{n}",
        )
        placement = place(state, req)
        if placement is not None and rng.random() < 0.8:
            state.apply(Grant(f"g{n}", req, placement, req.gpu.units_milli, False, 1, False, 0.0))
        elif state.grants:
            state.release(rng.choice(sorted(state.grants)))
        for milli in (500, 750, 1000):
            big = Request(f"b{n}", "b", "t", "shared", GPUAsk(fraction_milli=milli), "p",
                          holder="hb", gpu_models=rng.choice([(), ("A100",), ("T4", "V100")]))
            words = why_nothing_fits(state, big)
            assert words == why_by_scan(state, big), (seed, n, milli)
            said.add(words.split(":")[0])
    assert "memory fragmented across cards" in said, said


def test_a_pinned_ask_reads_only_the_nodes_with_a_card_of_its_models() -> None:
    """A table for an ask pinned to models reads only the nodes with a card of one; the open
    nodes of the rest come from the state's count, so "every node is cordoned" still holds
    when the last node without the models is cordoned."""
    rng = random.Random(11)
    state = cluster(rng)
    nodes = state.by_pool["train"]
    models = tuple(sorted({g.gpu.model for g in nodes[0].gpus}))
    req = Request("r", "u", "t", "train", GPUAsk(whole=8), "p", holder="h", gpu_models=models)
    mine = [ns.node.name for ns in nodes if any(g.gpu.model in models for g in ns.gpus)]
    assert 0 < len(mine) < len(nodes), "the seed gives a pool of mixed models"
    why_nothing_fits(state, req)
    table = placement_why._KEPT[state].tables[
        placement_why.table_key(req, SharingMode.EXCLUSIVE)
    ]
    assert [ns.node.name for ns in table.nodes] == mine
    order = [ns.node.name for ns in nodes]
    rng.shuffle(order)
    for name in order + order:  # every node cordoned, then every one open again
        state.cordon(name, not state.nodes[name].cordoned)
        assert why_nothing_fits(state, req) == why_by_scan(state, req), name
    state.cordon(order[0])
    assert why_nothing_fits(state, req) == why_by_scan(state, req)


def test_the_state_counts_the_open_nodes_of_each_pool() -> None:
    state = cluster(random.Random(3))
    first, second = (ns.node.name for ns in state.by_pool["train"][:2])
    assert state.open_nodes("train") == 5 and state.open_nodes("shared") == 7
    state.cordon(first)
    state.cordon(first)  # cordoned again: counted once
    assert state.open_nodes("train") == 4
    state.cordon(second)
    state.cordon(first, False)
    assert (state.open_nodes("train"), state.open_nodes("shared")) == (4, 7)
    state.cordon(first, False)
    state.cordon(second, False)
    assert state.open_nodes("train") == 5
    assert state.open_nodes("nowhere") == 0


def test_the_node_lists_kept_per_set_of_models_are_bounded() -> None:
    """Requests name the models: each new set makes a node list, and those are bounded (the
    same set in another order is the same list)."""
    state = cluster(random.Random(5))
    for i in range(300):
        req = Request(f"r{i}", "u", "t", "train", GPUAsk(whole=1), "p", holder="h",
                      gpu_models=(f"X{i}", "A100"))
        assert why_nothing_fits(state, req) == why_by_scan(state, req)
        assert len(placement_why._KEPT[state].read) <= 256
    kept = placement_why._KEPT[state]
    kept.read.clear()
    for models in (("T4", "A100"), ("A100", "T4")):
        req = Request("r", "u", "t", "train", GPUAsk(whole=8), "p", holder="h", gpu_models=models)
        why_nothing_fits(state, req)
    assert len(kept.read) == 1
