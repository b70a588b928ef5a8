"""The what-if replay's GPU-hours of the current UTC month per (team, pool), as the broker's
``MonthLedger`` counts them for monthly budgets. Pure (no I/O)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from ..core.ledger import month_bounds, month_of
from ..core.model import UNIT
from .replay_records import GrantRecord


@dataclass
class _Ledger:
    """GPU-hours of the current UTC month per (team, pool) (the broker's ``MonthLedger``)."""

    month: tuple[int, int] = (0, 0)
    start: float = 0.0
    closed: dict[tuple[str, str], float] = field(default_factory=lambda: defaultdict(float))
    live: dict[str, GrantRecord] = field(default_factory=dict)
    history: list[GrantRecord] = field(default_factory=list)

    def hours(self, key: tuple[str, str], now: float) -> float:
        if month_of(now) != self.month:
            self._reset(now)
        live = sum(
            r.units_milli * (now - max(r.granted_at, self.start))
            for r in self.live.values()
            if (r.team, r.pool) == key
        )
        return self.closed.get(key, 0.0) + max(0.0, live) / UNIT / 3600.0

    def _reset(self, now: float) -> None:
        self.month = month_of(now)
        self.start = month_bounds(*self.month)[0]
        self.closed = defaultdict(float)
        for r in self.history:
            if r.released_at is not None and r.released_at > self.start:
                begin = max(r.granted_at, self.start)
                hours = r.units_milli * (r.released_at - begin) / UNIT / 3600
                self.closed[(r.team, r.pool)] += hours

    def close(self, record: GrantRecord) -> None:
        self.live.pop(record.request_id, None)
        self.history.append(record)
        assert record.released_at is not None
        if self.month != (0, 0) and record.released_at > self.start:
            begin = max(record.granted_at, self.start)
            self.closed[(record.team, record.pool)] += (
                record.units_milli * (record.released_at - begin) / UNIT / 3600
            )
