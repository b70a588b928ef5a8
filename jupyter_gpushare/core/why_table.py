"""The figures of :mod:`.placement_why` for one pool and GPU ask, kept up to date (pure).

A table holds each node's part of the figures (its cards of the models asked: how many,
idle, free memory...), their sums, the largest of some of them (a heap per figure whose
stale entries are dropped when they come to the top), and the open nodes that could host
the ask as far as their GPUs go, sorted by free CPU and by free RAM (the most free among
those short of the request's CPU is one bisection away, whatever CPU the request asks).
:meth:`WhyTable.refresh` reads only the nodes changed since (the state's change log); a
state whose log no longer reaches that far is read again whole.
"""

from __future__ import annotations

import bisect
import heapq

from .model import UNIT, GPUAsk, Request, SharingMode
from .state import ClusterState, NodeState
from .why_facts import FractionFacts, Hosts, PoolFacts, WholeFacts

WHOLE, FRACTION, NO_GPU = "whole", "fraction", "no_gpu"


def table_key(request: Request, mode: SharingMode) -> tuple:
    """What a table depends on: the pool, the GPU ask and the models (not CPU or RAM)."""
    return (request.pool, request.gpu, request.gpu_models, _path(request.gpu, mode))


def reads_all(request: Request, mode: SharingMode) -> bool:
    """Whether the table for ``request`` reads every node of the pool, or only those with a
    card of the models it is pinned to (the others' part adds only to the open nodes)."""
    return not request.gpu_models or _path(request.gpu, mode) == NO_GPU


def _path(ask: GPUAsk, mode: SharingMode) -> str:
    if ask.is_empty:
        return NO_GPU
    if ask.whole or mode in (SharingMode.EXCLUSIVE, SharingMode.MIG):
        return WHOLE
    return FRACTION


_Part = tuple  # (sums, tops, host, free_cpu, free_mem): see _part
"""One node's part: ``sums`` by path, common (open, model cards) then whole: total, free,
roomy, roomy open; fraction: cards, open cards, roomy cards, free MiB, both, hosts; no GPU:
nothing more. ``tops``: (value, detail) or None per figure whose largest is wanted (whole:
idle; fraction: -need, free MiB, free compute). ``host``: open, and its GPUs could take the
ask. A plain tuple: a table makes one per node of the pool."""

_CLOSED_FRACTION = ((0, 0, 0, 0, 0, 0), (None, None, None), False, 0, 0)
# path -> open or not -> the part of a node without a card of the models asked
_NONE_OF_THE_MODELS: dict[str, dict[bool, _Part]] = {
    WHOLE: {
        True: ((1, 0, 0, 0, 0, 0), (None,), False, 0, 0),
        False: ((0, 0, 0, 0, 0, 0), (None,), False, 0, 0),
    },
    FRACTION: {
        True: ((1, 0, 0, 0, 0, 0, 0, 0), (None, None, None), False, 0, 0),
        False: ((0, 0) + _CLOSED_FRACTION[0], _CLOSED_FRACTION[1], False, 0, 0),
    },
}


def _part(ns: NodeState, request: Request, path: str) -> _Part:
    is_open = not ns.cordoned
    models = request.gpu_models
    mine = ns.gpus if not models else [g for g in ns.gpus if g.gpu.model in models]
    if path == NO_GPU:
        return ((int(is_open), len(mine)), (), is_open, ns.free_cpu, ns.free_mem)
    if not mine:  # none of the models asked (most nodes, for a pinned ask): one shared part
        return _NONE_OF_THE_MODELS[path][is_open]
    if path == WHOLE:
        count = request.gpu.whole or 1
        idle = sum(g.holders == 0 for g in mine)
        has_room = idle >= count
        sums: tuple[int, ...]
        if is_open:
            sums = (1, len(mine), len(mine), idle, int(has_room), int(has_room))
            top = (idle, 0) if idle > 0 else None
        else:
            sums = (0, len(mine), 0, 0, int(has_room), 0)
            top = None
        if has_room and is_open:
            return (sums, (top,), True, ns.free_cpu, ns.free_mem)
        return (sums, (top,), False, 0, 0)  # (a node that is no host: its CPU is not read)
    if not is_open:
        closed = _CLOSED_FRACTION
        return ((0, len(mine)) + closed[0], closed[1], False, 0, 0)
    ask = request.gpu
    compute = ask.compute_on()
    opens = roomy = free_sum = both = 0
    need_min = most_free = most_index = compute_most = -1
    for g in mine:  # one pass, the GPU state's properties inlined (a table reads every node)
        if g.whole:
            continue
        opens += 1
        free = max(0, g.capacity_mib - g.used_mib)
        free_sum += free
        if free > most_free:
            most_free, most_index = free, g.gpu.index
        need = ask.memory_on(g.gpu, g.capacity_mib)
        if need_min < 0 or need < need_min:
            need_min = need
        if need <= free:
            roomy += 1
            free_compute = UNIT - g.used_compute
            compute_most = max(compute_most, free_compute)
            both += compute <= free_compute
    sums = (
        1, len(mine), len(mine), opens, roomy, free_sum, both, int(both > 0)
    )
    tops = (
        (-need_min, 0) if opens else None,
        (most_free, most_index) if opens else None,
        (compute_most, 0) if roomy else None,
    )
    if both:
        return (sums, tops, True, ns.free_cpu, ns.free_mem)
    return (sums, tops, False, 0, 0)


_FAR = -(1 << 62)
_SUMS = {WHOLE: 6, FRACTION: 8, NO_GPU: 2}  # figures summed per path (see _Part)
_TOPS = {WHOLE: 1, FRACTION: 3, NO_GPU: 0}  # figures per path whose largest is kept


class WhyTable:
    """The figures for one pool and GPU ask (:func:`table_key`), as of ``version``."""

    def __init__(
        self,
        state: ClusterState,
        nodes: list[NodeState],
        request: Request,
        mode: SharingMode,
        pos: dict[str, int] | None = None,
    ) -> None:
        """``nodes``: those of the pool the table reads, in the pool's order: all of them, or,
        for an ask pinned to models, only those with a card of one (:func:`reads_all`): the
        others' part is that of a node without the models, which adds only to the open
        nodes, and those the state counts (``state.open_nodes``). ``pos``: each one's
        position in ``nodes``, if the caller keeps it already."""
        self.nodes = nodes
        self.path = _path(request.gpu, mode)
        self.request = request  # its GPU ask and models (the table's key) are what is read
        self.pos = pos if pos is not None else {ns.node.name: i for i, ns in enumerate(nodes)}
        self._read_all(state)

    def _read_all(self, state: ClusterState) -> None:
        self.version = state.version
        self.parts = [_part(ns, self.request, self.path) for ns in self.nodes]
        self.stamps = [0] * len(self.nodes)
        columns = zip(*(p[0] for p in self.parts), strict=True)
        self.sums = [sum(column) for column in columns] or [0] * _SUMS[self.path]
        self.heaps = [self._heap(k) for k in range(_TOPS[self.path])]
        hosts = [(i, p) for i, p in enumerate(self.parts) if p[2]]
        self.by_cpu = sorted([(p[3], -i) for i, p in hosts])
        self.by_mem = sorted([(p[4], -i) for i, p in hosts])

    def _heap(self, k: int) -> list[tuple[int, int, int, int]]:
        heap = [
            (-top[0], i, self.stamps[i], top[1])
            for i, p in enumerate(self.parts)
            if (top := p[1][k]) is not None
        ]
        heapq.heapify(heap)
        return heap

    def refresh(self, state: ClusterState) -> None:
        """Bring the table to the state's version: the nodes changed since, or all."""
        if state.version == self.version:
            return
        changed = state.changed_since(self.version)
        if changed is None:
            self._read_all(state)
            return
        for name in changed:
            i = self.pos.get(name)
            if i is not None:
                self._update(i, _part(self.nodes[i], self.request, self.path))
        self.version = state.version

    def _update(self, i: int, new: _Part) -> None:
        old = self.parts[i]
        if new == old:
            return
        for k, (a, b) in enumerate(zip(old[0], new[0], strict=True)):
            self.sums[k] += b - a
        self.parts[i] = new
        self.stamps[i] += 1
        for k, heap in enumerate(self.heaps):
            top = new[1][k]
            if top is not None:
                heapq.heappush(heap, (-top[0], i, self.stamps[i], top[1]))
            if len(heap) > 2 * len(self.parts) + 64:
                self.heaps[k] = self._heap(k)
        for column, was, now in (
            (self.by_cpu, old[3], new[3]), (self.by_mem, old[4], new[4])
        ):
            if old[2]:
                del column[bisect.bisect_left(column, (was, -i))]
            if new[2]:
                bisect.insort(column, (now, -i))

    def _top(self, k: int) -> tuple[int, int, int] | None:
        """(value, node position, detail) of the largest of figure ``k``, first node first."""
        heap = self.heaps[k]
        while heap:
            negative, i, stamp, detail = heap[0]
            if stamp == self.stamps[i]:
                return -negative, i, detail
            heapq.heappop(heap)
        return None

    @staticmethod
    def _most_below(column: list[tuple[int, int]], limit: int) -> tuple[int, int] | None:
        """(free, node position) of the most free below ``limit``, the first such node."""
        at = bisect.bisect_left(column, (limit, _FAR))
        if at == 0:
            return None
        free, negative_pos = column[at - 1]
        return free, -negative_pos

    def _hosts(self, request: Request, count: int, open_count: int) -> Hosts:
        cpu = self._most_below(self.by_cpu, request.cpu_milli)
        mem = self._most_below(self.by_mem, request.memory_mib)
        return Hosts(
            count=count,
            open=open_count,
            cpu_most=None if cpu is None else (cpu[0], self.nodes[cpu[1]].node.name),
            mem_most=None if mem is None else (mem[0], self.nodes[mem[1]].node.name),
        )

    def facts(self, request: Request, pool_nodes: int, pool_open: int) -> PoolFacts:
        """The figures for ``request`` (of this table's pool and GPU ask; any CPU and RAM),
        in a pool of ``pool_nodes`` nodes, ``pool_open`` of them not cordoned."""
        s = self.sums
        detail: WholeFacts | FractionFacts | Hosts
        if self.path == WHOLE:
            best = self._top(0)
            detail = WholeFacts(
                total=s[2],
                free=s[3],
                best=None if best is None else (best[0], self.nodes[best[1]].node.name),
                roomy=self._hosts(request, s[4], s[5]),
            )
        elif self.path == FRACTION:
            need, most, compute = self._top(0), self._top(1), self._top(2)
            detail = FractionFacts(
                cards=s[2],
                open=s[3],
                need=None if need is None else -need[0],
                roomy=s[4],
                free_mib=s[5],
                most_free=(
                    None if most is None
                    else (most[0], most[2], self.nodes[most[1]].node.name)
                ),
                compute_most=None if compute is None else compute[0],
                both=s[6],
                hosts=self._hosts(request, s[7], s[7]),
            )
        else:
            detail = self._hosts(request, s[0], s[0])
        return PoolFacts(nodes=pool_nodes, open=pool_open, model_cards=s[1], detail=detail)
