"""Short lists: a shape's best nodes kept between decisions, and the reserve behind them.

After a full scan for a shape, its best ``short_len()`` nodes are kept with a bound below
which the list is complete; a later request of the shape is answered from the list plus
the nodes changed since (never more than a full scan would score), and the answer is the
full scan's. A full scan (but a shape's first after a new target) also keeps ``_RESERVE``
times the list's length of its next-best nodes, which refill a list that runs out; when
list and reserve have run out, the next scan carries on from where they ended
(:meth:`ShortLists._beyond`) instead of reading every row again. Between requests
(:func:`.placement.make_ahead`) the stalest lists are brought up to date and those running
low carried on (:meth:`ShortLists.freshen`), so that the request finds its list ready.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from .fragmentation import Shape
from .packrows import NodeView, Row, RowTable, head_row
from .packscan import RankedScan, Scored


class ShortLists(RankedScan):
    """The pool's short lists per shape (the pool index's ``_cache``), read and refilled."""

    rows: RowTable
    clock: int  # refreshes so far
    changed: dict[int, int]  # position -> clock of its last refresh, oldest first
    _cache: dict[Shape, _Cached]

    def _lookup(self, shape: Shape, mem: int, heads: list[NodeView]) -> Scored | None:
        """The best node for ``shape`` with ``mem`` RAM: from the shape's short list when it
        proves the answer, else by a full scan that makes the list (and its reserve) anew.
        ``heads``: the untouched head of each node kind."""
        cpu, milli = shape[0], shape[1]
        cache, stamp = self._cache, self.clock
        cached = cache.pop(shape, None)
        if cached is not None:
            cache[shape] = cached  # (the shapes in the order last asked: see _CACHE_SHAPES)
        elif len(cache) >= _CACHE_SHAPES:
            del cache[next(iter(cache))]
        parts: list[tuple[float, Iterable[Row]]] = []
        if cached is not None:
            hit = self._from_cache(cached, shape, mem, heads)
            if hit is not _MISS:
                return hit  # type: ignore[return-value]
            if not cached.short:
                parts = self._beyond(cached.rbound, milli, cpu, heads)
        scored: list[Scored] = []
        rows = () if parts else self.rows.rows_for(milli, cpu, heads)
        keep = self._short_len()
        # the short list and its reserve; none on a shape's first scan after a new target
        # (memos are cold then, and a wider cut would compute more gradients)
        most = keep * _RESERVE if cached is not None else keep
        found = self._scan(rows, shape, mem, scored, ordered=True, size=most + 1, parts=parts)
        if len(scored) > most:
            ranked = heapq.nsmallest(most + 1, scored)
            rbound = ranked.pop()[0]
        else:
            ranked, rbound = sorted(scored), float("inf")
        bound = ranked[keep][0] if len(ranked) > keep else rbound
        reserve = {e[2].pos: (e, stamp) for e in ranked[keep:]}
        self._cache[shape] = _Cached(stamp, bound, ranked[:keep], rbound, reserve)
        return found[0] if found else None

    def _beyond(
        self, rbound: float, milli: int, cpu: int, heads: list[NodeView]
    ) -> list[tuple[float, Iterable[Row]]]:
        """The rows of a full scan that carries on where a short list ran out, in parts
        for :meth:`._scan`: no node fitting the shape ranks below ``rbound`` (its list
        and reserve held all those, and none is left), so a node at a position from the
        bound's own ranks at least the bound's step, one before it a step more.

        A rank is the step of the node's gradient times the pool's size plus its
        position: from the bound's position the scan reads on until the step it found
        stops being beaten, then the positions before it in the next step. An ordered
        scan from position 0 stops only where the least gradient, ``-demand``, could
        no longer beat what it found: most often never (every row read), where this
        reads from the bound on (issue 29: cpu-heavy at ``--scale 10``, the lists
        that ran out were most of its decisions over 10 ms).
        """
        n = len(self.by_pos)
        step, at = divmod(int(rbound), n)
        rows = self.rows
        return [
            (float(step * n), rows.rows_for(milli, cpu, heads, lo=at)),
            (float((step + 1) * n), rows.rows_for(milli, cpu, heads, hi=at)),
        ]

    def _short_len(self) -> int:
        """Nodes per short list: a big pool's best nodes run out later."""
        return max(_SHORT_LIST, len(self.by_pos) // _SHORT_SHARE)

    def _from_cache(
        self, cached: _Cached, shape: Shape, mem: int, heads: list[NodeView]
    ) -> Scored | None | object:
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
        merged, fresh, _ = self._bring_up(cached, shape, mem, heads)
        for e in merged:
            if e[1] >= mem:
                return e
        if cached.reserve:
            return self._refill(cached, merged, fresh, mem)
        # a list that holds every node fitting all but RAM (no bound) proves none has room
        return None if cached.rbound == float("inf") else _MISS

    def _bring_up(
        self, cached: _Cached, shape: Shape, mem: int, heads: list[NodeView]
    ) -> tuple[list[Scored], set[int], int]:
        """Bring a shape's list up to date: score again the nodes changed since it was made
        and the heads of untouched kinds (the scan prunes against the best with room for
        ``mem``; any ``mem`` leaves a list true to its invariant). Returns the list, the
        positions scored again and the rows that read."""
        since = cached.stamp
        changed: set[int] = set()
        for pos in reversed(self.changed):
            if self.changed[pos] <= since:
                break
            changed.add(pos)
        fresh = changed.union(h.pos for h in heads)
        rows = [head_row(h) for h in heads] + self.rows.changed_rows(changed, shape[1])
        merged: list[Scored] = [
            e for e in cached.short if e[2].pos not in fresh and not e[2].pristine
        ]
        rescored: list[Scored] = []
        self._scan(rows, shape, mem, rescored, size=self._short_len() + 1)
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
        return merged, fresh, len(rows)

    def freshen(self, budget: int, heads: list[NodeView]) -> int:
        """Between requests: carry on the lists running low (:meth:`_extend`), then bring
        the stalest up to date, oldest first; at most about ``budget`` rows read (each
        costs about five times a position of a next target's windows: 2.1 against 0.4 us
        on cpu-heavy at ``--scale 10``; charged at four, the steps were no shorter, their
        longest being collections and windows). Returns the rows read (0: nothing to do).

        A list is used with the nodes changed since it was made scored again, so the
        request of a shape asked rarely paid for every node changed in between, and a
        list that ran out carried its scan on inside the request (issue 29: cpu-heavy at
        ``--scale 10`` in the broker, 1,045 and 631 of the 1,756 granted decisions over
        1 ms). Done here instead, each list stays true to its invariant, so every later
        answer is the one it would have been: the full scan's. Lists at least ``_STALE``
        refreshes old are brought up to date; lists with fewer entries than
        ``_LOW_WATER`` short lists are carried on."""
        clock, low, inf = self.clock, self._short_len() * _LOW_WATER, float("inf")
        due = sorted(
            (c.rbound == inf or len(c.short) + len(c.reserve) >= low, c.stamp, shape)
            for shape, c in self._cache.items()
            if clock - c.stamp >= _STALE or (c.rbound < inf and len(c.short) + len(c.reserve) < low)
        )
        read = 0
        for plenty, _, shape in due:
            if read >= budget:
                break
            cached = self._cache[shape]
            if plenty:
                read += self._bring_up(cached, shape, 0, heads)[2]
            else:
                read += self._extend(cached, shape, heads)
        return read

    def _extend(self, cached: _Cached, shape: Shape, heads: list[NodeView]) -> int:
        """Bring a list running low up to date and carry it on past its reserve's bound
        (as :meth:`_beyond`, but beside the entries it still has), so that the request
        that would have found it run out finds it full; returns the rows read.

        Its entries and valid reserve are every node ranked below ``rbound``; a node not
        among them ranks at least ``rbound``, which is all the carried-on scan's stop
        assumes (a node of the list it reads again is kept once)."""
        merged, fresh, read = self._bring_up(cached, shape, 0, heads)
        if cached.rbound == float("inf"):
            return read  # the list holds every node that fits: nothing lies beyond
        have = {e[2].pos: e for e in merged}
        for e in self._reserve_held(cached, fresh):
            have.setdefault(e[2].pos, e)
        counted = [0]
        parts = [
            (floor, _counted(rows, counted))
            for floor, rows in self._beyond(cached.rbound, shape[1], shape[0], heads)
        ]
        keep = self._short_len()
        most = keep * _RESERVE
        scored: list[Scored] = []
        self._scan((), shape, 0, scored, ordered=True, size=most + 1, parts=parts)
        cut = self._last_cut
        for e in scored:
            have[e[2].pos] = e
        ranked = sorted(e for e in have.values() if e[0] < cut)
        self._cache[shape] = filed(self.clock, ranked, cut, keep, most)
        return read + counted[0]

    def _reserve_held(self, cached: _Cached, fresh: set[int]) -> Iterator[Scored]:
        """The reserve's valid entries ranked below its bound (below its rank the list is
        no longer known complete). An entry is valid when made at this clock, or when its
        node has not changed since it was made and is not untouched (an untouched node is
        scored only as the head of its kind, and every head is in ``fresh``: scored again)."""
        now, changed, rbound = self.clock, self.changed, cached.rbound
        for e, made in cached.reserve.values():
            pos = e[2].pos
            if e[0] < rbound and (
                made == now or (pos not in fresh and not e[2].pristine and changed[pos] <= made)
            ):
                yield e

    def _refill(
        self, cached: _Cached, short: list[Scored], fresh: set[int], mem: int
    ) -> Scored | None | object:
        """The short list has no node with room: take the reserve's valid entries into it
        (:meth:`_reserve_held`)."""
        now = self.clock
        ranked = list(short)
        ranked.extend(self._reserve_held(cached, fresh))
        ranked.sort()
        keep = self._short_len()
        cached.short = ranked[:keep]
        cached.bound = ranked[keep][0] if len(ranked) > keep else cached.rbound
        cached.reserve = {e[2].pos: (e, now) for e in ranked[keep:]}
        for e in ranked:
            if e[1] >= mem:
                return e
        return None if cached.rbound == float("inf") else _MISS


def filed(stamp: int, ranked: list[Scored], cut: float, keep: int, most: int) -> _Cached:
    """A shape's list as of ``stamp`` from ``ranked``, every row ranked below ``cut`` in
    rank order: its first ``keep`` the short list, the next up to ``most`` in all its
    reserve, complete below the rank of the first left out (or ``cut``)."""
    rbound = cut
    if len(ranked) > most:
        rbound = min(rbound, ranked[most][0])
        ranked = ranked[:most]
    bound = ranked[keep][0] if len(ranked) > keep else rbound
    reserve = {e[2].pos: (e, stamp) for e in ranked[keep:]}
    return _Cached(stamp, bound, ranked[:keep], rbound, reserve)


_SHORT_LIST = 24
"""Nodes kept per cached shape, at least."""

_SHORT_SHARE = 256
"""A pool of many nodes keeps one per ``_SHORT_SHARE`` of its nodes per cached shape."""

_CACHE_SHAPES = 512
"""Shapes cached per pool: when another arrives, the one asked least recently is dropped.
(All of them were, before: on multigpu-pinned, 860 GPU shapes of which many pinned to models,
that made 4,668 of 44,414 granted decisions at ``--scale 10`` first scans, 150 over 1 ms.)"""


def _counted(rows: Iterable[Row], counted: list[int]) -> Iterator[Row]:
    """``rows``, adding one to ``counted[0]`` per row read."""
    for row in rows:
        counted[0] += 1
        yield row


_STALE = 64
"""Refreshes of the pool since a short list was made above which :meth:`ShortLists.freshen`
brings it up to date between requests."""

_LOW_WATER = 1
"""A list with fewer entries than ``_LOW_WATER`` times its length, short list and reserve
together (its reserve spent), is carried on between requests (:meth:`ShortLists._extend`)."""

_MISS = object()


@dataclass
class _Cached:
    """A shape's short list: its best nodes as of ``stamp``, all those ranked below ``bound``;
    and its reserve: with the short list, every node ranked below ``rbound`` (by position:
    the entry and the clock when it was made; an entry whose node changed since is stale)."""

    stamp: int
    bound: float
    short: list[Scored]
    rbound: float
    reserve: dict[int, tuple[Scored, int]]


_RESERVE = 2
"""A full scan (but a shape's first after a new target) keeps ``_RESERVE`` times the short
list's length of its best nodes: when the short list runs out, the next ones come from the
rest without a full scan. (8 before the scans that carry on where a list ran out,
:meth:`ShortLists._beyond`: such a scan stops sooner the fewer nodes it must find. On
cpu-heavy at ``--scale 10``, ``benchmarks/placement_broker.py``: 8 / 2 / 1 gave 393 / 803 /
1,218 of them, 3.5 / 1.2 / 0.7 ms at the median, 26 / 8 / 8 over 10 ms.)"""
