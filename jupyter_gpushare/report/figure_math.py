"""The arithmetic under the monthly report's figures: hours of an interval inside the month,
median and p95 by nearest rank, a grant's measured use, the GPU-hours each team lent in a
pool, and an interval cut into days. Pure (standard library only, no I/O)."""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence

from .rows import GrantRow, UsageRow

DAY_S = 86400.0


def overlap_h(begin: float, stop: float | None, start: float, end: float) -> float:
    """Hours of ``[begin, stop)`` inside ``[start, end)`` (``stop`` None: open to ``end``)."""
    last = end if stop is None else min(stop, end)
    return max(0.0, last - max(begin, start)) / 3600.0


def median(values: Sequence[float]) -> float | None:
    return float(statistics.median(values)) if values else None


def p95(values: Sequence[float]) -> float | None:
    """The 95th percentile by nearest rank (a value that occurred)."""
    if not values:
        return None
    ordered = sorted(values)
    return float(ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)])


def _ratio(a: float, b: float) -> float | None:
    return a / b if b else None


def _grant_use(grant: GrantRow, use: UsageRow | None) -> tuple[float, float | None]:
    """(used units, memory share held) of a measured grant; (0, None) without slices."""
    if use is None:
        return 0.0, None
    used = 0.0
    mem_held = 0.0
    mem_total = 0
    for sl in grant.slices:
        g = use.gpus.get(sl.gpu_uuid)
        mem_total += sl.memory_mib
        if g is None:
            continue
        used += min(sl.compute, max(0.0, g.mean_util_pct) / 100.0)
        mem_held += min(float(sl.memory_mib), max(0.0, g.mean_memory_mib))
    if not grant.slices:  # no slices recorded: the grant's units stand for its compute
        means = [g.mean_util_pct for g in use.gpus.values()]
        used = min(grant.units, sum(max(0.0, m) for m in means) / 100.0)
    return used, (mem_held / mem_total if mem_total else None)


def _lent_hours(
    grants: Iterable[GrantRow], guaranteed: dict[str, float], start: float, end: float
) -> dict[str, float]:
    """Lent GPU-hours per team of one pool (see the module docstring), by one sweep."""
    events: list[tuple[float, int, str, float, float]] = []
    for g in grants:
        begin = max(g.granted_at, start)
        stop = end if g.released_at is None else min(g.released_at, end)
        if stop <= begin:
            continue
        borrowed = g.units if g.borrowed else 0.0
        events.append((begin, 1, g.team, g.units, borrowed))
        events.append((stop, 0, g.team, -g.units, -borrowed))
    events.sort(key=lambda e: (e[0], e[1]))
    used: dict[str, float] = defaultdict(float)
    unused = {t: max(0.0, gu) for t, gu in guaranteed.items()}
    total_unused = sum(unused.values())
    borrowed_now = 0.0
    integral = 0.0  # running integral of f = min(1, B / U) over time (seconds)
    mark: dict[str, float] = dict.fromkeys(unused, 0.0)  # integral when u last changed
    lent: dict[str, float] = dict.fromkeys(unused, 0.0)
    last_t = start
    for t, _order, team, d_used, d_borrowed in events:
        if t > last_t:
            f = min(1.0, borrowed_now / total_unused) if total_unused > 1e-12 else 0.0
            integral += f * (t - last_t)
            last_t = t
        borrowed_now = max(0.0, borrowed_now + d_borrowed)
        used[team] += d_used
        if team in unused:
            lent[team] += unused[team] * (integral - mark[team])
            mark[team] = integral
            new = max(0.0, guaranteed[team] - used[team])
            total_unused += new - unused[team]
            unused[team] = new
    if end > last_t:
        f = min(1.0, borrowed_now / total_unused) if total_unused > 1e-12 else 0.0
        integral += f * (end - last_t)
    for team in unused:
        lent[team] += unused[team] * (integral - mark[team])
    return {t: v / 3600.0 for t, v in lent.items()}


def _split_days(begin: float, stop: float, start: float, days: int) -> Iterable[tuple[int, float]]:
    """(day index, hours) pieces of ``[begin, stop)`` (already clipped to the month)."""
    t = begin
    while t < stop:
        day = int((t - start) // DAY_S)
        day_end = min(stop, start + (day + 1) * DAY_S)
        if 0 <= day < days:
            yield day, (day_end - t) / 3600.0
        t = day_end
