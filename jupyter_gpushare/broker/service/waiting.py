"""Waiting requests: the queue of batch requests, kept in decision order with counts for
the limits, and the requests waiting for preemption victims to leave (:class:`Pending`).

:class:`WaitQueue` behaves like the ``dict`` of queued requests by id it replaces (``in``,
``get``, ``pop``, ``values``, ``len``), and keeps, updated in O(log n) per change:

* per pool, the requests in decision order (priority value, then age, then id), so the
  order and a request's position need no sort;
* counts per user and per team (the queue limits, ``GET /teams/{team}/usage``);
* per (team, pool), how many requests of each size wait, so that "which teams wait inside
  their guarantee" (an admission fact) costs one look per team, not a pass over the queue.
"""

from __future__ import annotations

import bisect
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ...core.model import Request

LIVE_STATUSES = ("queued", "preempting")
"""The statuses of a request that still waits (the database's; rebuilt into memory at start)."""

SortKey = tuple[int, float, str]
Shape = tuple[Any, ...]


def shape_of(req: Request) -> Shape:
    """What the core's answer to a queued request depends on, besides its user and age:
    requests of one shape get the same answer (the per-user cap aside)."""
    return (
        req.team,
        req.pool,
        req.gpu,
        req.priority,
        req.cpu_milli,
        req.memory_mib,
        req.gpu_models,
        req.checkpointing,
        req.max_runtime_s,
        req.kind,
    )


@dataclass
class Pending:
    """A request waiting for preemption victims to leave."""

    request: Request
    victims: set[str]
    deadline: float
    reason: str


class WaitQueue:
    """Queued requests by id, ordered per pool; see the module's docstring."""

    def __init__(self, priority_of: Callable[[str], int]) -> None:
        self.priority_of = priority_of
        self._by_id: dict[str, Request] = {}
        self._keys: dict[str, SortKey] = {}
        self._order: dict[str, list[SortKey]] = defaultdict(list)  # pool -> sorted keys
        self.per_user: Counter[str] = Counter()
        self.per_team: Counter[str] = Counter()
        self.per_team_pool: Counter[tuple[str, str]] = Counter()
        self.sizes: dict[tuple[str, str], Counter[int]] = defaultdict(Counter)
        # pool -> shape -> sorted keys of the requests of that shape
        self._groups: dict[str, dict[Shape, list[SortKey]]] = defaultdict(dict)
        self._shapes: dict[str, Shape] = {}

    # -- dict-like -------------------------------------------------------------------------

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._by_id

    def __len__(self) -> int:
        return len(self._by_id)

    def __bool__(self) -> bool:
        return bool(self._by_id)

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_id)

    def __getitem__(self, request_id: str) -> Request:
        return self._by_id[request_id]

    def __setitem__(self, request_id: str, req: Request) -> None:
        assert request_id == req.id
        self.add(req)

    def get(self, request_id: str, default: Request | None = None) -> Request | None:
        return self._by_id.get(request_id, default)

    def values(self) -> Iterator[Request]:
        return iter(list(self._by_id.values()))

    def items(self) -> Iterator[tuple[str, Request]]:
        return iter(list(self._by_id.items()))

    def clear(self) -> None:
        for rid in list(self._by_id):
            self.pop(rid)

    # -- changes ---------------------------------------------------------------------------

    def _key(self, req: Request) -> SortKey:
        return (-self.priority_of(req.priority), req.created_at, req.id)

    def add(self, req: Request) -> None:
        if req.id in self._by_id:
            self.pop(req.id)
        key = self._key(req)
        self._by_id[req.id] = req
        self._keys[req.id] = key
        bisect.insort(self._order[req.pool], key)
        shape = self._shapes[req.id] = shape_of(req)
        bisect.insort(self._groups[req.pool].setdefault(shape, []), key)
        self.per_user[req.user] += 1
        self.per_team[req.team] += 1
        self.per_team_pool[(req.team, req.pool)] += 1
        self.sizes[(req.team, req.pool)][req.gpu.units_milli] += 1

    def pop(self, request_id: str, default: Request | None = None) -> Request | None:
        req = self._by_id.pop(request_id, None)
        if req is None:
            return default
        key = self._keys.pop(request_id)
        order = self._order[req.pool]
        i = bisect.bisect_left(order, key)
        if i < len(order) and order[i] == key:
            del order[i]
        shape = self._shapes.pop(request_id)
        group = self._groups[req.pool][shape]
        j = bisect.bisect_left(group, key)
        if j < len(group) and group[j] == key:
            del group[j]
        if not group:
            del self._groups[req.pool][shape]
        _dec(self.per_user, req.user)
        _dec(self.per_team, req.team)
        _dec(self.per_team_pool, (req.team, req.pool))
        sizes = self.sizes[(req.team, req.pool)]
        _dec(sizes, req.gpu.units_milli)
        if not sizes:
            del self.sizes[(req.team, req.pool)]
        return req

    def reorder(self) -> None:
        """Sort again with the current priority values (after a policy change)."""
        reqs = list(self._by_id.values())
        self.clear()
        for req in reqs:
            self.add(req)

    # -- reading ---------------------------------------------------------------------------

    def ordered(self, pool: str | None = None) -> list[Request]:
        """Waiting requests in decision order (of one pool, or of all pools merged)."""
        if pool is not None:
            return [self._by_id[key[2]] for key in self._order.get(pool, ())]
        keys = sorted(k for order in self._order.values() for k in order)
        return [self._by_id[key[2]] for key in keys]

    def key(self, request_id: str) -> SortKey:
        return self._keys[request_id]

    def shapes(self, pool: str) -> list[Shape]:
        """The distinct shapes waiting in the pool."""
        return list(self._groups.get(pool, {}))

    def first_of(
        self,
        pool: str,
        shape: Shape,
        capped: set[tuple[str, int]],
        after: SortKey | None = None,
    ) -> Request | None:
        """The first request of ``shape`` (after ``after``) whose (user, units) is not capped."""
        group = self._groups.get(pool, {}).get(shape, [])
        start = bisect.bisect_right(group, after) if after is not None else 0
        for key in group[start:] if start else group:
            req = self._by_id[key[2]]
            if not capped or (req.user, req.gpu.units_milli) not in capped:
                return req
        return None

    def pools(self) -> list[str]:
        return [p for p, order in self._order.items() if order]

    def position(self, request_id: str) -> int | None:
        """1-based place of the request in its pool's order."""
        req = self._by_id.get(request_id)
        if req is None:
            return None
        return bisect.bisect_left(self._order[req.pool], self._keys[request_id]) + 1

    def smallest_waiting(
        self, team: str, pool: str, excluding: Request | None = None
    ) -> int | None:
        """The smallest ask (milli-units) of the team's queued requests in the pool."""
        sizes = self.sizes.get((team, pool))
        if not sizes:
            return None
        skip = (
            excluding.gpu.units_milli
            if excluding is not None
            and excluding.id in self._by_id
            and excluding.team == team
            and excluding.pool == pool
            else None
        )
        for units in sorted(sizes):
            if units == skip and sizes[units] <= 1:
                continue
            return units
        return None

    def teams_waiting(self, pool: str) -> list[str]:
        return [t for (t, p) in self.sizes if p == pool]


def _dec(counter: Counter, key: object) -> None:  # type: ignore[type-arg]
    counter[key] -= 1
    if counter[key] <= 0:
        del counter[key]
