"""A pool's next target, made ahead: its short lists are built between requests, and it is
taken once they are made.

A new target drops every memo and short list of the pool, and each shape's first request
after it was a full scan with cold memos: at ten times the Alibaba cluster
(``benchmarks/placement_broker.py --scale 10``, cpu-heavy) most of the decisions over
10 ms left in the broker. Where something works between requests (the broker's
``WhyWarmer``, :func:`.placement.make_ahead`), a pool defers a new target: decisions keep
the target in use, exact as ever, while :meth:`NextTarget.make` makes, a window of positions
at a time, the short list of each shape the pool has a list for (the most asked first) under
the new one, with its memos. Once every list is made the pool takes the target with its
lists and memos: the first request of each shape after it is answered from its list. A next
target not taken by the time another is published is taken then, with the lists it has,
and the one after makes lists for its shapes too.

A list made in windows is the full scan's: each window is an ordered scan of its positions
keeping its best rows and the rank below which it kept every row (its cut), and the
windows' rows, cut at the least of those ranks and at the list's length, are every row
ranked below the list's bound. The list is dated when its first window was read: a node
changed since is scored again when the list is used, as for any list
(:meth:`.packshort.ShortLists._from_cache`).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass, field

from .fragmentation import FragTable, Shape
from .packrows import NodeView
from .packscan import Scored
from .packshort import _RESERVE, ShortLists, filed

SWAPPED = ("table", "scale", "weight", "step", "_memo", "_floors", "_by_shape", "_cache")
"""The pool index's attributes that belong to its target (everything else, the nodes' rows,
signatures and change log, is the same under any target)."""


@dataclass
class _Making:
    """One shape's list being made: from position ``lo`` on, since clock ``stamp``."""

    shape: Shape
    stamp: int
    lo: int = 0
    rows: list[Scored] = field(default_factory=list)  # every row read ranked below ``cut``
    cut: float = float("inf")


@dataclass
class NextTarget:
    """A target published but not taken yet, with the lists and memos made for it."""

    table: FragTable
    scale: float
    weight: float
    step: float
    todo: list[Shape]  # the shapes whose list is still to be made, the next first
    _memo: dict = field(default_factory=dict)
    _floors: dict = field(default_factory=dict)
    _by_shape: dict = field(default_factory=dict)
    _cache: dict = field(default_factory=dict)
    making: _Making | None = None

    @property
    def ready(self) -> bool:
        return not self.todo and self.making is None

    def shapes(self) -> set[Shape]:
        """Every shape it makes a list for: made, being made, or to make."""
        being = {self.making.shape} if self.making is not None else set()
        return set(self._cache) | set(self.todo) | being

    def swap(self, index: ShortLists) -> None:
        """Exchange the target's attributes with the pool index's (twice: back as before)."""
        for name in SWAPPED:
            mine = getattr(self, name)
            setattr(self, name, getattr(index, name))
            setattr(index, name, mine)

    def make(self, index: ShortLists, budget: int, heads: Callable[[], list[NodeView]]) -> int:
        """Read at most ``budget`` positions of the pool ``index`` into the lists being
        made; returns those read. ``heads``: the untouched head of each node kind now."""
        read = 0
        self.swap(index)  # the index scans under this target now...
        try:
            while read < budget and not self.ready:
                read += self._window(index, budget - read, heads)
        finally:
            self.swap(index)  # ...and under its own again
        return read

    def _window(self, index: ShortLists, width: int, heads: Callable[[], list[NodeView]]) -> int:
        """Scan the next ``width`` positions of the list being made (one is begun when
        none is); returns the positions read."""
        job = self.making
        if job is None:
            shape = self.todo.pop(0)
            if shape in index._cache:  # (made already: asked twice)
                return 0
            job = self.making = _Making(shape, index.clock)
        shape, n = job.shape, len(index.by_pos)
        most = index._short_len() * _RESERVE
        hi = min(n, job.lo + width)
        rows = index.rows.rows_for(shape[1], shape[0], heads(), lo=job.lo, hi=hi)
        scored: list[Scored] = []
        index._scan(rows, shape, 0, scored, ordered=True, size=most + 1)
        cut = min(job.cut, index._last_cut)
        kept = [e for e in job.rows + scored if e[0] < cut]
        if len(kept) > most + 1:
            kept = heapq.nsmallest(most + 2, kept)
            cut = kept.pop()[0]
        job.rows, job.cut, read, job.lo = kept, cut, hi - job.lo, hi
        if hi >= n:
            self._install(index, job, most)
            self.making = None
        return read

    @staticmethod
    def _install(index: ShortLists, job: _Making, most: int) -> None:
        """The list made, as a full scan keeps it (:meth:`.packshort.ShortLists._lookup`)."""
        ranked = sorted(job.rows)
        index._cache[job.shape] = filed(job.stamp, ranked, job.cut, index._short_len(), most)
