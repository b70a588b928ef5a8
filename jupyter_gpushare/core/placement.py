"""Placement: which node and which GPU(s) a request lands on.

``place(state, request)`` returns a :class:`Placement` or ``None`` when nothing fits.
It never changes the state; the caller applies the grant. ``place_on_node`` answers
the same question for one node (preemption uses it to test a node with victims gone).

Shared and debug pools use *gpushare packing*, a fragmentation-gradient placement
(after FGD, USENIX ATC '23) made cheap and incremental:

* the fragmentation of every node against the target workload (the request shapes
  seen so far, see :mod:`.fragmentation`) is cached per node and refreshed only for
  nodes whose grants changed; values are memoised by node *signature* (GPU model, CPU
  level, sorted free capacity per GPU), so most lookups are dictionary hits;
* untouched nodes of one hardware kind are interchangeable, so only the first one of
  each kind is scored; together with the set of partly used nodes this keeps a
  decision well below scoring every node;
* a candidate's score is the increase of fragmentation it causes, in coarse steps
  (``GRADIENT_STEP``); ties go to the node whose GPUs end up fullest (best fit),
  then to the node listed first in the policy. Within a node, the GPU that adds the
  least fragmentation wins, then the tightest one.

Exclusive and MIG pools keep plain best fit (whole devices, nothing to fragment).
"""

from __future__ import annotations

import heapq
import itertools
import weakref
from dataclasses import dataclass, field

from .fragmentation import FragTable, Shape, Workload
from .model import UNIT, GPUAsk, GPUSlice, Placement, Request, SharingMode
from .state import ClusterState, GPUState, NodeState

GRADIENT_STEP = 40.0
"""Milli-units of fragmentation increase treated as equal when ranking nodes."""


def _model_ok(gs: GPUState, request: Request) -> bool:
    return not request.gpu_models or gs.gpu.model in request.gpu_models


def _fraction_fits(gs: GPUState, request: Request) -> bool:
    return (
        _model_ok(gs, request)
        and not gs.whole
        and request.gpu.memory_on(gs.gpu, gs.capacity_mib) <= gs.free_mib
        and request.gpu.compute_on() <= gs.free_compute
    )


def node_can_host(ns: NodeState, request: Request) -> bool:
    """CPU, RAM and cordon checks that do not depend on GPUs."""
    return (
        not ns.cordoned and request.cpu_milli <= ns.free_cpu and request.memory_mib <= ns.free_mem
    )


def _slice(gs: GPUState, request: Request) -> GPUSlice:
    ask = request.gpu
    return GPUSlice(gs.gpu.uuid, ask.memory_on(gs.gpu, gs.capacity_mib), ask.compute_on())


def place_on_node(ns: NodeState, request: Request) -> Placement | None:
    """Best placement of ``request`` on one node, or ``None``."""
    if not node_can_host(ns, request):
        return None
    ask = request.gpu
    if ask.is_empty:
        return Placement(ns.node.name, ())
    exclusive = ns.pool.mode in (SharingMode.EXCLUSIVE, SharingMode.MIG)
    if ask.whole or exclusive:
        count = ask.whole or 1
        idle = [g for g in ns.gpus if g.idle and _model_ok(g, request)]
        if len(idle) < count:
            return None
        chosen = idle[:count]
        return Placement(
            ns.node.name,
            tuple(GPUSlice(g.gpu.uuid, g.gpu.memory_mib, UNIT) for g in chosen),
        )
    fits = [g for g in ns.gpus if _fraction_fits(g, request)]
    if not fits:
        return None
    # tightest GPU first; among equals prefer one already shared (keeps idle cards whole)
    best = min(
        fits, key=lambda g: (g.free_mib - ask.memory_on(g.gpu, g.capacity_mib), g.idle, g.gpu.index)
    )
    return Placement(ns.node.name, (_slice(best, request),))


def _leftover(ns: NodeState, placement: Placement) -> tuple[int, int]:
    free_gpus = sum(1 for g in ns.gpus if g.idle) - len(placement.slices)
    return (free_gpus, ns.free_cpu)


def _best_fit(state: ClusterState, request: Request) -> Placement | None:
    """Plain best fit over every node of the pool (exclusive/MIG pools, and a safety net)."""
    best: tuple[tuple[int, int], Placement] | None = None
    for ns in state.by_pool.get(request.pool, ()):
        placement = place_on_node(ns, request)
        if placement is None:
            continue
        score = _leftover(ns, placement)
        if best is None or score < best[0]:
            best = (score, placement)
    return best[1] if best else None


# -- gpushare packing -------------------------------------------------------------------


def gpu_free_units(gs: GPUState) -> int:
    """Free milli-units of one GPU: the smaller of its free compute and free memory share.

    An idle GPU counts as a whole unit (a whole-GPU grant may take it, headroom or not).
    """
    if gs.whole:
        return 0
    if gs.idle:
        return UNIT
    mem_units = gs.free_mib * UNIT // gs.capacity_mib if gs.capacity_mib else 0
    return max(0, min(gs.free_compute, mem_units))


def shape_of(request: Request) -> Shape:
    """The request's shape for the fragmentation measure (RAM is ignored, as in FGD)."""
    ask = request.gpu
    if ask.whole:
        milli, num = UNIT, ask.whole
    elif ask.is_fraction:
        milli, num = ask.fraction_milli, 1
    else:
        milli, num = 0, 0
    return (request.cpu_milli, milli, num, tuple(sorted(request.gpu_models)))


@dataclass
class _NodeView:
    """What packing needs to know about one node, refreshed when its grants change."""

    ns: NodeState
    pos: int  # place in the pool's node list: the final tie-break
    kind: tuple
    model: str
    units: list[int] = field(default_factory=list)  # free milli per GPU, by GPU index
    sorted_units: tuple[int, ...] = ()
    pristine: bool = False  # nothing granted on it: interchangeable with its kind
    in_heap: bool = False
    frag: float = 0.0
    level: int = 0


@dataclass
class _Candidate:
    key: tuple
    view: _NodeView
    take: tuple[int, ...]  # free-unit values of the GPUs to take (fraction: one value)


class _PoolIndex:
    """Per-pool packing index: node views, untouched-node heaps per kind, open nodes."""

    def __init__(self, nodes: list[NodeState], workload: Workload) -> None:
        self.workload = workload
        self.table = FragTable(workload.shapes)
        self.views: dict[str, _NodeView] = {}
        self.kind_heaps: dict[tuple, list[int]] = {}
        self.by_pos: list[_NodeView] = []
        self.open: set[int] = set()  # positions of used nodes with CPU or GPU left
        self._memo: dict[tuple, tuple[float, tuple[int, ...]]] = {}
        for pos, ns in enumerate(nodes):
            models = "|".join(sorted(ns.node.gpu_models))
            kind = (
                models,
                tuple(g.gpu.memory_mib for g in ns.gpus),
                ns.node.cpu_milli,
                ns.node.memory_mib,
                ns.pool.memory_headroom,
            )
            view = _NodeView(ns, pos, kind, models)
            self.views[ns.node.name] = view
            self.by_pos.append(view)
            self.refresh(view)

    def retarget(self) -> None:
        """A new target workload: drop memos and recompute every node's fragmentation."""
        self.table = FragTable(self.workload.shapes)
        self._memo.clear()
        for view in self.by_pos:
            view.level = self.table.level(view.ns.free_cpu)
            view.frag = self.table.frag(view.model, view.level, view.sorted_units)

    def refresh(self, view: _NodeView) -> None:
        """Re-read one node from the state and fix its index memberships."""
        ns = view.ns
        view.units = [gpu_free_units(g) for g in ns.gpus]
        view.sorted_units = tuple(sorted(view.units))
        view.pristine = (
            ns.free_cpu == ns.node.cpu_milli
            and ns.free_mem == ns.node.memory_mib
            and all(g.idle for g in ns.gpus)
        )
        view.level = self.table.level(ns.free_cpu)
        view.frag = self.table.frag(view.model, view.level, view.sorted_units)
        if view.pristine:
            self.open.discard(view.pos)
            if not view.in_heap:
                heapq.heappush(self.kind_heaps.setdefault(view.kind, []), view.pos)
                view.in_heap = True
        elif (ns.free_cpu > 0 or any(view.units)) and not ns.cordoned:
            self.open.add(view.pos)
        else:
            self.open.discard(view.pos)

    def _kind_heads(self) -> list[_NodeView]:
        heads = []
        views = self.by_pos
        for heap in self.kind_heaps.values():
            while heap:
                head = views[heap[0]]
                if head.pristine and not head.ns.cordoned:
                    heads.append(head)
                    break
                heapq.heappop(heap)
                head.in_heap = False
        return heads

    def _gradient(
        self, view: _NodeView, after_level: int, milli: int, num: int
    ) -> tuple[float, tuple[int, ...]]:
        """(fragmentation increase, free-unit values of GPUs to take), memoised."""
        key = (view.model, view.level, after_level, view.sorted_units, milli, num)
        hit = self._memo.get(key)
        if hit is not None:
            return hit
        table = self.table
        units = view.sorted_units
        before = table.frag(view.model, view.level, units)
        result: tuple[float, tuple[int, ...]]
        if num == 0:
            result = (table.frag(view.model, after_level, units) - before, ())
        elif num == 1 and milli < UNIT:
            best: tuple[float, int] | None = None
            for k, free in enumerate(units):
                if free < milli or (k and units[k - 1] == free):
                    continue
                new = units[:k] + (free - milli,) + units[k + 1 :]
                delta = table.frag(view.model, after_level, tuple(sorted(new))) - before
                if best is None or delta < best[0] - 1e-9:
                    best = (delta, free)
            assert best is not None
            result = (best[0], (best[1],))
        else:
            idle = sum(1 for u in units if u >= milli)
            new = units[: len(units) - idle] + (0,) * num + units[len(units) - idle + num :]
            # taking whole GPUs: the idle ones are interchangeable
            result = (
                table.frag(view.model, after_level, tuple(sorted(new))) - before,
                (UNIT,) * num,
            )
        self._memo[key] = result
        return result

    @staticmethod
    def node_key(delta: float, left: int, view: _NodeView) -> tuple:
        """Rank of a candidate (lower is better): gradient step, GPU left, list order."""
        return (int(delta // GRADIENT_STEP), left, view.pos)

    def best(self, request: Request, shape: Shape) -> _Candidate | None:
        """The best candidate node (and GPU free values) for ``request``."""
        cpu, milli, num, models = shape
        mem = request.memory_mib
        level = self.table.level
        best: _Candidate | None = None
        views = self.by_pos
        candidates = itertools.chain((views[p] for p in self.open), self._kind_heads())
        for view in candidates:
            ns = view.ns
            if ns.free_cpu < cpu or ns.free_mem < mem:
                continue
            units = view.sorted_units
            if num:
                if len(units) < num or units[-num] < milli:
                    continue
                if models and view.model not in models:
                    continue
            delta, take = self._gradient(view, level(ns.free_cpu - cpu), milli, num)
            left = sum(units) - milli * num
            key = self.node_key(delta, left, view)
            if best is None or key < best.key:
                best = _Candidate(key, view, take)
        return best


class _Index:
    """Packing indices of one :class:`ClusterState`, kept in step with its grants."""

    def __init__(self, state: ClusterState) -> None:
        self.workload = Workload()
        self.pools: dict[str, _PoolIndex] = {}
        self.node_pool: dict[str, str] = {}
        self.version = state.version
        self.n_grants = len(state.grants)
        self.target_version = self.workload.version
        for pool, nodes in state.by_pool.items():
            self.pools[pool] = _PoolIndex(list(nodes), self.workload)
            for ns in nodes:
                self.node_pool[ns.node.name] = pool

    def sync(self, state: ClusterState) -> None:
        """Refresh the nodes touched since the last call (all of them if unsure)."""
        if state.version == self.version:
            return
        added = len(state.grants) - self.n_grants
        if added > 0 and state.version - self.version == added:
            touched = {
                g.placement.node for g in itertools.islice(reversed(state.grants.values()), added)
            }
        else:
            touched = set(self.node_pool)
        for name in touched:
            pool = self.pools[self.node_pool[name]]
            pool.refresh(pool.views[name])
        self.version = state.version
        self.n_grants = len(state.grants)

    def observe(self, shape: Shape) -> None:
        """Learn the request's shape; re-target every pool when the workload republishes."""
        if self.workload.observe(shape):
            for pool in self.pools.values():
                pool.retarget()


_INDICES: weakref.WeakKeyDictionary[ClusterState, _Index] = weakref.WeakKeyDictionary()


def _index(state: ClusterState) -> _Index:
    idx = _INDICES.get(state)
    if idx is None or set(idx.node_pool) != set(state.nodes):
        idx = _Index(state)
        _INDICES[state] = idx
    else:
        idx.sync(state)
    return idx


def _materialise(cand: _Candidate, request: Request) -> Placement | None:
    """Turn a candidate's free-unit values into concrete GPUs, checking every limit."""
    ns = cand.view.ns
    if not node_can_host(ns, request):
        return None
    ask = request.gpu
    if ask.is_empty:
        return Placement(ns.node.name, ())
    units = cand.view.units
    if ask.whole:
        chosen = [
            g for g, u in zip(ns.gpus, units, strict=True) if g.idle and u and _model_ok(g, request)
        ]
        if len(chosen) < ask.whole:
            return None
        return Placement(
            ns.node.name,
            tuple(GPUSlice(g.gpu.uuid, g.gpu.memory_mib, UNIT) for g in chosen[: ask.whole]),
        )
    want = cand.take[0]
    for g, u in zip(ns.gpus, units, strict=True):
        if u == want and _fraction_fits(g, request):
            return Placement(ns.node.name, (_slice(g, request),))
    return place_on_node(ns, request)


def _overrides(ask: GPUAsk) -> bool:
    """A fraction whose memory or compute does not scale with it (packing models neither)."""
    return ask.is_fraction and (ask.memory_mib is not None or ask.compute_milli is not None)


def place(state: ClusterState, request: Request) -> Placement | None:
    """Choose a node and GPU(s) for ``request`` in its pool, or ``None`` if nothing fits."""
    pool = state.policy.pool(request.pool)
    ask = request.gpu
    if pool is None or not pool.shares_gpus or _overrides(ask):
        return _best_fit(state, request)
    idx = _index(state)
    shape = shape_of(request)
    idx.observe(shape)
    pidx = idx.pools.get(request.pool)
    if pidx is None:
        return None
    cand = pidx.best(request, shape)
    if cand is None:
        return None
    placement = _materialise(cand, request)
    if placement is None:  # a limit the index does not model (explicit memory, say)
        return _best_fit(state, request)
    return placement
