"""gpushare packing of one pool: a fragmentation-gradient placement index.

:class:`PoolIndex` answers which node (and which GPU free values) a request of a shared or
debug pool lands on; :func:`.placement.place` keeps it in step with the state and turns
its answer into GPUs.

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
* a scan computes no gradient for a node whose lower bound (its fragmentation now, and
  the share of the target it cannot host now, see ``PoolIndex._floor``) cannot beat the
  nodes already found: after a new target, most nodes are skipped that way;
* a full scan reads rows in position order, only those of buckets big enough and with
  about enough free CPU (bit sets per bucket and per CPU step: :mod:`.packrows`), and stops at
  the first position whose least possible rank cannot beat what it found: no gradient
  is below ``-demand`` whatever the target (:func:`least_gradient`), and ties go to the
  lower position, so its cost grows with how far the good nodes lie, not with the pool;
* the CPU penalty fades out when the learned workload asks for more CPU per GPU than
  the pool supplies (then no choice keeps CPU ahead of GPU, see ``_starvation_scale``);
* a new target drops the memos of the old one but frees them a little per decision.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right
from collections.abc import Iterable
from dataclasses import dataclass

from .fragmentation import FragTable, Shape, Workload
from .model import UNIT, Request
from .packrows import NodeView, Row, RowTable, head_row
from .scarcity import scarcity_of
from .state import GPUState, NodeState

GRADIENT_STEP = 120.0
"""Milli-units of fragmentation increase treated as equal when ranking nodes, per GPU
the request asks for (an 8-GPU shape ranks in steps of 960)."""

STEP_COARSEN = 0.25
"""Extra share of ``GRADIENT_STEP`` as the starvation penalty fades out: when CPU is the
scarce resource, small GPU-fragmentation differences matter less than packing onto the
same nodes."""

STARVATION_WEIGHT = 2000.0
"""Milli-units of fragmentation charged per unit by which a node's GPU share left exceeds
its CPU share left (GPUs that CPU can no longer feed)."""


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


class PoolIndex:
    """Per-pool packing index: node views, untouched-node heaps per kind, open nodes."""

    def __init__(self, nodes: list[NodeState], workload: Workload) -> None:
        self.workload = workload
        self.scarcity = scarcity_of(nodes)
        self.table = FragTable(self._target())
        self.views: dict[str, NodeView] = {}
        self.kind_heaps: dict[tuple, list[int]] = {}
        self.by_pos: list[NodeView] = []
        # used nodes with CPU or GPU left, as rows by GPU room, free CPU and position
        self.rows = RowTable(len(nodes))
        self._memo: dict[tuple, tuple[float, tuple[int, ...]]] = {}
        self.clock = 0  # refreshes so far
        # position -> clock of its last refresh, oldest first: the nodes changed since a
        # clock reading are a suffix, read without looking at the older ones
        self.changed: dict[int, int] = {}
        self._cache: dict[tuple, _Cached] = {}
        gpus = sum(len(ns.gpus) for ns in nodes)
        self.cpu_per_gpu = sum(ns.node.cpu_milli for ns in nodes) / gpus if gpus else 0.0
        self.weight = STARVATION_WEIGHT
        self.step = GRADIENT_STEP
        # the same gradients per (milli, count), keyed by signature * stride + CPU level
        self._by_shape: dict[tuple[int, int], dict[int, tuple[float, tuple[int, ...]]]] = {}
        self._sigs: dict[tuple, int] = {}
        # (fragmentation, share not hostable) per signature * stride + CPU level: _floor
        self._floors: dict[int, tuple[float, float]] = {}
        self._dropped: list[dict] = []  # memos of old targets, freed bit by bit
        self._last_cut = float("inf")  # a ranked scan's cut when it ended (see _from_cache)
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

    def retarget(self) -> None:
        """A new target workload: a new table, and drop what was computed against the old.

        Nothing per node: a node's signature does not depend on the target (its CPU levels
        are read off its free CPU when it is scored), so this costs the same at any size.
        """
        old, self.table = self.table, FragTable(self._target())
        scale = _starvation_scale(self.workload, self.cpu_per_gpu)
        self.weight = STARVATION_WEIGHT * scale
        self.step = GRADIENT_STEP * (1.0 + STEP_COARSEN * (1.0 - scale))
        # the old table's memos too (every dict it holds)
        self._drop_memos(*(v for v in vars(old).values() if isinstance(v, dict)))

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
        elif (ns.free_cpu > 0 or view.total) and not ns.cordoned:
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

    def _floor(self, view: NodeView, level: int) -> tuple[float, float]:
        """(fragmentation now, share of the target it cannot host now) of a node at ``level``.

        Placing anything only lowers a node's free GPU and CPU, so the shapes it can host
        afterwards are among those it hosts now, and its fragmentation afterwards is at
        least the free capacity left times the share of the target it cannot host now: the
        gradient of a request of ``demand`` milli is at least
        ``(total - demand) * share - fragmentation now``.
        """
        table = self.table
        units = view.sorted_units
        frag = table.frag(view.model, level, units)
        return frag, 1.0 - table.hostable(view.model, level, units)

    def _gradient(
        self, view: NodeView, after_level: int, milli: int, num: int
    ) -> tuple[float, tuple[int, ...]]:
        """(fragmentation increase, free-unit values of GPUs to take), memoised."""
        table = self.table
        level = table.level(view.ns.free_cpu)
        key = (view.sig, level, after_level, milli, num)
        hit = self._memo.get(key)
        if hit is not None:
            return hit
        units = view.sorted_units
        before = table.frag(view.model, level, units)
        result: tuple[float, tuple[int, ...]]
        if num == 0:
            result = (table.frag(view.model, after_level, units) - before, ())
        elif num == 1 and milli < UNIT:
            best: tuple[float, int] | None = None
            for k, free in enumerate(units):
                if free < milli or (k and units[k - 1] == free):
                    continue
                rest = free - milli
                j = bisect_left(units, rest, 0, k)  # stays sorted: rest < free
                new = units[:j] + (rest,) + units[j:k] + units[k + 1 :]
                delta = table.frag(view.model, after_level, new) - before
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

    def best(self, request: Request, shape: Shape) -> Candidate | None:
        """The best candidate node (and GPU free values) for ``request``.

        A candidate's rank is its fragmentation increase plus ``STARVATION_WEIGHT`` times
        the amount by which its GPU share left would exceed its CPU share left, in steps
        of ``GRADIENT_STEP`` per GPU asked (coarser by up to ``STEP_COARSEN`` as the
        penalty fades out); ties go to the node listed first.

        GPU requests of a shape seen before start from that shape's cached short list
        (:class:`_Cached`): only the nodes changed since and the untouched heads of each
        kind are scored again; the answer is exact (the full scan's), and the full scan
        runs when the short list cannot prove it.
        """
        cpu, milli, num, models = shape
        mem = request.memory_mib
        if self._dropped:
            self._free_some()
        if milli == 0:
            found = self._scan(self.rows.cpu_rows(cpu, mem), shape, mem, None, ordered=_ORDERED)
            if found:  # (it finds one when any of those rows has room)
                return self._candidate(found[0])
            # against every node: as for a GPU shape, from a short list when one is cached
        cached = self._cache.get(shape)
        stamp = self.clock
        if len(self._cache) >= _CACHE_SHAPES and cached is None:
            self._cache.clear()
        if cached is not None:
            hit = self._from_cache(cached, shape, mem)
            if hit is not _MISS:
                return self._candidate(hit)  # type: ignore[arg-type]
        scored: list[_Scored] = []
        rows = self.rows.rows_for(milli, cpu, self._kind_heads())
        keep = self._short_len()
        # the short list and its reserve; none on a shape's first scan after a new target
        # (memos are cold then, and a wider cut would compute more gradients)
        most = keep * _RESERVE if cached is not None else keep
        found = self._scan(rows, shape, mem, scored, ordered=_ORDERED, size=most + 1)
        if len(scored) > most:
            ranked = heapq.nsmallest(most + 1, scored)
            rbound = ranked.pop()[0]
        else:
            ranked, rbound = sorted(scored), float("inf")
        bound = ranked[keep][0] if len(ranked) > keep else rbound
        reserve = {e[2].pos: (e, stamp) for e in ranked[keep:]}
        self._cache[shape] = _Cached(stamp, bound, ranked[:keep], rbound, reserve)
        return self._candidate(found[0] if found else None)

    def _short_len(self) -> int:
        """Nodes per short list: a big pool's best nodes run out later."""
        return max(_SHORT_LIST, len(self.by_pos) // _SHORT_SHARE)

    def _candidate(self, hit: _Scored | None) -> Candidate | None:
        if hit is None:
            return None
        rank, _, view, take = hit
        n = len(self.by_pos)
        return Candidate((int(rank // n), view.pos), view, take)

    def _from_cache(self, cached: _Cached, shape: Shape, mem: int) -> _Scored | None | object:
        """The best node from a shape's short list and the nodes changed since it was made.

        Invariant of a short list: every eligible node with a rank below ``bound`` is on
        it, as of ``stamp`` (the clock then). Nodes unchanged since keep their rank;
        changed ones and the heads of untouched kinds (a new head may take over without
        changing itself) are scored again: never more than the full scan would score,
        however old the list. Returns ``_MISS`` when the list proves nothing, and ``None``
        when it proves that no node has room: with no bound (the last full scan found at
        most ``_short_len()`` nodes fitting all but RAM) the list is every node that fits
        all but RAM, so when none of it has the RAM, the full scan would find none (late
        in a full cluster, most requests of a shape that failed once fail again: without
        this, each was a full scan).
        """
        since = cached.stamp
        changed: set[int] = set()
        for pos in reversed(self.changed):
            if self.changed[pos] <= since:
                break
            changed.add(pos)
        heads = self._kind_heads()
        fresh = changed.union(h.pos for h in heads)
        rows = [head_row(h) for h in heads] + self.rows.changed_rows(changed, shape[1])
        merged: list[_Scored] = [
            e for e in cached.short if e[2].pos not in fresh and not e[2].pristine
        ]
        rescored: list[_Scored] = []
        self._scan(rows, shape, mem, rescored)
        now, bound = self.clock, cached.bound
        # the rescored rows are complete below the scan's last cut (see _scan)
        rbound = min(cached.rbound, self._last_cut)
        bound = min(bound, rbound)
        reserve = cached.reserve
        for e in rescored:
            if e[0] < bound:
                merged.append(e)
            elif e[0] < rbound:
                reserve[e[2].pos] = (e, now)
        merged.sort()
        while merged and merged[-1][0] >= bound:
            merged.pop()
        keep = self._short_len()
        if len(merged) > keep:
            bound = merged[keep][0]
            for e in merged[keep:]:
                if e[0] < rbound:
                    reserve[e[2].pos] = (e, now)
            del merged[keep:]
        cached.stamp, cached.bound, cached.short, cached.rbound = now, bound, merged, rbound
        for e in merged:
            if e[1] >= mem:
                return e
        if reserve:
            return self._refill(cached, merged, fresh, mem)
        # a list that holds every node fitting all but RAM (no bound) proves none has room
        return None if rbound == float("inf") else _MISS

    def _refill(
        self, cached: _Cached, short: list[_Scored], fresh: set[int], mem: int
    ) -> _Scored | None | object:
        """The short list has no node with room: take the reserve's valid entries into it.

        A reserve entry is valid when made in this lookup, or when its node has not changed
        since it was made and is not untouched (an untouched node is scored only as the
        head of its kind, and every head was scored again in this lookup).
        """
        now, changed, rbound = self.clock, self.changed, cached.rbound
        ranked = list(short)
        for e, made in cached.reserve.values():
            pos = e[2].pos
            if e[0] >= rbound:
                continue  # (below its rank the list is no longer known complete)
            if made == now or (pos not in fresh and not e[2].pristine and changed[pos] <= made):
                ranked.append(e)
        ranked.sort()
        keep = self._short_len()
        cached.short = ranked[:keep]
        cached.bound = ranked[keep][0] if len(ranked) > keep else cached.rbound
        cached.reserve = {e[2].pos: (e, now) for e in ranked[keep:]}
        for e in ranked:
            if e[1] >= mem:
                return e
        return None if cached.rbound == float("inf") else _MISS

    def _scan(
        self,
        rows: Iterable[Row],
        shape: Shape,
        mem: int,
        scored: list[_Scored] | None,
        prune: bool = True,
        ordered: bool = False,
        size: int = 0,
    ) -> list[_Scored]:
        """Rank ``rows``; returns [the best one with room for ``mem``] or [].

        With ``scored``, every row that fits all but RAM and may rank among the best
        ``_short_len() + 1`` is appended to it, ranked (with ``prune=False``, every one).

        A row whose gradient is not memoised yet is first bounded from below (see
        :meth:`_floor`): when even that bound cannot beat what is already found (the best
        with room for ``mem`` and, with ``scored``, the last of the short list), the
        gradient is never computed. The bound is safe, so the answer is the same.

        ``ordered``: the rows come in position order, and the scan stops at the first one
        whose least possible rank cannot beat what is found. Whatever the target, placing
        ``demand`` milli lowers a node's fragmentation by at most ``demand`` (it only
        takes free capacity, so no shape becomes hostable and none gets more room: see
        :func:`least_gradient`), and the starvation penalty is never negative, so a row's
        rank is at least ``least_gradient(demand) // step * n + position``: the rows after
        that one rank no better. Most scans stop within the first few hundred positions,
        however big the pool (a gradient close to ``-demand`` is common: a fraction that
        fills a sliver no shape of the target could use).
        """
        cpu, milli, num, models = shape
        levels = self.table.cpu_levels
        stride = len(levels) + 1
        stride2 = stride * stride
        memo = self._by_shape.get((milli, num))
        if memo is None:
            memo = self._by_shape[(milli, num)] = {}
        floors = self._floors
        gradient = self._gradient
        weight = self.weight
        demand = milli * num
        # a step per GPU asked: gradients of multi-GPU shapes are that many times larger
        step = self.step * max(1.0, demand / UNIT)
        n = len(self.by_pos)
        inf = float("inf")
        # rank and position folded into one number: (delta // step) * n + position
        best_rank = inf
        best: _Scored | None = None
        keep = scored is not None
        # with ``scored``: the ranks of the best ``size`` rows so far, negated (a max-heap);
        # a row ranked at or above the worst of them cannot make the short list
        if keep and not size:
            size = self._short_len() + 1
        top: list[float] = []
        prune = prune and _PRUNE
        cut = inf  # a row ranked at or above this is of no use
        # the least rank at position 0 (ordered rows: the rank of none is below base + pos)
        least = least_gradient(demand)
        base = (least // step) * n if ordered else -inf
        for free_cpu, free_mem, units, model, sig, total, inv_cpu, inv_gpu, pos, view in rows:
            if base + pos >= cut:
                break
            cpu_left = free_cpu - cpu
            if cpu_left < 0 or (free_mem < mem and not keep):
                continue
            if num:
                if len(units) < num or units[-num] < milli:
                    continue
                if models and model not in models and "|" not in model:
                    continue  # (a node of mixed models is checked GPU by GPU later)
            starved = (total - demand) * inv_gpu - cpu_left * inv_cpu  # GPU share over CPU's
            if cut < inf:  # the least rank a row can have, at no cost: its starvation alone
                low = least + weight * starved if starved > 0.0 else least
                if (low // step) * n + pos >= cut:
                    continue
            after = bisect_right(levels, cpu_left)
            before = bisect_right(levels, free_cpu)
            key = sig * stride2 + before * stride + after
            hit = memo.get(key)
            if hit is None:
                if cut < inf:
                    fkey = sig * stride + before
                    floor = floors.get(fkey)
                    if floor is None:
                        floor = floors[fkey] = self._floor(view, before)
                    low = (total - demand) * floor[1] - floor[0]
                    low -= 1e-6 * (1.0 + abs(low))  # rounding: stay below the exact value
                    if low < least:
                        low = least
                    if starved > 0.0:
                        low += weight * starved
                    if (low // step) * n + pos >= cut:
                        continue
                hit = memo[key] = gradient(view, after, milli, num)
            delta = hit[0]
            if starved > 0.0:
                delta += weight * starved
            rank = (delta // step) * n + pos
            if keep:
                if rank >= cut:
                    continue
                entry = (rank, free_mem, view, hit[1])
                scored.append(entry)  # type: ignore[union-attr]
                if rank < best_rank and free_mem >= mem:
                    best_rank, best = rank, entry
                if prune:
                    if len(top) < size:
                        heapq.heappush(top, -rank)
                    elif rank < -top[0]:
                        heapq.heapreplace(top, -rank)
                    if len(top) == size:
                        cut = max(-top[0], best_rank)
            elif rank < best_rank:
                best_rank, best = rank, (rank, free_mem, view, hit[1])
                if prune:
                    cut = rank
        self._last_cut = cut if keep and prune else inf
        return [best] if best is not None else []


SCARCITY = True
"""Weigh learned shapes by their scarcity in the pool (:mod:`.scarcity`)."""


def _starvation_scale(workload: Workload, cpu_per_gpu: float) -> float:
    """How much of ``STARVATION_WEIGHT`` applies under the learned workload.

    The penalty keeps a node's CPU share left at least its GPU share left, so that its
    GPUs stay hostable. That is only possible while the workload asks for no more CPU
    per GPU than the pool supplies; once CPU is the scarce resource everywhere, every
    node ends short of CPU whatever the choice, and the penalty only steers shapes away
    from where they pack best. It fades out between ``STARVATION_FADE`` (ratio of
    demanded to supplied CPU per GPU) and that plus 0.2.
    """
    cpu = gpu = 0.0
    for (c, milli, num, _), count in workload.counts.items():
        cpu += c * count
        gpu += milli * num * count / UNIT
    if not gpu or not cpu_per_gpu:
        return 1.0
    ratio = cpu / gpu / cpu_per_gpu
    return min(1.0, max(0.0, (STARVATION_FADE + 0.2 - ratio) / 0.2))


STARVATION_FADE = 1.0
"""Demanded over supplied CPU per GPU above which the starvation penalty fades out."""

_Scored = tuple[float, int, NodeView, tuple[int, ...]]
"""(rank, free RAM, view, free-unit values to take) of one scored node."""

_SHORT_LIST = 24
"""Nodes kept per cached shape, at least."""

_SHORT_SHARE = 256
"""A pool of many nodes keeps one per ``_SHORT_SHARE`` of its nodes per cached shape."""

_CACHE_SHAPES = 512
"""Shapes cached per pool (all are dropped when more arrive)."""

_PRUNE = True
"""Skip rows whose lower bound cannot beat the rows found (:meth:`PoolIndex._floor`)."""

_ORDERED = True
"""Full scans read rows in position order and stop where no later row can rank better."""


def least_gradient(demand: int) -> float:
    """A lower bound on the fragmentation increase of placing ``demand`` milli on a node,
    as :meth:`PoolIndex._gradient` computes it, under any target workload.

    Placing only takes free GPU capacity and CPU, so every shape of the target hostable
    afterwards was hostable before, with at most the room it had: the capacity usable by
    the target does not grow, and fragmentation (free capacity less usable capacity) falls
    by at most ``demand``. CPU-only requests (``demand`` 0) never lower it: both values
    are sums, in one order, of terms that are each no larger after (rounding is monotone),
    so the computed increase is exactly at least 0. Otherwise the free totals differ and a
    rounding margin far above the floats' error keeps the bound below the computed value.
    """
    if demand <= 0:
        return 0.0
    return -demand - 1e-6 * (1.0 + demand)


_FREE_PER_DECISION = 500
"""Entries of dropped memos freed per decision (a new target drops tens of thousands)."""

_SIG_LIMIT = 1 << 20
"""Interned node signatures per pool before they are all made again."""


_MISS = object()


@dataclass
class _Cached:
    """A shape's short list: its best nodes as of ``stamp``, all those ranked below ``bound``;
    and its reserve: with the short list, every node ranked below ``rbound`` (by position:
    the entry and the clock when it was made; an entry whose node changed since is stale)."""

    stamp: int
    bound: float
    short: list[_Scored]
    rbound: float
    reserve: dict[int, tuple[_Scored, int]]


_RESERVE = 4
"""A full scan (but a shape's first after a new target) keeps ``_RESERVE`` times the short
list's length of its best nodes: when the short list runs out, the next ones come from the
rest without a full scan."""
