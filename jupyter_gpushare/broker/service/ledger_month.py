"""GPU-hours of the current month per (team, pool), kept up to date in O(1) per change."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from ...core.model import UNIT, Grant


@dataclass
class MonthLedger:
    """GPU-hours of the current UTC month per (team, pool), updated in O(1) per change.

    Closed intervals are summed once; live grants are kept as (sum of units, sum of
    units x start) so their hours up to ``now`` need no scan.
    """

    month: tuple[int, int] = (0, 0)
    start: float = 0.0
    closed: dict[tuple[str, str], float] = field(default_factory=lambda: defaultdict(float))
    live_units: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))
    live_unit_start: dict[tuple[str, str], float] = field(
        default_factory=lambda: defaultdict(float)
    )

    def add(self, grant: Grant) -> None:
        key = (grant.team, grant.pool)
        self.live_units[key] += grant.units_milli
        self.live_unit_start[key] += grant.units_milli * max(grant.granted_at, self.start)

    def remove(self, grant: Grant, ended: float) -> None:
        key = (grant.team, grant.pool)
        begin = max(grant.granted_at, self.start)
        self.live_units[key] -= grant.units_milli
        self.live_unit_start[key] -= grant.units_milli * begin
        self.closed[key] += grant.units_milli * max(0.0, ended - begin) / UNIT / 3600.0

    def hours(self, key: tuple[str, str], now: float) -> float:
        live = (
            (self.live_units.get(key, 0) * now - self.live_unit_start.get(key, 0.0)) / UNIT / 3600
        )
        return self.closed.get(key, 0.0) + max(0.0, live)
