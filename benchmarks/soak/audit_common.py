"""What every audit check shares: units, the violation and outcome records, a grant's end and
the sweep over intervals that the capacity and limit checks add up."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

UNIT = 1000  # milli-units in one GPU, compute_milli of a whole card
EPS = 1e-6


@dataclass(frozen=True)
class Violation:
    check: str
    detail: str
    t: float
    refs: tuple[str, ...] = ()  # grant, request or job ids the history around it names


@dataclass
class Outcome:
    checked: dict[str, int] = field(default_factory=dict)
    violations: list[Violation] = field(default_factory=list)

    def add(self, check: str, checked: int, found: Iterable[Violation]) -> None:
        self.checked[check] = self.checked.get(check, 0) + checked
        self.violations.extend(found)


def grant_end(row: dict[str, Any], ended: float) -> float:
    return float(row["released_at"]) if row.get("released_at") is not None else ended


def sweep(
    intervals: list[tuple[float, float, str, int, str]],
) -> Iterable[tuple[float, str, int, str]]:
    """(start, end, key, amount, ref) intervals -> (t, key, total after, ref) at each start;
    an interval ending when another starts is gone first."""
    points = []
    for start, end, key, amount, ref in intervals:
        points.append((start, 1, key, amount, ref))
        points.append((end, 0, key, -amount, ref))
    points.sort(key=lambda p: (p[0], p[1]))
    totals: dict[str, int] = defaultdict(int)
    for t, starting, key, amount, ref in points:
        totals[key] += amount
        if starting:
            yield t, key, totals[key], ref

