"""gpushare packing of one pool: a fragmentation-gradient placement index.

:class:`PoolIndex` answers which node (and which GPU free values) a request of a shared or
debug pool lands on; :func:`.placement.place` keeps it in step with the state and turns
its answer into GPUs. It keeps the pool's node views, rows, signatures and memos; the
ranking of rows is :class:`.packscan.RankedScan`'s, the shapes' short lists are
:class:`.packshort.ShortLists`' (both bases of :class:`PoolIndex`).

Shared and debug pools use *gpushare packing*, a fragmentation-gradient placement
(after FGD, USENIX ATC '23) made cheap, incremental and CPU-aware:

* fragmentation against the target workload (the request shapes seen so far, see
  :mod:`.fragmentation`) is memoised per node *signature* (GPU model, sorted free
  capacity per GPU, interned when the node's grants change) and the CPU levels before
  and after, so most lookups are dictionary hits and a new target costs nothing per node;
* untouched nodes of one hardware kind are interchangeable, so only the first one of
  each kind is scored; used nodes sit in buckets by their largest free GPU, so a
  request skips every node whose GPUs are all too small without looking at it;
* a candidate's rank is the fragmentation it adds plus a penalty when the node would
  be left with less CPU (as a share of the node) than GPU: GPUs without CPU to feed
  them are stranded, which FGD's measure sees only at shape thresholds. The rank is
  taken in coarse steps (``GRADIENT_STEP`` per GPU asked, a quarter coarser as the CPU
  penalty fades out) and ties go to the node listed first, so equal choices pack onto
  the same nodes. Within a node the GPU that adds the least
  fragmentation wins, then the tightest one;
* fractions with explicit memory or compute (not proportional to the fraction) are
  placed by plain best fit, which checks them exactly;
* the target weighs each learned shape by its scarcity in the pool (the pool's GPUs over
  those of the node kinds that could host it, :mod:`.scarcity`), so a common request
  leaves a rare model, or the few nodes with CPU for an 8-GPU pod, to the shapes that
  need them.

* CPU-only requests find the first node with every GPU taken and room in a segment
  tree of free CPU and RAM (:class:`.roomtree.RoomTree`) instead of a pass over those nodes;
* a shape seen before is answered from its short list (its best nodes last time, and a
  bound below which the list is complete) plus the nodes changed since (never more than
  the full scan would score); the answer is the full scan's, and the full scan runs when
  the list cannot prove it (or the target changed);
* a scan computes no gradient for a node whose lower bound (the fragmentation its CPU
  level alone adds, less ``demand`` times the share of the target that could lose less
  room, see :func:`.packscan.gradient_floor`) cannot beat the nodes already found: after
  a new target, most nodes are skipped that way;
* a full scan reads rows in position order, only those of buckets big enough and with
  about enough free CPU (bit sets per bucket and per CPU step: :mod:`.packrows`), and stops at
  the first position whose least possible rank cannot beat what it found: no gradient
  is below ``-demand`` whatever the target (:func:`.packscan.least_gradient`), and ties go to the
  lower position, so its cost grows with how far the good nodes lie, not with the pool;
* the CPU penalty fades out when the learned workload asks for more CPU per GPU than
  the pool supplies (then no choice keeps CPU ahead of GPU, see :func:`.packscan.starvation_scale`);
* a new target drops the memos of the old one but frees them a little per decision.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from .fragmentation import FragTable, Shape, Workload, target_drift
from .model import UNIT, Request
from .packnext import NextTarget
from .packrows import NodeView, RowTable
from .packscan import GRADIENT_STEP, STARVATION_WEIGHT, STEP_COARSEN, Scored, starvation_scale
from .packshort import ShortLists
from .scarcity import scarcity_of
from .state import GPUState, NodeState


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
    models = request.gpu_models
    return (request.cpu_milli, milli, num, tuple(sorted(models)) if models else ())


@dataclass
class Candidate:
    key: tuple
    view: NodeView
    take: tuple[int, ...]  # free-unit values of the GPUs to take (fraction: one value)


class PoolIndex(ShortLists):
    """Per-pool packing index: node views, untouched-node heaps per kind, open nodes."""

    def __init__(self, nodes: list[NodeState], workload: Workload) -> None:
        self.workload = workload
        self.scarcity = scarcity_of(nodes)
        self.table = FragTable(self._target(), self._fractions())
        self.views: dict[str, NodeView] = {}
        self.kind_heaps: dict[tuple, list[int]] = {}
        self.by_pos: list[NodeView] = []
        # used nodes with CPU or GPU left, as rows by GPU room, free CPU and position
        self.rows = RowTable(len(nodes))
        self._memo = {}
        self.clock = 0  # refreshes so far
        # position -> clock of its last refresh, oldest first: the nodes changed since a
        # clock reading are a suffix, read without looking at the older ones
        self.changed: dict[int, int] = {}
        self._cache = {}
        gpus = sum(len(ns.gpus) for ns in nodes)
        self.cpu_per_gpu = sum(ns.node.cpu_milli for ns in nodes) / gpus if gpus else 0.0
        self.scale = 1.0  # of the starvation penalty (see retarget)
        self.weight = STARVATION_WEIGHT
        self.step = GRADIENT_STEP
        # the same gradients per (milli, count), keyed by signature * stride + CPU level
        self._by_shape = {}
        self._sigs: dict[tuple, int] = {}
        # (fragmentation, share not hostable) per signature * stride + CPU level: _floor
        self._floors = {}
        self._dropped: list[dict] = []  # memos of old targets, freed bit by bit
        self._last_cut = float("inf")  # a ranked scan's cut when it ended (see _from_cache)
        self.next: NextTarget | None = None  # a target published, its lists being made
        for pos, ns in enumerate(nodes):
            models = "|".join(sorted(ns.node.gpu_models))
            kind = (
                models,
                tuple(g.gpu.memory_mib for g in ns.gpus),
                ns.node.cpu_milli,
                ns.node.memory_mib,
                ns.pool.memory_headroom,
            )
            view = NodeView(ns, pos, kind, models)
            view.inv_cpu = 1.0 / ns.node.cpu_milli if ns.node.cpu_milli else 0.0
            view.inv_gpu = 1.0 / (UNIT * len(ns.gpus)) if ns.gpus else 0.0
            self.views[ns.node.name] = view
            self.by_pos.append(view)
            self.refresh(view)

    def retarget(self, defer: bool = False) -> bool:
        """A new target workload: a new table, and drop what was computed against the old.

        ``defer``: something makes lists ahead between requests (:meth:`make_ahead`): the
        new target waits as :attr:`next`, taken once its lists are made or at the next
        new target (a next target not taken yet is taken first, with the lists it has).

        Kept (returns False) while the learned workload has moved little since the table
        in use was made: its target within ``RETARGET_MARGIN`` of the table's (total
        variation, :func:`.fragmentation.target_drift`) and the starvation penalty's scale
        within it too. A new target drops every memo and short list, and the first scan
        of each shape after it reads every row that fits (the slowest decisions of a big
        pool); a shuffled stream's mix settles early, so most checkpoints change nothing.

        Nothing per node: a node's signature does not depend on the target (its CPU levels
        are read off its free CPU when it is scored), so this costs the same at any size.
        """
        asked = set(self._cache)  # the shapes asked lately: those a next target makes lists for
        if self.next is not None:
            asked |= self.next.shapes()
            self._take_next()
        target = self._target()
        scale = starvation_scale(self.workload, self.cpu_per_gpu)
        if (
            self.table.shapes
            and target_drift(self.table.shapes, target) < RETARGET_MARGIN
            and abs(scale - self.scale) < RETARGET_MARGIN
        ):
            return False
        table = FragTable(target, self._fractions())
        weight = STARVATION_WEIGHT * scale
        step = GRADIENT_STEP * (1.0 + STEP_COARSEN * (1.0 - scale))
        if defer:
            counts = self.workload.counts
            todo = sorted(asked, key=lambda shape: (-counts[shape], shape))
            self.next = NextTarget(table, scale, weight, step, todo)
            return True
        old, self.table = self.table, table
        self.scale, self.weight, self.step = scale, weight, step
        # the old table's memos too (every dict it holds)
        self._drop_memos(*(v for v in vars(old).values() if isinstance(v, dict)))
        return True

    def make_ahead(self, budget: int) -> int:
        """Make the next target's lists between requests (:class:`.packnext.NextTarget`),
        taking it once they are made; with what is left of ``budget`` (positions and rows
        read), bring the stalest short lists up to date (:meth:`.packshort.ShortLists.freshen`).
        Returns what was read (0: nothing to do)."""
        read = 0
        nxt = self.next
        if nxt is not None:
            if not nxt.todo:  # the shapes first asked while it waits: their lists too
                made = nxt.shapes()
                nxt.todo.extend(shape for shape in self._cache if shape not in made)
            read = nxt.make(self, budget, self._kind_heads)
            if nxt.ready:
                self._take_next()
        if read < budget:
            read += self.freshen(budget - read, self._kind_heads())
        return read

    def _take_next(self) -> None:
        """Take the next target with the lists and memos made for it; drop the old ones."""
        nxt, self.next = self.next, None
        assert nxt is not None
        self._drop_memos(*(v for v in vars(self.table).values() if isinstance(v, dict)))
        nxt.swap(self)  # (nxt now holds the old target's, emptied)

    def _fractions(self) -> list[tuple[int, float]]:
        """(per-GPU milli, GPUs asked) of every fraction seen (not only the target's
        shapes): the mix :func:`.cofit.good_fills` packs."""
        return [
            (milli, float(count * num))
            for (_, milli, num, _), count in self.workload.counts.items()
            if 0 < milli < UNIT
        ]

    def _target(self) -> list[tuple[Shape, float]]:
        """The target workload of this pool: the learned shapes weighed by their scarcity."""
        if not SCARCITY:
            return self.workload.shapes
        return self.scarcity.target(self.workload.counts)

    def _drop_memos(self, *more: dict) -> None:
        """Start every memo afresh; the old ones are freed a little per decision after.

        Freeing them at once (tens of thousands of entries at ``--scale 10``) held the
        decision that made a new target for several milliseconds.
        """
        memos: list[dict] = [self._memo, self._floors, self._cache, *more]
        memos.extend(self._by_shape.values())
        self._dropped.extend(d for d in memos if d)
        self._memo, self._floors, self._cache, self._by_shape = {}, {}, {}, {}

    def _free_some(self) -> None:
        """Free up to ``_FREE_PER_DECISION`` entries of the memos dropped (LIFO)."""
        dropped, budget = self._dropped, _FREE_PER_DECISION
        while dropped and budget > 0:
            memo = dropped[-1]
            for _ in range(min(budget, len(memo))):
                memo.popitem()
                budget -= 1
            if not memo:
                dropped.pop()

    def _describe(self, view: NodeView) -> None:
        """The node's signature: its GPU model and sorted free units, interned."""
        key = (view.model, view.sorted_units)
        sig = self._sigs.get(key)
        if sig is None:
            if len(self._sigs) >= _SIG_LIMIT:
                self._reintern()
            sig = self._sigs.setdefault(key, len(self._sigs))
        view.sig = sig

    def _reintern(self) -> None:
        """Too many signatures interned: start over with those of the nodes as they are."""
        if self.next is not None:  # (its memos are by signature too)
            self._take_next()
        self._sigs.clear()
        self._drop_memos()
        for view in self.by_pos:
            view.sig = self._sigs.setdefault((view.model, view.sorted_units), len(self._sigs))
            view.head = None
            if self.rows.bucket_of[view.pos] >= 0:
                self.rows.file(view)

    def refresh(self, view: NodeView) -> None:
        """Re-read one node from the state and fix its index memberships."""
        ns = view.ns
        view.head = None
        self.clock += 1
        self.changed.pop(view.pos, None)
        self.changed[view.pos] = self.clock
        view.units = [gpu_free_units(g) for g in ns.gpus]
        view.sorted_units = tuple(sorted(view.units))
        view.total = sum(view.units)
        view.pristine = (
            ns.free_cpu == ns.node.cpu_milli
            and ns.free_mem == ns.node.memory_mib
            and all(g.idle for g in ns.gpus)
        )
        self.rows.unfile(view.pos)
        self._describe(view)  # (after the node left its bucket: it may re-file the others)
        if view.pristine:
            if not view.in_heap:
                heapq.heappush(self.kind_heaps.setdefault(view.kind, []), view.pos)
                view.in_heap = True
        elif not ns.cordoned:  # a full node still hosts an ask of no GPU and no CPU
            self.rows.file(view)
        self.rows.set_cpu(view.pos, ns.free_cpu)

    def _kind_heads(self) -> list[NodeView]:
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

    def best(self, request: Request, shape: Shape) -> Candidate | None:
        """The best candidate node (and GPU free values) for ``request``.

        A candidate's rank is its fragmentation increase plus ``STARVATION_WEIGHT`` times
        the amount by which its GPU share left would exceed its CPU share left, in steps
        of ``GRADIENT_STEP`` per GPU asked (coarser by up to ``STEP_COARSEN`` as the
        penalty fades out); ties go to the node listed first.

        GPU requests of a shape seen before start from that shape's cached short list
        (:class:`.packshort._Cached`): only the nodes changed since and the untouched heads of each
        kind are scored again; the answer is exact (the full scan's), and the full scan
        runs when the short list cannot prove it.
        """
        cpu, milli, num, models = shape
        mem = request.memory_mib
        if self._dropped:
            self._free_some()
        if milli == 0:
            found = self._scan(self.rows.cpu_rows(cpu, mem), shape, mem, None, ordered=True)
            if found:  # (it finds one when any of those rows has room)
                return self._candidate(found[0])
            # against every node: as for a GPU shape, from a short list when one is cached
        return self._candidate(self._lookup(shape, mem, self._kind_heads()))

    def _candidate(self, hit: Scored | None) -> Candidate | None:
        if hit is None:
            return None
        rank, _, view, take = hit
        n = len(self.by_pos)
        return Candidate((int(rank // n), view.pos), view, take)


SCARCITY = True
"""Weigh learned shapes by their scarcity in the pool (:mod:`.scarcity`)."""

RETARGET_MARGIN = 0.01
"""How far (total variation of the target, and the starvation penalty's scale) the learned
workload may move before a pool takes a new target (:meth:`PoolIndex.retarget`). At 0.02,
cpu-heavy at ``--scale 10`` left 0.02-0.19 points more GPUs unallocated (seeds 42-44);
at 0.01 within -0.03..+0.07 of every new target, mean +0.007."""

_FREE_PER_DECISION = 500
"""Entries of dropped memos freed per decision (a new target drops tens of thousands)."""

_SIG_LIMIT = 1 << 20
"""Interned node signatures per pool before they are all made again."""
