"""The fragmentation table of packing, with each node kind's shapes picked out once.

:class:`.fragmentation.FragTable` computes a node's fragmentation by going through every
shape group of the target and skipping those the node's GPU model is shut out of or
whose CPU demand its level does not cover. With shapes pinned to GPU models the target
has many groups and most are skipped for any one node, yet a decision that computes
fragmentation afresh (a new signature, a new target) paid for all of them each time.
:class:`KindFragTable` keeps, per (GPU model, CPU level), the groups that apply, in the
same order, and sums the same terms in the same order: every value is bit for bit the
one :class:`~.fragmentation.FragTable` computes (property-tested), so no ranking changes.
"""

from __future__ import annotations

import itertools
from bisect import bisect_left
from collections.abc import Sequence

from .fragmentation import FragTable, Shape

_Live = tuple[tuple[int, int, float], ...]
"""(per-GPU milli, GPU count, popularity at the level) of the groups that apply."""


class KindFragTable(FragTable):
    """:class:`~.fragmentation.FragTable` with the applicable groups cached per kind."""

    def __init__(self, shapes: Sequence[tuple[Shape, float]]) -> None:
        super().__init__(shapes)
        self._live: dict[tuple[str, int], _Live] = {}

    def live(self, model: str, level: int) -> _Live:
        """The target's GPU shape groups a node of ``model`` at CPU ``level`` may host."""
        got = self._live.get((model, level))
        if got is None:
            got = self._live[(model, level)] = tuple(
                (milli, num, row[level])
                for milli, num, models, row in self._groups
                if row[level] != 0.0 and not (models and model not in models)
            )
        return got

    def hostable(self, model: str, level: int, gpus_sorted: tuple[int, ...]) -> float:
        """As :meth:`.FragTable.hostable` (the same sum, in the same order)."""
        cls = self._classes.get(model) or self.model_class(model)
        key = (cls, level, gpus_sorted)
        val = self._hostable.get(key)
        if val is None:
            val = 0.0
            n = len(gpus_sorted)
            for milli, num, p in self.live(model, level):
                if n - bisect_left(gpus_sorted, milli) >= num:
                    val += p
            self._hostable[key] = val
        return val

    def _compute(self, model: str, level: int, gpus: tuple[int, ...]) -> float:
        """As :meth:`.FragTable._compute` (the same sum, in the same order)."""
        total = sum(gpus)
        if total == 0:
            return 0.0
        usable = 0.0
        n = len(gpus)
        below = [0, *itertools.accumulate(gpus)]  # below[k]: free on the k smallest GPUs
        for milli, num, p in self.live(model, level):
            k = bisect_left(gpus, milli)
            if n - k >= num:  # hostable: only the GPUs smaller than the shape are lost
                usable += p * (total - below[k])
        return total - usable
