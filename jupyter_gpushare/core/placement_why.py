"""Why nothing in a pool fits a request: the actual cause, in words (pure).

:func:`why_nothing_fits` is asked once placement found no node (admission's refusal and
queue reasons). It tells apart the causes an admin acts on differently:

* no free capacity in the pool at all (every GPU busy, or less free memory in total than
  the request needs);
* enough free GPUs in total but no node with as many free together (whole GPUs), naming
  the node with the most;
* enough free memory in total but fragmented across cards (fractions), with the most free
  on one card;
* the memory is there but the compute share is taken;
* the GPUs are there but their nodes lack CPU or RAM, or are cordoned;
* no GPU of the models the request allows.

The figures come from :class:`.why_table.WhyTable`, kept per pool and GPU ask and brought up
to date from the nodes changed since it was last asked: a refusal costs about what the
changes since the last one cost, not a pass over the pool (a pass was ~5 ms on the 6,212 GPUs
of the Alibaba cluster and ~35 ms at ten times that, on the broker's event loop, for every
refusal late in a full cluster). An ask's first refusal would make its table, that pass:
:func:`warm` makes the tables ahead instead, a slice at a time between requests, for the
asks seen in a pool near full. :func:`why_by_scan` gives the same words from one pass over
the pool: the reference the tables are tested against.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Sequence

from .model import Request, SharingMode
from .state import ClusterState, GPUState, NodeState
from .why_facts import FractionFacts, Hosts, PoolFacts, WholeFacts, model_ok
from .why_table import WhyTable, reads_all, table_key


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


# -- the words ---------------------------------------------------------------------------------


def say_hosts(h: Hosts, request: Request, what: str) -> str:
    """Why none of the nodes with ``what`` (room on their GPUs) can host the request."""
    if h.open == 0:
        verb = "is" if h.count == 1 else "are"
        return f"the {_plural(h.count, 'node')} with {what} {verb} cordoned"
    parts = []
    if h.cpu_most is not None:
        free, node = h.cpu_most
        parts.append(
            f"CPU ({request.cpu_milli / 1000:g} cores asked, at most {free / 1000:g} "
            f"free on node {node})"
        )
    if h.mem_most is not None:
        free, node = h.mem_most
        parts.append(
            f"RAM ({request.memory_mib} MiB asked, at most {free} MiB free on node {node})"
        )
    if not parts:
        return f"no node can host {request.gpu.describe()}"
    verb = "lacks" if h.open == 1 else "lack"
    return f"the {_plural(h.open, 'node')} with {what} {verb} " + " and ".join(parts)


def say_whole(f: WholeFacts, request: Request, count: int) -> str:
    if f.free < count:
        return (
            f"no free capacity in the pool: {f.free} of {_plural(f.total, 'GPU')} free, "
            f"{count} asked"
        )
    best, best_node = f.best or (0, "")
    if best < count:
        return (
            f"enough free GPUs in total ({f.free}) but no node has {count} free together "
            f"(largest: {best} on node {best_node})"
        )
    return say_hosts(f.roomy, request, f"{count} free GPU" + ("s" if count > 1 else ""))


def say_fraction(f: FractionFacts, request: Request) -> str:
    ask = request.gpu
    if f.open == 0 or f.need is None:
        return (
            "no free capacity in the pool: every GPU is held whole" if f.cards
            else "no free capacity in the pool: every node is cordoned"
        )
    if f.roomy == 0:
        assert f.most_free is not None
        most_mib, index, node = f.most_free
        if f.free_mib >= f.need:
            return (
                f"memory fragmented across cards: {f.free_mib} MiB free in total but at most "
                f"{most_mib} MiB on one card (GPU {index} of node {node}), "
                f"{f.need} MiB needed"
            )
        return (
            f"no free capacity in the pool: {f.free_mib} MiB of GPU memory free in total, "
            f"{f.need} MiB needed"
        )
    compute = ask.compute_on()
    if f.both == 0:
        return (
            f"compute taken: the cards with {f.need} MiB free have at most "
            f"{(f.compute_most or 0) / 10:g} % of their compute free, {compute / 10:g} % asked"
        )
    return say_hosts(f.hosts, request, f"room for {ask.describe()} on a GPU")


def say(pool_facts: PoolFacts, request: Request, pool_name: str) -> str:
    """The cause in words, from the pool's figures for the request."""
    if pool_facts.nodes == 0:
        return f"pool {request.pool} has no nodes"
    if pool_facts.open == 0:
        return f"every node of pool {request.pool} is cordoned"
    if request.gpu_models and pool_facts.model_cards == 0:
        return f"no GPU of model {', '.join(sorted(request.gpu_models))} in pool {pool_name}"
    detail = pool_facts.detail
    if isinstance(detail, WholeFacts):
        return say_whole(detail, request, request.gpu.whole or 1)
    if isinstance(detail, FractionFacts):
        return say_fraction(detail, request)
    return say_hosts(detail, request, "no GPU asked")


# -- the figures from the tables, kept up to date ----------------------------------------------


class _Kept:
    """What is kept for one state: the tables, least recently asked first, per pool and
    set of models the nodes with a card of one (in the pool's order, from the state's
    ``by_model``) and their positions, and the asks seen (:func:`note_ask`) with how often
    each was seen."""

    def __init__(self) -> None:
        self.tables: OrderedDict[tuple, WhyTable] = OrderedDict()
        self.asks: dict[tuple, tuple[int, Request]] = {}  # table key -> (times seen, an ask)
        self.read: dict[tuple, tuple[list[NodeState], dict[str, int]]] = {}

    def nodes_read(
        self, state: ClusterState, pool: str, request: Request, mode: SharingMode
    ) -> tuple[list[NodeState], dict[str, int]]:
        """The nodes a table for ``request`` reads, and each one's position among them."""
        key = _read_key(pool, request, mode)
        models = key[1]
        if key not in self.read:
            if len(self.read) >= _KEEP_NODE_SETS:  # (model sets are what requests name)
                self.read.clear()
            nodes = state.by_pool.get(pool, [])
            if not models:
                chosen = nodes
            else:
                index = state.by_model.get(pool, {})
                at = sorted(set().union(*(index.get(m, ()) for m in models)))
                chosen = [nodes[i] for i in at]
            self.read[key] = (chosen, {ns.node.name: i for i, ns in enumerate(chosen)})
        return self.read[key]


def _read_key(pool: str, request: Request, mode: SharingMode) -> tuple:
    models = () if reads_all(request, mode) else tuple(sorted(set(request.gpu_models)))
    return (pool, models)


_KEEP_NODE_SETS = 256
"""Node lists kept per state (one per pool and set of models asked), made again beyond."""


_KEPT: weakref.WeakKeyDictionary[ClusterState, _Kept] = weakref.WeakKeyDictionary()
KEEP_NODE_PARTS = 300_000
"""Tables kept per state, in nodes read (one part per node of the pool, or per node with a
card of the models for a pinned ask): the least recently asked table is dropped beyond.
A part and its heap entries take 340-400 bytes (fraction tables, measured with
``tracemalloc``; whole-GPU ones less), so at most ~120 MB: 247 tables of the 1,213-node
Alibaba cluster, 24 at ten times its size (cpu-heavy asks 23 fractions there; at 200,000
parts its tables were dropped and made again 160 times in one run). Each pool, GPU ask and
set of models asked has a table of its own."""


def _kept(state: ClusterState) -> _Kept:
    kept = _KEPT.get(state)
    if kept is None:
        kept = _KEPT[state] = _Kept()
    return kept


def _parts_kept(kept: _Kept) -> int:
    return sum(len(t.nodes) for t in kept.tables.values())


def why_nothing_fits(state: ClusterState, request: Request) -> str:
    """The cause, in words, that no node of the request's pool can take it now."""
    pool = state.policy.pool(request.pool)
    nodes = state.by_pool.get(request.pool, [])
    if pool is None or not nodes:
        return f"pool {request.pool} has no nodes"
    kept = _kept(state)
    tables = kept.tables
    key = table_key(request, pool.mode)
    table = tables.get(key)
    if table is None:
        read, pos = kept.nodes_read(state, pool.name, request, pool.mode)
        table = tables[key] = WhyTable(state, read, request, pool.mode, pos)
        while len(tables) > 1 and _parts_kept(kept) > KEEP_NODE_PARTS:
            tables.popitem(last=False)
    else:
        tables.move_to_end(key)
        table.refresh(state)
    facts = table.facts(request, len(nodes), state.open_nodes(pool.name))
    return say(facts, request, pool.name)


# -- the tables made ahead of the refusals, between requests -----------------------------------

WARM_AT = 0.6
"""A pool is near refusing once this share of its GPU units, CPU or RAM is held
(``ClusterState.pool_load``): from then on :func:`warm` makes and keeps up the tables of
the asks seen in it (``BrokerApp.why_warm_at``). Measured at ten times the Alibaba cluster
(``benchmarks/placement_broker.py --scale 10``): the default trace's first refusal came at
96 % of its GPU units held, 30,000 decisions after 60 %; cpu-heavy's at 88 % of its CPU,
20,000 after 60 %; every ask's first refusal came within a few thousand decisions of the
pool's first. Making the tables of 17-28 asks there reads 200,000-340,000 nodes."""

KEEP_ASKS = 256
"""Asks remembered per state (one per table key); a new one beyond drops the least seen
(multigpu-pinned at ten times the Alibaba cluster asks more than 64)."""


def note_ask(state: ClusterState, request: Request, mode: SharingMode) -> None:
    """Remember that ``request``'s ask was seen (admission calls this once per new request):
    :func:`warm` makes tables for the asks seen, never for a shape it was not asked."""
    asks = _kept(state).asks
    key = table_key(request, mode)
    seen = asks.get(key)
    if seen is not None:
        asks[key] = (seen[0] + 1, seen[1])
        return
    if len(asks) >= KEEP_ASKS:
        del asks[min(asks, key=lambda k: asks[k][0])]
    asks[key] = (1, request)


def warm(state: ClusterState, budget: int, at: float | None = None) -> int:
    """One slice of work between requests on the tables of the asks seen in the pools near
    refusing (``at``, by default :data:`WARM_AT`), so that an ask's first refusal finds its
    table made and reads only the nodes changed since (a table made at the refusal reads the
    whole pool: 15-60 ms at ten times the Alibaba cluster).

    First the tables made with :data:`KEEP_PENDING` nodes or more changed since are brought
    up to date, at most ``KEEP_UP * budget`` nodes read (every table notes the nodes
    changed, those of asks no longer seen too, so that none falls behind the state's change
    log and is read again whole at its next refusal); then at most ``budget``
    nodes are read into the tables being made, one table at a time, in the order of
    :func:`_first_made`. A new table is made only while the tables kept stay
    within :data:`KEEP_NODE_PARTS` (none is dropped for one). Returns the nodes read (0:
    nothing to do)."""
    kept = _KEPT.get(state)
    if kept is None or not kept.asks:
        return 0
    limit = WARM_AT if at is None else at
    near: dict[str, bool] = {}
    for pool_name in {key[0] for key in kept.asks}:
        near[pool_name] = state.pool_load(pool_name) >= limit
    tables: list[WhyTable] = []
    for key, (_, request) in sorted(_with_room(state, kept, near), key=_first_made):
        table = kept.tables.get(key)
        if table is None:
            table = _new_table(state, kept, key, request)
        if table is not None:
            tables.append(table)
    used = 0
    for table in kept.tables.values():  # every table, asked lately or not: none falls
        table.gather(state)  # behind the state's change log (cheap: the names changed)
    behind = [t for t in tables if not t.building and len(t.pending) >= KEEP_PENDING]
    for table in sorted(behind, key=lambda t: -len(t.pending)):
        if used >= KEEP_UP * budget:
            break
        used += table.step(state, KEEP_UP * budget - used)
    made = 0
    for table in tables:
        if made >= budget:
            break
        if table.building:
            made += table.step(state, budget - made)
    return used + made


KEEP_PENDING = 256
"""A table made is brought up to date once this many of its nodes changed since (a refusal
reads at most about that many again). Waiting for them pays: at ten times the Alibaba
cluster, 1,000 consecutive changes touched only 200 (default trace) to 360 (cpu-heavy)
distinct nodes, since placement packs onto the same nodes."""

KEEP_UP = 1
"""How many times its budget for new tables a slice of :func:`warm` may read to bring the
tables made up to date (a node read again into a table made costs about three times one
read into a table being made: 10-15 us against 4-5 us at ten times the Alibaba cluster)."""


def _first_made(item: tuple[tuple, tuple[int, Request]]) -> tuple[int, int, int]:
    """The order tables are made in: an ask of no GPU first (its table reads no card: a
    fraction of the others' cost), then the most GPU units asked (a larger ask is refused
    sooner as the pool fills: at ten times the Alibaba cluster whole GPUs were refused first),
    then the most seen."""
    seen, request = item[1]
    units = request.gpu.units_milli
    return (units > 0, -units, -seen)


def _with_room(
    state: ClusterState, kept: _Kept, near: dict[str, bool]
) -> list[tuple[tuple, tuple[int, Request]]]:
    """The asks of the pools near refusing that have a table, or room for one within
    :data:`KEEP_NODE_PARTS`: the most seen get the room first (at ten times the Alibaba
    cluster, cpu-heavy asks 25 shapes of GPU and 24 tables fit; two of them were seen 10
    times in 96,000 requests and never refused). At most one list of the nodes an ask
    reads is made per slice (for asks pinned to models, each set of models has its own:
    making them all in one slice held the loop 50-60 ms on gpumodel-constrained)."""
    room = KEEP_NODE_PARTS - _parts_kept(kept)
    new_sets = 1  # node lists made per slice (one is a pass over the pool's positions)
    chosen = []
    for key, (seen, request) in sorted(kept.asks.items(), key=lambda kv: -kv[1][0]):
        if not near[key[0]]:
            continue
        if key not in kept.tables:
            pool = state.policy.pool(request.pool)
            nodes = state.by_pool.get(request.pool, [])
            if pool is None or not nodes:
                continue
            if _read_key(pool.name, request, pool.mode) not in kept.read:
                if new_sets == 0:
                    continue  # (its turn comes in a later slice)
                new_sets -= 1
            size = len(kept.nodes_read(state, pool.name, request, pool.mode)[0])
            if size > room:
                continue
            room -= size
        chosen.append((key, (seen, request)))
    return chosen


def _new_table(
    state: ClusterState, kept: _Kept, key: tuple, request: Request
) -> WhyTable | None:
    """A table for ``request`` with nothing read yet, kept, if it fits within the limit."""
    pool = state.policy.pool(request.pool)
    nodes = state.by_pool.get(request.pool, [])
    if pool is None or not nodes:
        return None
    read, pos = kept.nodes_read(state, pool.name, request, pool.mode)
    if _parts_kept(kept) + len(read) > KEEP_NODE_PARTS:
        return None
    table = kept.tables[key] = WhyTable(state, read, request, pool.mode, pos, read_now=False)
    kept.tables.move_to_end(key, last=False)  # the first to go: nobody asked for it yet
    return table


# -- the figures from one pass over the pool (the reference) -----------------------------------


def _hosts(nodes: Sequence[NodeState], request: Request) -> Hosts:
    open_nodes = [ns for ns in nodes if not ns.cordoned]
    cpu_short = [ns for ns in open_nodes if request.cpu_milli > ns.free_cpu]
    mem_short = [ns for ns in open_nodes if request.memory_mib > ns.free_mem]
    cpu = max(cpu_short, key=lambda ns: ns.free_cpu) if cpu_short else None
    mem = max(mem_short, key=lambda ns: ns.free_mem) if mem_short else None
    return Hosts(
        count=len(nodes),
        open=len(open_nodes),
        cpu_most=None if cpu is None else (cpu.free_cpu, cpu.node.name),
        mem_most=None if mem is None else (mem.free_mem, mem.node.name),
    )


def _whole(nodes: Sequence[NodeState], request: Request, count: int) -> WholeFacts:
    total = free = best = 0
    best_node = ""
    for ns in nodes:
        if ns.cordoned:
            continue
        mine = [g for g in ns.gpus if model_ok(g, request)]
        total += len(mine)
        idle = sum(1 for g in mine if g.idle)
        free += idle
        if idle > best:
            best, best_node = idle, ns.node.name
    roomy = [
        ns for ns in nodes if sum(1 for g in ns.gpus if g.idle and model_ok(g, request)) >= count
    ]
    return WholeFacts(total, free, (best, best_node) if best else None, _hosts(roomy, request))


def _fraction(nodes: Sequence[NodeState], request: Request) -> FractionFacts:
    ask = request.gpu
    cards = [g for ns in nodes if not ns.cordoned for g in ns.gpus if model_ok(g, request)]
    open_cards = [g for g in cards if not g.whole]

    def need_on(g: GPUState) -> int:
        return ask.memory_on(g.gpu, g.capacity_mib)

    roomy = [g for g in open_cards if need_on(g) <= g.free_mib]
    most = max(open_cards, key=lambda g: g.free_mib) if open_cards else None
    compute = ask.compute_on()
    both = [g for g in roomy if compute <= g.free_compute]
    names = {g.node for g in both}
    return FractionFacts(
        cards=len(cards),
        open=len(open_cards),
        need=min(map(need_on, open_cards)) if open_cards else None,
        roomy=len(roomy),
        free_mib=sum(g.free_mib for g in open_cards),
        most_free=None if most is None else (most.free_mib, most.gpu.index, most.node),
        compute_most=max(g.free_compute for g in roomy) if roomy else None,
        both=len(both),
        hosts=_hosts([ns for ns in nodes if ns.node.name in names], request),
    )


def why_by_scan(state: ClusterState, request: Request) -> str:
    """:func:`why_nothing_fits` from one pass over the pool (no table)."""
    pool = state.policy.pool(request.pool)
    nodes = state.by_pool.get(request.pool, [])
    if pool is None or not nodes:
        return f"pool {request.pool} has no nodes"
    ask = request.gpu
    detail: WholeFacts | FractionFacts | Hosts
    if ask.is_empty:
        detail = _hosts([ns for ns in nodes if not ns.cordoned], request)
    elif ask.whole or pool.mode in (SharingMode.EXCLUSIVE, SharingMode.MIG):
        detail = _whole(nodes, request, ask.whole or 1)
    else:
        detail = _fraction(nodes, request)
    facts = PoolFacts(
        nodes=len(nodes),
        open=sum(1 for ns in nodes if not ns.cordoned),
        model_cards=sum(1 for ns in nodes for g in ns.gpus if model_ok(g, request)),
        detail=detail,
    )
    return say(facts, request, pool.name)
