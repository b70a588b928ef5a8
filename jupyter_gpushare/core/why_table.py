"""The figures of :mod:`.placement_why` for one pool and GPU ask, kept up to date (pure).

A table holds each node's part of the figures (its cards of the models asked: how many,
idle, free memory...), their sums, the largest of some of them (a heap per figure whose
stale entries are dropped when they come to the top), and the open nodes that could host
the ask as far as their GPUs go, sorted by free CPU and by free RAM (the most free among
those short of the request's CPU is one bisection away, whatever CPU the request asks).
:meth:`WhyTable.refresh` reads only the nodes changed since (the state's change log); a
state whose log no longer reaches that far is read again whole. A table can also be made
and kept up a slice at a time (:meth:`WhyTable.step`, between requests): the nodes that
change meanwhile are noted (:meth:`WhyTable.gather`) and read again once it is made.
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


_Part = tuple  # (host, free_cpu, free_mem, *sums, *tops): see _part
"""One node's part, flat (a table keeps one per node it reads): ``host``: open, and its GPUs
could take the ask; ``free_cpu``, ``free_mem``: read only for a host (0 otherwise); then
``_SUMS[path]`` figures summed over the nodes, common (open, model cards) then whole: total,
free, roomy, roomy open; fraction: cards, open cards, roomy cards, free MiB, both, hosts; no
GPU: nothing more; then ``_TOPS[path]`` pairs (value, detail), or (None, 0), of the figures
whose largest is wanted (whole: idle; fraction: -need, free MiB (detail: the GPU index),
free compute)."""

_SUMS = {WHOLE: 6, FRACTION: 8, NO_GPU: 2}
_TOPS = {WHOLE: 1, FRACTION: 3, NO_GPU: 0}
_SUM0 = 3  # where the sums begin in a part

# path -> open or not -> the part of a node without a card of the models asked
_NONE_OF_THE_MODELS: dict[str, dict[bool, _Part]] = {
    WHOLE: {
        True: (False, 0, 0, 1, 0, 0, 0, 0, 0, None, 0),
        False: (False, 0, 0, 0, 0, 0, 0, 0, 0, None, 0),
    },
    FRACTION: {
        True: (False, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, None, 0, None, 0, None, 0),
        False: (False, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, None, 0, None, 0, None, 0),
    },
}


def _part(ns: NodeState, request: Request, path: str) -> _Part:
    is_open = not ns.cordoned
    models = request.gpu_models
    mine = ns.gpus if not models else [g for g in ns.gpus if g.gpu.model in models]
    if path == NO_GPU:
        return (is_open, ns.free_cpu, ns.free_mem, int(is_open), len(mine))
    if not mine:  # none of the models asked (most nodes, for a pinned ask): one shared part
        return _NONE_OF_THE_MODELS[path][is_open]
    cards = len(mine)
    if path == WHOLE:
        count = request.gpu.whole or 1
        idle = sum(g.holders == 0 for g in mine)
        has_room = int(idle >= count)
        if not is_open:  # (a node that is no host: its CPU is not read)
            return (False, 0, 0, 0, cards, 0, 0, has_room, 0, None, 0)
        top = idle if idle > 0 else None
        if has_room:
            return (True, ns.free_cpu, ns.free_mem, 1, cards, cards, idle, 1, 1, top, 0)
        return (False, 0, 0, 1, cards, cards, idle, 0, 0, top, 0)
    if not is_open:
        return (False, 0, 0, 0, cards, 0, 0, 0, 0, 0, 0, None, 0, None, 0, None, 0)
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
    host = both > 0
    return (
        host, ns.free_cpu if host else 0, ns.free_mem if host else 0,
        1, cards, cards, opens, roomy, free_sum, both, int(host),
        -need_min if opens else None, 0,
        most_free if opens else None, most_index if opens else 0,
        compute_most if roomy else None, 0,
    )


_SHIFT_POS, _SHIFT_VALUE = 28, 56
_STAMP_MASK = (1 << _SHIFT_POS) - 1
_POS_MASK = (1 << (_SHIFT_VALUE - _SHIFT_POS)) - 1
"""A heap entry is one int: (-value) << 56 | position << 28 | stamp (its low 28 bits): the
smallest is the largest value, the first node among equals; a stale one (its node's stamp
has moved) is dropped when it comes to the top. A tuple per entry took twice the memory."""


def _entry(value: int, i: int, stamp: int) -> int:
    return (-value << _SHIFT_VALUE) | (i << _SHIFT_POS) | (stamp & _STAMP_MASK)


def _host(free: int, i: int) -> int:
    """A host in a list sorted by free CPU or RAM, one int: free << 28 | the position's
    complement, so that among equals the first node sorts last (the one a bisection finds)."""
    return (free << _SHIFT_POS) | (_POS_MASK - i)




class WhyTable:
    """The figures for one pool and GPU ask (:func:`table_key`), as of ``version``."""

    def __init__(
        self,
        state: ClusterState,
        nodes: list[NodeState],
        request: Request,
        mode: SharingMode,
        pos: dict[str, int] | None = None,
        *,
        read_now: bool = True,
    ) -> None:
        """``nodes``: those of the pool the table reads, in the pool's order: all of them, or,
        for an ask pinned to models, only those with a card of one (:func:`reads_all`): the
        others' part is that of a node without the models, which adds only to the open
        nodes, and those the state counts (``state.open_nodes``). ``pos``: each one's
        position in ``nodes``, if the caller keeps it already. ``read_now=False``: read
        nothing yet; :meth:`step` reads the nodes a slice at a time (made ahead of a
        refusal, between requests: :func:`.placement_why.warm`)."""
        self.nodes = nodes
        self.path = _path(request.gpu, mode)
        self.request = request  # its GPU ask and models (the table's key) are what is read
        self.pos = pos if pos is not None else {ns.node.name: i for i, ns in enumerate(nodes)}
        self._begin(state)
        if read_now:
            self._read_some(len(nodes))

    def _begin(self, state: ClusterState) -> None:
        """Start again from nothing, as of the state's version: every node is to be read."""
        self.version = state.version
        self.pending: set[str] = set()  # nodes changed since their part was made
        self.parts: list[_Part] = []
        self.stamps = [0] * len(self.nodes)
        end = _SUM0 + _SUMS[self.path]
        self.sums = [0] * _SUMS[self.path]
        self.tops = [end + 2 * k for k in range(_TOPS[self.path])]  # where each top sits
        self.heaps: list[list[int]] = [[] for _ in self.tops]
        self.by_cpu: list[int] = []
        self.by_mem: list[int] = []

    @property
    def building(self) -> bool:
        """Whether some nodes are not read yet (the figures are not to be read)."""
        return len(self.parts) < len(self.nodes)

    def _read_some(self, count: int) -> int:
        """Read the next ``count`` nodes' parts into the sums, heaps and host columns; the
        read of the last node orders the heaps and columns. Returns the nodes read."""
        start = len(self.parts)
        request, path = self.request, self.path
        chunk = [_part(ns, request, path) for ns in self.nodes[start : start + count]]
        self.parts.extend(chunk)
        sums = self.sums
        for k in range(len(sums)):
            sums[k] += sum(p[_SUM0 + k] for p in chunk)
        for heap, at in zip(self.heaps, self.tops, strict=True):
            heap.extend(
                _entry(value, i, 0)
                for i, p in enumerate(chunk, start)
                if (value := p[at]) is not None
            )
        hosts = [(i, p) for i, p in enumerate(chunk, start) if p[0]]
        self.by_cpu.extend(_host(p[1], i) for i, p in hosts)
        self.by_mem.extend(_host(p[2], i) for i, p in hosts)
        if not self.building:
            for heap in self.heaps:
                heapq.heapify(heap)
            self.by_cpu.sort()
            self.by_mem.sort()
        return len(chunk)

    def _heap(self, at: int) -> list[int]:
        stamps = self.stamps
        heap = [
            _entry(value, i, stamps[i])
            for i, p in enumerate(self.parts)
            if (value := p[at]) is not None
        ]
        heapq.heapify(heap)
        return heap

    def gather(self, state: ClusterState) -> None:
        """Note the nodes changed since the table's version as pending; if the state's log
        no longer reaches that far, start again (every node to be read)."""
        if state.version == self.version:
            return
        changed = state.changed_since(self.version)
        if changed is None:
            self._begin(state)
            return
        pos = self.pos
        self.pending.update(name for name in changed if name in pos)
        self.version = state.version

    def _update_node(self, name: str) -> None:
        i = self.pos[name]
        self._update(i, _part(self.nodes[i], self.request, self.path))

    def refresh(self, state: ClusterState) -> None:
        """Bring the table to the state's version now: the nodes not read yet, then those
        changed since (all of them again if the state's log no longer reaches that far)."""
        self.gather(state)
        if self.building:
            self._read_some(len(self.nodes))
        for name in self.pending:
            self._update_node(name)
        self.pending.clear()

    def step(self, state: ClusterState, budget: int) -> int:
        """Part of :meth:`refresh`: read at most ``budget`` nodes (the next ones while the
        table is being made, else some of those changed since). Returns the nodes read."""
        self.gather(state)
        if self.building:
            return self._read_some(max(0, budget))
        done = 0
        pending = self.pending
        while pending and done < budget:
            self._update_node(pending.pop())
            done += 1
        return done

    def _update(self, i: int, new: _Part) -> None:
        old = self.parts[i]
        if new == old:
            return
        sums = self.sums
        for k in range(len(sums)):
            sums[k] += new[_SUM0 + k] - old[_SUM0 + k]
        self.parts[i] = new
        self.stamps[i] += 1
        for k, at in enumerate(self.tops):
            heap = self.heaps[k]
            value = new[at]
            if value is not None:
                heapq.heappush(heap, _entry(value, i, self.stamps[i]))
            if len(heap) > 2 * len(self.parts) + 64:
                self.heaps[k] = self._heap(at)
        for column, was, now in ((self.by_cpu, old[1], new[1]), (self.by_mem, old[2], new[2])):
            if old[0]:
                del column[bisect.bisect_left(column, _host(was, i))]
            if new[0]:
                bisect.insort(column, _host(now, i))

    def _top(self, k: int) -> tuple[int, int, int] | None:
        """(value, node position, detail) of the largest of figure ``k``, first node first."""
        heap, at = self.heaps[k], self.tops[k]
        while heap:
            i = (heap[0] >> _SHIFT_POS) & _POS_MASK
            if heap[0] & _STAMP_MASK == self.stamps[i] & _STAMP_MASK:
                part = self.parts[i]
                return part[at], i, part[at + 1]
            heapq.heappop(heap)
        return None

    @staticmethod
    def _most_below(column: list[int], limit: int) -> tuple[int, int] | None:
        """(free, node position) of the most free below ``limit``, the first such node."""
        at = bisect.bisect_left(column, limit << _SHIFT_POS)
        if at == 0:
            return None
        entry = column[at - 1]
        return entry >> _SHIFT_POS, _POS_MASK - (entry & _POS_MASK)

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
