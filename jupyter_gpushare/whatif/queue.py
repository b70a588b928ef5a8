"""The replay's queue of waiting batch requests: the broker's decision order, without I/O.

Same order as the broker's :class:`~jupyter_gpushare.broker.service.waiting.WaitQueue` (priority
value, then age, then id, per pool), the same grouping by *shape* (what the core's answer
depends on besides user and age) and the same counts the admission facts and the queue
limits read. Kept here, small, so that the simulator imports nothing of the broker.
"""

from __future__ import annotations

import bisect
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any

from ..core.model import Request

SortKey = tuple[int, float, str]
Shape = tuple[Any, ...]


def shape_of(req: Request) -> Shape:
    """What the core's answer to a queued request depends on, besides its user and age."""
    return (req.team, req.pool, req.gpu, req.priority, req.cpu_milli, req.memory_mib,
            req.gpu_models, req.checkpointing, req.max_runtime_s, req.kind)


class ReplayQueue:
    """Queued requests by id, ordered per pool and grouped by shape."""

    def __init__(self, priority_of: Callable[[str], int]) -> None:
        self.priority_of = priority_of
        self.by_id: dict[str, Request] = {}
        self.keys: dict[str, SortKey] = {}
        self.shapes_of: dict[str, Shape] = {}
        self.groups: dict[str, dict[Shape, list[SortKey]]] = defaultdict(dict)
        self.per_user: Counter[str] = Counter()
        self.per_team: Counter[str] = Counter()
        self.sizes: dict[tuple[str, str], Counter[int]] = defaultdict(Counter)
        self.version = 0  # changes with every add and pop

    def __contains__(self, request_id: object) -> bool:
        return request_id in self.by_id

    def __len__(self) -> int:
        return len(self.by_id)

    def get(self, request_id: str) -> Request | None:
        return self.by_id.get(request_id)

    def add(self, req: Request) -> None:
        if req.id in self.by_id:
            self.pop(req.id)
        key = (-self.priority_of(req.priority), req.created_at, req.id)
        self.version += 1
        self.by_id[req.id] = req
        self.keys[req.id] = key
        shape = self.shapes_of[req.id] = shape_of(req)
        bisect.insort(self.groups[req.pool].setdefault(shape, []), key)
        self.per_user[req.user] += 1
        self.per_team[req.team] += 1
        self.sizes[(req.team, req.pool)][req.gpu.units_milli] += 1

    def pop(self, request_id: str) -> Request | None:
        req = self.by_id.pop(request_id, None)
        if req is None:
            return None
        key = self.keys.pop(request_id)
        self.version += 1
        shape = self.shapes_of.pop(request_id)
        group = self.groups[req.pool][shape]
        i = bisect.bisect_left(group, key)
        if i < len(group) and group[i] == key:
            del group[i]
        if not group:
            del self.groups[req.pool][shape]
        _dec(self.per_user, req.user)
        _dec(self.per_team, req.team)
        sizes = self.sizes[(req.team, req.pool)]
        _dec(sizes, req.gpu.units_milli)
        if not sizes:
            del self.sizes[(req.team, req.pool)]
        return req

    def shapes(self, pool: str) -> list[Shape]:
        return list(self.groups.get(pool, {}))

    def first_of(self, pool: str, shape: Shape, capped: set[tuple[str, int]],
                 after: SortKey | None = None) -> Request | None:
        """The first request of ``shape`` (after ``after``) whose (user, units) is not capped."""
        group = self.groups.get(pool, {}).get(shape, [])
        start = bisect.bisect_right(group, after) if after is not None else 0
        for key in group[start:] if start else group:
            req = self.by_id[key[2]]
            if not capped or (req.user, req.gpu.units_milli) not in capped:
                return req
        return None

    def pools(self) -> list[str]:
        return [p for p, groups in self.groups.items() if groups]

    def teams_waiting(self, pool: str) -> list[str]:
        return [t for (t, p) in self.sizes if p == pool]

    def smallest_waiting(self, team: str, pool: str,
                         excluding: Request | None = None) -> int | None:
        """The smallest ask (milli-units) of the team's queued requests in the pool."""
        sizes = self.sizes.get((team, pool))
        if not sizes:
            return None
        skip = (excluding.gpu.units_milli if excluding is not None and excluding.id in self.by_id
                and excluding.team == team and excluding.pool == pool else None)
        for units in sorted(sizes):
            if units == skip and sizes[units] <= 1:
                continue
            return units
        return None


def _dec(counter: Counter, key: object) -> None:  # type: ignore[type-arg]
    counter[key] -= 1
    if counter[key] <= 0:
        del counter[key]
