"""GPU fragmentation against a target workload, learned from the requests seen so far.

This is the measure of the FGD paper (Weng et al., USENIX ATC '23): for a node and a
workload of request *shapes* with popularities, the fragmented GPU capacity is, per
shape, all the node's free GPU capacity when the shape cannot run there (CPU-only shape,
not enough CPU, wrong GPU model, too few GPUs with enough room), otherwise only the free
capacity on GPUs too small for the shape; the node's fragmentation is the
popularity-weighted sum. Capacity is in milli-units (1000 = one whole GPU).

Unlike FGD, which reads the shape popularity off the whole trace in advance, the
:class:`Workload` here learns it online from the requests placement has been asked
about, and publishes a new target only at doubling checkpoints so that cached values
stay valid between them. Everything is pure Python; nothing runs at import time.
"""

from __future__ import annotations

import bisect
import itertools
from collections import Counter
from collections.abc import Sequence

from .cofit import fill_step, good_steps
from .model import UNIT

Shape = tuple[int, int, int, tuple[str, ...]]
"""(CPU milli, per-GPU milli, number of GPUs, allowed GPU models; empty: any)."""

_Live = tuple[tuple[int, int, float], ...]
"""(per-GPU milli, GPU count, popularity at a CPU level) of the groups a node may host."""

POPULARITY = 0.95
"""The target workload covers the most common shapes up to this share of requests."""


def target_shapes(
    counts: Counter[Shape], threshold: float = POPULARITY
) -> list[tuple[Shape, float]]:
    """Most common shapes covering ``threshold`` of the counted requests, renormalised."""
    total = sum(counts.values())
    if total == 0:
        return []
    ordered = sorted(counts.items(), key=lambda kv: (kv[1], kv[0]), reverse=True)
    chosen: list[tuple[Shape, int]] = []
    cum = 0
    for shape, count in ordered:
        if cum >= threshold * total:
            break
        chosen.append((shape, count))
        cum += count
    return [(shape, count / cum) for shape, count in chosen]


def target_drift(old: Sequence[tuple[Shape, float]], new: Sequence[tuple[Shape, float]]) -> float:
    """How far apart two targets are: their total variation distance (0 the same, 1 disjoint).

    Half the sum over every shape of either of the difference of its weights (a shape
    missing from one weighs 0 there).
    """
    weights = dict(old)
    diff = 0.0
    for shape, p in new:
        diff += abs(p - weights.pop(shape, 0.0))
    diff += sum(abs(p) for p in weights.values())
    return diff / 2.0


class Workload:
    """Online shape popularity; ``version`` changes only when the target is republished."""

    def __init__(self, first_refresh: int = 1) -> None:
        self.counts: Counter[Shape] = Counter()
        self.seen = 0
        self.version = 0
        self.next_refresh = first_refresh
        self.shapes: list[tuple[Shape, float]] = []

    def observe(self, shape: Shape) -> bool:
        """Count one request; returns True when a new target was published."""
        self.counts[shape] += 1
        self.seen += 1
        if self.seen < self.next_refresh:
            return False
        self.next_refresh = self.seen * 2 if self.seen < 4096 else self.seen + 4096
        self.shapes = target_shapes(self.counts)
        self.version += 1
        return True


class FragTable:
    """Memoised node fragmentation for one target workload.

    CPU enters only through which shape CPU demands the free CPU still covers, so nodes
    are keyed by that *level* rather than the exact free CPU.
    """

    def __init__(
        self,
        shapes: Sequence[tuple[Shape, float]],
        fractions: Sequence[tuple[int, float]] | None = None,
    ) -> None:
        self.shapes = list(shapes)
        # (per-GPU milli, how often asked) of the fractions the GPUs are packed for
        self.fractions = (
            list(fractions)
            if fractions is not None
            else [(milli, p * num) for (_, milli, num, _), p in self.shapes if 0 < milli < UNIT]
        )
        self.cpu_levels = sorted({s[0] for s, _ in self.shapes})
        self._memo: dict[tuple[str, int, tuple[int, ...]], float] = {}
        # GPU shapes grouped by (per-GPU milli, count, models); per group and CPU level the
        # popularity of the group's shapes whose CPU demand that level covers
        groups: dict[tuple[int, int, tuple[str, ...]], list[float]] = {}
        for (cpu, milli, num, models), p in self.shapes:
            if milli == 0:
                continue
            row = groups.setdefault((milli, num, models), [0.0] * (len(self.cpu_levels) + 1))
            for lv in range(bisect.bisect_left(self.cpu_levels, cpu) + 1, len(row)):
                row[lv] += p
        self._groups = [(milli, num, models, row) for (milli, num, models), row in groups.items()]
        self._classes: dict[str, str] = {}
        self._hostable: dict[tuple[str, int, tuple[int, ...]], float] = {}
        self._live: dict[tuple[str, int], _Live] = {}
        self._steps: frozenset[int] | None = None
        self._paired: dict[int, frozenset[int]] = {}

    @property
    def good_steps(self) -> frozenset[int]:
        """The steps a GPU takes on the way to a packing of the fractions asked for
        (:func:`.cofit.good_steps`), made on first use."""
        if self._steps is None:
            self._steps = good_steps(self.fractions)
        return self._steps

    def paired_free(self, milli: int) -> frozenset[int]:
        """The free amounts of a GPU that a fraction of ``milli`` fills exactly or takes a
        step of the learned packings (:attr:`good_steps`), made once per size."""
        got = self._paired.get(milli)
        if got is None:
            steps = self.good_steps
            got = self._paired[milli] = frozenset(
                free
                for free in range(milli, UNIT + 1)
                if free == milli or fill_step(UNIT - free, UNIT - free + milli) in steps
            )
        return got

    def model_class(self, model: str) -> str:
        """A name shared by every GPU model that the target's shapes treat alike.

        Only shapes that name models tell models apart, so models outside every such list
        (or inside the same ones) have the same fragmentation: memos key on the class.
        """
        cls = self._classes.get(model)
        if cls is None:
            shut = [str(i) for i, g in enumerate(self._groups) if g[2] and model not in g[2]]
            cls = self._classes[model] = "~" + ",".join(shut)
        return cls

    def level(self, cpu_free: int) -> int:
        """How many distinct shape CPU demands ``cpu_free`` covers."""
        return bisect.bisect_right(self.cpu_levels, cpu_free)

    def frag(self, model: str, level: int, gpus_sorted: tuple[int, ...]) -> float:
        """Fragmented milli-units of a node (``gpus_sorted``: free milli per GPU, ascending)."""
        cls = self._classes.get(model) or self.model_class(model)
        key = (cls, level, gpus_sorted)
        val = self._memo.get(key)
        if val is None:
            val = self._compute(model, level, gpus_sorted)
            self._memo[key] = val
        return val

    def live(self, model: str, level: int) -> _Live:
        """The target's GPU shape groups a node of ``model`` at CPU ``level`` may host.

        (per-GPU milli, GPU count, popularity at ``level``), in the groups' order, cached per
        (model, level): with shapes pinned to GPU models most groups are shut to any one
        node, and a value computed afresh goes through only the groups left.
        """
        got = self._live.get((model, level))
        if got is None:
            got = self._live[(model, level)] = tuple(
                (milli, num, row[level])
                for milli, num, models, row in self._groups
                if row[level] != 0.0 and not (models and model not in models)
            )
        return got

    def hostable(self, model: str, level: int, gpus_sorted: tuple[int, ...]) -> float:
        """The popularity share of the target's GPU shapes a node can host as it stands."""
        cls = self._classes.get(model) or self.model_class(model)
        key = (cls, level, gpus_sorted)
        val = self._hostable.get(key)
        if val is None:
            val = 0.0
            n = len(gpus_sorted)
            find = bisect.bisect_left
            for milli, num, p in self.live(model, level):
                if n - find(gpus_sorted, milli) >= num:
                    val += p
            self._hostable[key] = val
        return val

    def hostable_by_size(
        self, model: str, level: int, gpus_sorted: tuple[int, ...]
    ) -> tuple[tuple[int, ...], tuple[float, ...]]:
        """The hostable share of the target's GPU shapes by per-GPU size, cumulated.

        (sizes, shares): ``shares[i]`` is the popularity of the shapes a node can host as
        it stands whose per-GPU milli is at most ``sizes[i]`` (sizes ascending, distinct).
        """
        n = len(gpus_sorted)
        find = bisect.bisect_left
        by_size: dict[int, float] = {}
        for milli, num, p in self.live(model, level):
            if n - find(gpus_sorted, milli) >= num:
                by_size[milli] = by_size.get(milli, 0.0) + p
        sizes = tuple(sorted(by_size))
        return sizes, tuple(itertools.accumulate(by_size[m] for m in sizes))

    def _compute(self, model: str, level: int, gpus: tuple[int, ...]) -> float:
        """All free capacity, less what the hostable shapes can still use."""
        total = sum(gpus)
        if total == 0:
            return 0.0
        usable = 0.0
        n = len(gpus)
        below = [0, *itertools.accumulate(gpus)]  # below[k]: free on the k smallest GPUs
        find = bisect.bisect_left
        for milli, num, p in self.live(model, level):
            k = find(gpus, milli)
            if n - k >= num:  # hostable: only the GPUs smaller than the shape are lost
                usable += p * (total - below[k])
        return total - usable
