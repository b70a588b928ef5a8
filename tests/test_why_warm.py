"""The refusal tables made ahead, between requests (``placement_why.warm``): a table made a
slice at a time says what one pass over the pool says, once it has caught up; the work waits
for a pool near full, reads at most its budget, keeps within the tables' memory limit, and a
refusal then reads no node again.

Why it matters: an ask's first refusal made its table on the event loop, a pass over the
whole pool (15-60 ms at ten times the Alibaba cluster, ``benchmarks/placement_broker.py
--scale 10``); the broker now makes it before, in slices (``broker/ops/whywarm.py``).
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator

import pytest
from test_why_table import ask, change, cluster

from jupyter_gpushare.core import placement_why, why_table
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
from jupyter_gpushare.core.placement_why import note_ask, warm, why_by_scan, why_nothing_fits
from jupyter_gpushare.core.state import ClusterState
from jupyter_gpushare.core.why_table import WhyTable, table_key


def _words(state: ClusterState, table: WhyTable, req: Request) -> str:
    """What ``table`` says of ``req`` as it stands (no refresh)."""
    pool = state.policy.pool(req.pool)
    assert pool is not None
    facts = table.facts(req, len(state.by_pool[req.pool]), state.open_nodes(req.pool))
    return placement_why.say(facts, req, pool.name)


def _caught_up(state: ClusterState, table: WhyTable) -> bool:
    return not table.building and not table.pending and table.version == state.version


@pytest.mark.parametrize("seed", range(12))
def test_a_table_made_a_slice_at_a_time_says_what_a_pass_says(seed: int) -> None:
    """Tables begun empty and stepped by random budgets while the state changes under them
    (nodes read before and after their change, read again): once caught up, their words
    are the pass's; a short change log sends a table back to the start mid-way."""
    rng = random.Random(500 + seed)
    state = cluster(rng)
    if seed % 3 == 0:
        state.LOG_LIMIT = 4  # type: ignore[misc]
    kept = placement_why._kept(state)
    asks = [ask(rng, n) for n in range(6)]
    tables = []
    for req in asks:
        pool = state.policy.pool(req.pool)
        assert pool is not None
        nodes, pos = kept.nodes_read(state, pool.name, req, pool.mode)
        tables.append(WhyTable(state, nodes, req, pool.mode, pos, read_now=False))
    compared = 0
    for n in range(150):
        change(state, rng, n)
        for table, req in zip(tables, asks, strict=True):
            if rng.random() < 0.3:
                continue  # left behind for a while (beyond a short log's reach)
            table.step(state, rng.choice([0, 1, 2, 3, 40]))
            if _caught_up(state, table):
                assert _words(state, table, req) == why_by_scan(state, req), (seed, n, req)
                compared += 1
    assert compared > 200, compared


def _warm_fully(state: ClusterState, budget: int = 5) -> int:
    calls = 0
    while warm(state, budget):
        calls += 1
        assert calls < 10_000
    return calls


@contextlib.contextmanager
def counting_reads() -> Iterator[list[int]]:
    """A list that gets an item for each node part a table makes inside the block."""
    reads: list[int] = []
    real = why_table._part
    why_table._part = lambda *a: reads.append(1) or real(*a)  # type: ignore[assignment]
    try:
        yield reads
    finally:
        why_table._part = real


@pytest.mark.parametrize("seed", range(8))
def test_warmed_tables_are_the_ones_a_refusal_reads_and_say_the_same(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(placement_why, "WARM_AT", 0.0)  # every pool near full
    monkeypatch.setattr(placement_why, "KEEP_PENDING", 1)  # every change brought up
    rng = random.Random(700 + seed)
    state = cluster(rng)
    asks = [ask(rng, n) for n in range(8)]
    for req in asks:
        pool = state.policy.pool(req.pool)
        assert pool is not None
        note_ask(state, req, pool.mode)
    for n in range(80):
        change(state, rng, n)
        for _ in range(rng.choice([0, 1, 3])):
            warm(state, rng.choice([1, 4, 30]))
        if rng.random() < 0.3:
            _warm_fully(state)
            kept = placement_why._kept(state)
            before = dict(kept.tables)
            with counting_reads() as reads:
                for req in asks:
                    assert why_nothing_fits(state, req) == why_by_scan(state, req), (seed, n)
            assert reads == []  # every table had caught up: the refusals read no node
            assert all(kept.tables[k] is t for k, t in before.items())


def _one_node(cpu: int = 8000, mem: int = 32000) -> ClusterState:
    gpus = tuple(GPU(f"n/gpu{k}", "A100", 40000, index=k) for k in range(4))
    policy = Policy(
        nodes=(Node("n", "shared", gpus, cpu, mem),),
        pools=(Pool("shared", SharingMode.SHARED),),
        priority_classes=(PriorityClass("p", 1, False),),
        teams=(Team("t", ("t",)),),
    )
    return ClusterState(policy)


def _grant(state: ClusterState, n: int, gpu: GPUAsk, cpu: int = 0, mem: int = 0) -> Grant:
    req = Request(f"r{n}", "u", "t", "shared", gpu, "p", cpu_milli=cpu, memory_mib=mem,
                  holder=f"h{n}")
    placement = place(state, req)
    assert placement is not None
    grant = Grant(f"g{n}", req, placement, req.gpu.units_milli, False, 1, False, 0.0)
    state.apply(grant)
    return grant


def test_a_pools_load_is_the_largest_share_held_of_gpus_cpu_and_ram() -> None:
    state = _one_node()
    assert state.pool_load("shared") == 0.0
    _grant(state, 1, GPUAsk(whole=1), cpu=1000, mem=4000)
    assert state.pool_load("shared") == 0.25  # 1 of 4 GPUs; CPU 1/8, RAM 1/8
    cpu = _grant(state, 2, GPUAsk(), cpu=5000)
    assert state.pool_load("shared") == 0.75  # CPU 6,000 of 8,000
    state.release(cpu.id)
    assert state.pool_load("shared") == 0.25
    mem = _grant(state, 3, GPUAsk(), mem=28000)
    assert state.pool_load("shared") == 1.0  # RAM 32,000 of 32,000
    state.release(mem.id)
    assert state.pool_load("shared") == 0.25
    _grant(state, 4, GPUAsk(fraction_milli=500))
    assert state.pool_load("shared") == 1500 / 4000
    assert state.pool_load("nowhere") == 0.0


def test_warm_waits_for_a_pool_near_full_and_makes_only_its_asks_tables() -> None:
    rng = random.Random(9)
    state = cluster(rng)
    shared = Request("s", "u", "t", "shared", GPUAsk(fraction_milli=500), "p", holder="h")
    train = Request("x", "u", "t", "train", GPUAsk(whole=1), "p", holder="h")
    note_ask(state, shared, SharingMode.SHARED)
    note_ask(state, train, SharingMode.EXCLUSIVE)
    kept = placement_why._kept(state)
    cpu = sum(ns.node.cpu_milli for ns in state.by_pool["shared"])
    n = 0
    while state.pool_load("shared") < placement_why.WARM_AT:
        assert warm(state, 10**6) == 0 and not kept.tables, state.pool_load("shared")
        for ns in state.by_pool["shared"]:  # hold CPU, a node at a time, up to the mark
            if ns.free_cpu >= 1000 and state.pool_load("shared") < placement_why.WARM_AT:
                _grant_on(state, n, ns.node.name, min(ns.free_cpu, cpu // 50))
                n += 1
                break
    assert warm(state, 10**6) > 0
    assert set(kept.tables) == {table_key(shared, SharingMode.SHARED)}
    assert state.pool_load("train") < placement_why.WARM_AT


def _grant_on(state: ClusterState, n: int, node: str, cpu: int) -> None:
    req = Request(f"c{n}", "u", "t", "shared", GPUAsk(), "p", cpu_milli=cpu, holder=f"c{n}")
    placement = place(state, req)
    assert placement is not None
    placement = type(placement)(node, ())
    state.apply(Grant(f"c{n}", req, placement, 0, False, 1, False, 0.0))


def test_warm_reads_at_most_its_budget_and_makes_the_largest_asks_table_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(placement_why, "WARM_AT", 0.0)
    monkeypatch.setattr(placement_why, "KEEP_PENDING", 1)
    state = cluster(random.Random(4))
    mode = SharingMode.SHARED
    small = Request("a", "u", "t", "shared", GPUAsk(fraction_milli=250), "p", holder="h")
    big = Request("b", "u", "t", "shared", GPUAsk(fraction_milli=750), "p", holder="h")
    none = Request("c", "u", "t", "shared", GPUAsk(), "p", holder="h")
    for _ in range(5):
        note_ask(state, small, mode)  # the most seen, and yet the smallest
    note_ask(state, big, mode)
    note_ask(state, none, mode)
    kept = placement_why._kept(state)
    assert warm(state, 3) == 3
    building = [k for k, t in kept.tables.items() if len(t.parts) > 0]
    assert building == [table_key(none, mode)]  # no GPU first: it reads no card
    while kept.tables[table_key(none, mode)].building:
        assert warm(state, 3) <= 3
    warm(state, 1)
    started = {k for k, t in kept.tables.items() if len(t.parts) > 0}
    assert table_key(big, mode) in started and table_key(small, mode) not in started
    assert _warm_fully(state, 3) > 0
    assert all(_caught_up(state, t) for t in kept.tables.values())
    assert warm(state, 3) == 0  # nothing changed: nothing to do
    for ns in state.by_pool["shared"]:
        state.cordon(ns.node.name)
    # nodes changed since: the tables made are brought up to date first, at most KEEP_UP
    # times the budget a slice
    assert warm(state, 2) == 2 * placement_why.KEEP_UP
    assert _warm_fully(state, 2) > 0
    assert all(_caught_up(state, t) for t in kept.tables.values())


def test_warm_keeps_within_the_tables_limit_and_drops_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(placement_why, "WARM_AT", 0.0)
    state = cluster(random.Random(5))
    pool_nodes = len(state.by_pool["shared"])
    monkeypatch.setattr(placement_why, "KEEP_NODE_PARTS", 2 * pool_nodes)
    refused = Request("r", "u", "t", "shared", GPUAsk(whole=8), "p", holder="h")
    why_nothing_fits(state, refused)  # a table made by a refusal: kept
    for milli in (250, 500, 750):
        note_ask(state, Request("a", "u", "t", "shared", GPUAsk(fraction_milli=milli), "p",
                                holder="h"), SharingMode.SHARED)
    _warm_fully(state)
    kept = placement_why._kept(state)
    assert table_key(refused, SharingMode.SHARED) in kept.tables
    assert len(kept.tables) == 2  # one more fitted; the others were not made
    assert sum(len(t.nodes) for t in kept.tables.values()) <= 2 * pool_nodes
    # a refusal of an ask without a table: the warmed table nobody asked for goes first
    other = Request("o", "u", "t", "shared", GPUAsk(whole=4), "p", holder="h")
    assert why_nothing_fits(state, other) == why_by_scan(state, other)
    assert set(kept.tables) == {
        table_key(refused, SharingMode.SHARED), table_key(other, SharingMode.SHARED)
    }


def test_the_room_for_tables_goes_to_the_most_seen_asks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Room for one table: the ask seen most gets it, though a larger one is made first when
    both fit."""
    monkeypatch.setattr(placement_why, "WARM_AT", 0.0)
    state = cluster(random.Random(5))
    monkeypatch.setattr(placement_why, "KEEP_NODE_PARTS", len(state.by_pool["shared"]))
    mode = SharingMode.SHARED
    big = Request("b", "u", "t", "shared", GPUAsk(fraction_milli=750), "p", holder="h")
    small = Request("s", "u", "t", "shared", GPUAsk(fraction_milli=250), "p", holder="h")
    note_ask(state, big, mode)
    for _ in range(3):
        note_ask(state, small, mode)
    _warm_fully(state)
    assert set(placement_why._kept(state).tables) == {table_key(small, mode)}


def test_asks_kept_are_bounded_and_the_least_seen_goes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(placement_why, "KEEP_ASKS", 3)
    state = cluster(random.Random(6))
    mode = SharingMode.SHARED

    def seen(milli: int, times: int = 1) -> Request:
        req = Request("a", "u", "t", "shared", GPUAsk(fraction_milli=milli), "p", holder="h")
        for _ in range(times):
            note_ask(state, req, mode)
        return req

    kept_twice = [seen(100, 2), seen(200, 2)]
    once = seen(300)
    newest = seen(400)
    asks = placement_why._kept(state).asks
    assert len(asks) == 3
    assert table_key(once, mode) not in asks
    assert {table_key(r, mode) for r in [*kept_twice, newest]} == set(asks)
    assert asks[table_key(kept_twice[0], mode)][0] == 2


def test_a_table_made_waits_for_enough_changes_and_a_refusal_reads_only_those(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Below ``KEEP_PENDING`` nodes changed a made table is left as it is (the changes noted);
    from there it is brought up to date; a refusal in between reads only the nodes noted."""
    monkeypatch.setattr(placement_why, "WARM_AT", 0.0)
    monkeypatch.setattr(placement_why, "KEEP_PENDING", 3)
    state = cluster(random.Random(8))
    req = Request("a", "u", "t", "shared", GPUAsk(whole=1), "p", holder="h")
    note_ask(state, req, SharingMode.SHARED)
    _warm_fully(state, 100)
    table = placement_why._kept(state).tables[table_key(req, SharingMode.SHARED)]
    names = [ns.node.name for ns in state.by_pool["shared"]]
    state.cordon(names[0])
    state.cordon(names[1])
    assert warm(state, 100) == 0 and table.pending == {names[0], names[1]}
    with counting_reads() as reads:
        assert why_nothing_fits(state, req) == why_by_scan(state, req)
    assert len(reads) == 2 and not table.pending
    for name in names[2:5]:
        state.cordon(name)
    assert warm(state, 100) == 3 and not table.pending
    assert _words(state, table, req) == why_by_scan(state, req)


def test_one_list_of_nodes_to_read_is_made_per_slice(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each set of models asked has its own list of the nodes its tables read (a pass over
    the pool's positions); a slice makes at most one, so that many pinned asks seen at once
    do not hold the loop for all of them."""
    monkeypatch.setattr(placement_why, "WARM_AT", 0.0)
    state = cluster(random.Random(12))
    mode = SharingMode.SHARED
    for models in (("A100",), ("V100",), ("T4",), ("A100", "T4")):
        note_ask(state, Request("a", "u", "t", "shared", GPUAsk(whole=1), "p", holder="h",
                                gpu_models=models), mode)
    kept = placement_why._kept(state)
    sizes = []
    for _ in range(4):
        warm(state, 0)
        sizes.append(len(kept.read))
    assert sizes == [1, 2, 3, 4]


def test_a_table_whose_ask_is_no_longer_kept_stays_within_the_change_log(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A refusal made a table; its ask then left the asks kept (more asks than kept). The
    warm steps still note its changed nodes, so that a short change log does not send it
    back to a whole read at its next refusal (multigpu-pinned at ten times the Alibaba
    cluster: refusals of 20-46 ms with a table made)."""
    monkeypatch.setattr(placement_why, "KEEP_ASKS", 1)
    state = cluster(random.Random(13))
    state.LOG_LIMIT = 4  # type: ignore[misc]
    mode = SharingMode.SHARED
    old = Request("o", "u", "t", "shared", GPUAsk(whole=8), "p", holder="h")
    note_ask(state, old, mode)
    why_nothing_fits(state, old)
    other = Request("n", "u", "t", "shared", GPUAsk(fraction_milli=500), "p", holder="h")
    note_ask(state, other, mode)
    note_ask(state, other, mode)
    kept = placement_why._kept(state)
    assert table_key(old, mode) not in kept.asks and table_key(old, mode) in kept.tables
    name = state.by_pool["shared"][0].node.name
    for _ in range(5):
        for _ in range(3):
            state.cordon(name, not state.nodes[name].cordoned)
        warm(state, 0)
    with counting_reads() as reads:
        assert why_nothing_fits(state, old) == why_by_scan(state, old)
    assert len(reads) == 1  # the one node changed, not the pool's 7
