"""Ranking a pool's nodes for one request: the fragmentation gradient and the ranked scan.

A candidate's rank is the fragmentation it adds against the target workload
(:mod:`.fragmentation`) plus a penalty when the node would be left with less CPU (as a
share of the node) than GPU, in coarse steps per GPU asked; ties go to the node listed
first (the rank folds in the position). :class:`RankedScan` computes gradients (memoised
per node signature and CPU levels), bounds them from below without computing them, and
scans rows for the best one; :class:`.packindex.PoolIndex` keeps the rows and memos.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Sequence

from .cofit import COFIT_MIN_MILLI, COFIT_PENALTY
from .fragmentation import FragTable, Shape, Workload
from .model import UNIT
from .packrows import NodeView, Row

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


Floor = tuple[float, tuple[int, ...], tuple[float, ...]]
"""(fragmentation, and the hostable share of the target by per-GPU size:
``FragTable.hostable_by_size``) of a node's GPUs as they stand at one CPU level: see
``RankedScan._floor``."""

Scored = tuple[float, int, NodeView, tuple[int, ...]]
"""(rank, free RAM, view, free-unit values to take) of one scored node."""


class RankedScan:
    """Gradients, their lower bounds and the ranked scan of one pool's rows.

    The attributes are the pool index's (:class:`.packindex.PoolIndex` sets them).
    """

    table: FragTable
    by_pos: list[NodeView]
    weight: float  # starvation penalty per unit of GPU share over CPU share
    step: float  # rank step per GPU asked
    # (fragmentation increase, free-unit values to take) per node state and shape
    _memo: dict[tuple, tuple[float, tuple[int, ...]]]
    # the same gradients per (milli, count), keyed by signature * stride + CPU level
    # (and under ~key, as (bound, ()), the lower bound of a gradient not computed: _scan)
    _by_shape: dict[tuple[int, int], dict[int, tuple[float, tuple[int, ...]]]]
    # (fragmentation, hostable share by size) per signature * stride + CPU level: _floor
    _floors: dict[int, Floor]
    _last_cut: float  # a ranked scan's cut when it ended (see _scan)

    def _floor(self, view: NodeView, level: int) -> Floor:
        """(fragmentation, hostable share by per-GPU size) of a node's GPUs as they stand,
        at CPU ``level``: what bounds its gradients from below (see ``_scan``).

        Placing ``demand`` milli takes free GPU capacity and lowers the CPU level to that
        left, ``after``. Its gradient is the fragmentation at ``after`` of the GPUs as they
        stand, less that now (the CPU's own part), plus what the taking itself adds at
        ``after``: every shape hostable there that is no larger than the GPU taken from
        (every shape, when idle GPUs are taken) loses at least ``demand`` of usable room
        (it stays hostable and loses that, or loses all it had, which held the GPUs
        taken), and no shape gains any, so that part is at least
        ``-demand * (1 - their share)``. And since no shape becomes hostable, the
        fragmentation afterwards is at least the free capacity left times the share of
        the target not hostable at ``after`` now.
        """
        table = self.table
        units = view.sorted_units
        sizes, shares = table.hostable_by_size(view.model, level, units)
        return table.frag(view.model, level, units), sizes, shares

    def _bound(
        self,
        view: NodeView,
        before: int,
        after: int,
        milli: int,
        num: int,
        least: float,
        penalty: float,
        enough: float,
    ) -> tuple[float, tuple[int, ...]]:
        """A lower bound on the gradient of ``num`` GPUs of ``milli`` on ``view`` from CPU
        level ``before`` to ``after``, less a rounding margin, and never below ``least``;
        with ``()``, or with ``(0,)`` when only the first bound below was computed.

        First from the floor at ``before`` alone (the share of the target not hostable
        there: the bound a scan used before ``gradient_floor``); only when that bound (plus
        ``penalty``, in rank steps of the pool) stays below ``enough``, the rank that would
        skip the node, is the floor at ``after`` read too (:func:`gradient_floor`).
        """
        floors = self._floors
        stride = len(self.table.cpu_levels) + 1
        sig, units, total = view.sig, view.sorted_units, view.total
        now = floors.get(sig * stride + before)
        if now is None:
            now = floors[sig * stride + before] = self._floor(view, before)
        shares = now[2]
        low = (total - milli * num) * (1.0 - (shares[-1] if shares else 0.0)) - now[0]
        low -= 1e-6 * (1.0 + abs(low))  # rounding: stay below the exact value
        low = low if low > least else least
        # a fraction no GPU of the node takes in a learned step pays the penalty anyway
        unpaired = (
            num == 1 and COFIT_MIN_MILLI <= milli < UNIT and not self._any_good_step(units, milli)
        )
        if unpaired:
            low += COFIT_PENALTY
        if ((low + penalty) // self._step_of(milli, num)) * len(self.by_pos) >= enough:
            return low, (0,)
        left = floors.get(sig * stride + after) if after != before else now
        if left is None:
            left = floors[sig * stride + after] = self._floor(view, after)
        strong = gradient_floor(now, left, units, milli, num, total)
        strong -= 1e-6 * (1.0 + abs(strong))
        if unpaired:
            strong += COFIT_PENALTY
        return (strong if strong > low else low), ()

    def _any_good_step(self, units: tuple[int, ...], milli: int) -> bool:
        """Whether a fraction of ``milli`` fills some GPU of free ``units`` exactly or takes
        it a step of the learned packings (no :data:`COFIT_PENALTY` then)."""
        paired = self.table.paired_free(milli)
        return any(free in paired for free in units)

    def _step_of(self, milli: int, num: int) -> float:
        """The rank step of a request of ``num`` GPUs of ``milli`` (a step per GPU asked)."""
        return self.step * max(1.0, milli * num / UNIT)

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
            paired = table.paired_free(milli) if milli >= COFIT_MIN_MILLI else None
            for k, free in enumerate(units):
                if free < milli or (k and units[k - 1] == free):
                    continue
                rest = free - milli
                j = bisect_left(units, rest, 0, k)  # stays sorted: rest < free
                new = units[:j] + (rest,) + units[j:k] + units[k + 1 :]
                delta = table.frag(view.model, after_level, new) - before
                if paired is not None and free not in paired:
                    delta += COFIT_PENALTY  # a step none of the learned packings takes
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

    def _scan(
        self,
        rows: Iterable[Row],
        shape: Shape,
        mem: int,
        scored: list[Scored] | None,
        prune: bool = True,
        ordered: bool = False,
        size: int = 0,
        parts: Sequence[tuple[float, Iterable[Row]]] = (),
    ) -> list[Scored]:
        """Rank ``rows``; returns [the best one with room for ``mem``] or [].

        With ``scored``, every row that fits all but RAM and may rank among the best
        ``size`` is appended to it, ranked (with ``prune=False``, every one).

        A row whose gradient is not memoised yet is first bounded from below
        (:func:`gradient_floor`, from the node's floors at its CPU level now and after, see
        :meth:`_floor`; the bound is memoised per node state and shape like the gradient):
        when even that bound cannot beat what is already found (the best with room for
        ``mem`` and, with ``scored``, the last of the short list), the gradient is never
        computed. The bound is safe (property-tested), so the answer is the same.

        ``ordered``: the rows come in position order, and the scan stops at the first one
        whose least possible rank cannot beat what is found. Whatever the target, placing
        ``demand`` milli lowers a node's fragmentation by at most ``demand`` (it only
        takes free capacity, so no shape becomes hostable and none gets more room: see
        :func:`least_gradient`), and the starvation penalty is never negative, so a row's
        rank is at least ``least_gradient(demand) // step * n + position``: the rows after
        that one rank no better. Most scans stop within the first few hundred positions,
        however big the pool (a gradient close to ``-demand`` is common: a fraction that
        fills a sliver no shape of the target could use).

        ``parts``: the rows in parts instead, each with a ``floor`` known from elsewhere
        (none of its rows ranks below ``floor + position``): an ordered scan stops a part
        at the first row where that, or the least rank above, cannot beat what is found.
        """
        cpu, milli, num, models = shape
        levels = self.table.cpu_levels
        stride = len(levels) + 1
        stride2 = stride * stride
        memo = self._by_shape.get((milli, num))
        if memo is None:
            memo = self._by_shape[(milli, num)] = {}
        gradient = self._gradient
        weight = self.weight
        demand = milli * num
        # a step per GPU asked: gradients of multi-GPU shapes are that many times larger
        step = self._step_of(milli, num)
        n = len(self.by_pos)
        inf = float("inf")
        # rank and position folded into one number: (delta // step) * n + position
        best_rank = inf
        best: Scored | None = None
        keep = scored is not None
        # with ``scored``: the ranks of the best ``size`` rows so far, negated (a max-heap);
        # a row ranked at or above the worst of them cannot make the short list
        top: list[float] = []
        prune = prune and _PRUNE
        ordered = ordered and _ORDERED
        cut = inf  # a row ranked at or above this is of no use
        # the least rank at position 0 (ordered rows: the rank of none is below base + pos)
        least = least_gradient(demand)
        lowest = (least // step) * n if ordered else -inf
        for floor, part in parts or ((-inf, rows),):
            base = max(lowest, floor) if ordered else -inf
            for free_cpu, free_mem, units, model, sig, total, inv_cpu, inv_gpu, pos, view in part:
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
                # the least rank a row can have, at no cost: its starvation alone (without it,
                # the least rank is that of an ordered scan's stop, checked above)
                if (
                    starved > 0.0
                    and weight
                    and ((least + weight * starved) // step) * n + pos >= cut
                ):
                    continue
                after = bisect_right(levels, cpu_left)
                before = bisect_right(levels, free_cpu)
                key = sig * stride2 + before * stride + after
                hit = memo.get(key)
                if hit is None:
                    if cut < inf:
                        known = memo.get(~key)  # (the bound, memoised with the gradients)
                        if known is None or known[1]:  # (none, or only the one from ``before``)
                            penalty = weight * starved if starved > 0.0 else 0.0
                            known = memo[~key] = self._bound(
                                view, before, after, milli, num, least, penalty, cut - pos
                            )
                        low = known[0]
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


def starvation_scale(workload: Workload, cpu_per_gpu: float) -> float:
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

_PRUNE = True
"""Skip rows whose lower bound cannot beat the rows found (:meth:`RankedScan._floor`)."""

_ORDERED = True
"""Scans of rows in position order stop where no later row can rank better."""


def gradient_floor(
    now: Floor, after: Floor, units: tuple[int, ...], milli: int, num: int, total: int
) -> float:
    """A lower bound on the gradient of ``num`` GPUs of ``milli`` on a node whose GPUs
    stand at ``units`` (``total`` free), from its floors (:meth:`RankedScan._floor`) at
    its CPU level now and at the one the request leaves (``after``); see ``_floor``.

    Exact in real numbers; the computed gradient may differ by rounding, so callers take
    a margin below it.
    """
    demand = milli * num
    sizes, shares = after[1], after[2]
    if num == 1 and milli < UNIT:  # a fraction: the shapes no larger than the GPU taken from
        j = bisect_right(sizes, units[bisect_left(units, milli)])
    else:  # idle GPUs taken (or none): every shape hostable
        j = len(sizes)
    low = after[0] - now[0] - demand * (1.0 - (shares[j - 1] if j else 0.0))
    # or: what is left, times the share of the target not hostable at ``after``
    spread = (total - demand) * (1.0 - (shares[-1] if shares else 0.0)) - now[0]
    return spread if spread > low else low


def least_gradient(demand: int) -> float:
    """A lower bound on the fragmentation increase of placing ``demand`` milli on a node,
    as :meth:`RankedScan._gradient` computes it, under any target workload.

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
