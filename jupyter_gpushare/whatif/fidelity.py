"""How closely a replay under the record's own policy reproduces what the broker decided."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from ..core.model import UNIT
from .replay import GrantRecord


@dataclass(frozen=True)
class Fidelity:
    """Share of recorded grants replayed on the same node and GPUs; GPU-hours per team."""

    recorded: int
    same_place: int
    missing: tuple[str, ...]  # recorded request ids the replay did not grant
    moved: tuple[str, ...]  # granted elsewhere
    hours_recorded: dict[str, float]
    hours_replayed: dict[str, float]

    @property
    def exact_share(self) -> float:
        return self.same_place / self.recorded if self.recorded else 1.0

    def hours_error(self, team: str) -> float:
        """Relative difference of the team's GPU-hours (0.01 = 1 %)."""
        want = self.hours_recorded.get(team, 0.0)
        got = self.hours_replayed.get(team, 0.0)
        return abs(got - want) / want if want else abs(got)


def gpu_hours(grants: Sequence[GrantRecord], start: float, end: float,
              key: str = "team") -> dict[str, float]:
    """GPU-hours per team (or pool) of the grants inside ``[start, end)``; a grant never
    released counts up to ``end``."""
    out: dict[str, float] = defaultdict(float)
    for g in grants:
        released = g.released_at if g.released_at is not None else end
        span = min(released, end) - max(g.granted_at, start)
        if span > 0:
            out[getattr(g, key)] += g.units_milli * span / UNIT / 3600.0
    return dict(out)


def compare_grants(recorded: Sequence[GrantRecord], replayed: Sequence[GrantRecord],
                   start: float, end: float) -> Fidelity:
    """Match grants by request id: same node and the same GPUs counts as reproduced."""
    by_id = {g.request_id: g for g in replayed}
    same, missing, moved = 0, [], []
    for g in recorded:
        mine = by_id.get(g.request_id)
        if mine is None:
            missing.append(g.request_id)
        elif mine.node == g.node and sorted(mine.gpus) == sorted(g.gpus):
            same += 1
        else:
            moved.append(g.request_id)
    return Fidelity(len(recorded), same, tuple(missing), tuple(moved),
                    gpu_hours(recorded, start, end), gpu_hours(replayed, start, end))
