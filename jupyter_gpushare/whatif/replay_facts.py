"""The admission facts the what-if replay gives the core, as the broker's
:func:`~jupyter_gpushare.broker.service.lifecycle.facts` does: GPU-hours of the month, the
teams waiting inside their guarantee in a pool (kept until the state, the queue or the
preempting requests change), and the broker's queue limits. Pure (no I/O).

A part :class:`~.replay.Replay` holds: it is handed the policy, the cluster state, the queue,
the ledger and the preempting requests (the replay's own objects, read here, never changed),
and keeps the guarantees, whether budgets count, the queue limits and the cache of waiting
teams; the replay tells it when the preempting requests change
(:meth:`ReplayFacts.pending_changed`).
"""

from __future__ import annotations

from ..core.admission import AdmissionFacts, Decision, Outcome
from ..core.model import Policy, Request
from ..core.state import ClusterState
from .queue import ReplayQueue
from .replay_ledger import _Ledger
from .replay_records import QueueLimits, _Pending


def has_budgets(policy: Policy) -> bool:
    """Whether any quota of the policy has a monthly GPU-hour budget."""
    return any(q.gpu_hours_per_month is not None for t in policy.teams for _, q in t.quotas)


class ReplayFacts:
    """What the core is told with each decision, and the broker's queue limits."""

    def __init__(
        self,
        policy: Policy,
        state: ClusterState,
        queue: ReplayQueue,
        ledger: _Ledger,
        pending: dict[str, _Pending],
        *,
        limits: QueueLimits,
        budgets: bool | None = None,
    ) -> None:
        self.state = state
        self.queue = queue
        self.ledger = ledger
        self.pending = pending  # request id -> a preempting request (the replay's, read only)
        self.limits = limits
        self.budgets = has_budgets(policy) if budgets is None else budgets
        self.guarantees = {
            (t.name, pool): q.guaranteed_milli for t in policy.teams for pool, q in t.quotas
        }
        self.pending_version = 0
        self._waiting_cache: dict[str, tuple[tuple[int, int, int], frozenset[tuple[str, str]]]] = {}

    def pending_changed(self) -> None:
        """The preempting requests changed: the waiting teams are read again."""
        self.pending_version += 1

    def facts(self, now: float, req: Request, retry: bool = False) -> AdmissionFacts:
        """The broker's :func:`~jupyter_gpushare.broker.service.lifecycle.facts`.

        Which teams wait inside their guarantee is read by the core only for a request
        that would borrow (above its own guarantee): for one inside it, the set is left
        empty, which changes no decision and saves a pass over the waiting teams."""
        key = (req.team, req.pool)
        hours = {key: self.ledger.hours(key, now)} if self.budgets else {}
        if self._within_guarantee(req.team, req.pool, req.gpu.units_milli):
            return AdmissionFacts(now=now, gpu_hours_used=hours, retry=retry)
        return AdmissionFacts(
            now=now,
            gpu_hours_used=hours,
            waiting_within_guarantee=self._waiting(req.pool),
            retry=retry,
        )

    def _waiting(self, pool: str) -> frozenset[tuple[str, str]]:
        """Teams with a queued or preempting request inside their guarantee in ``pool``.

        The core reads this set for *other* teams only, so the broker's "excluding the
        request itself" (which changes only the request's own team) is left out, and the
        set is kept until the state, the queue or the preempting requests change."""
        key = (self.state.version, self.queue.version, self.pending_version)
        hit = self._waiting_cache.get(pool)
        if hit is not None and hit[0] == key:
            return hit[1]
        waiting: set[tuple[str, str]] = set()
        for team in self.queue.teams_waiting(pool):
            smallest = self.queue.smallest_waiting(team, pool)
            if smallest is not None and self._within_guarantee(team, pool, smallest):
                waiting.add((team, pool))
        for pend in self.pending.values():
            other = pend.request
            if other.pool == pool and self._within_guarantee(
                other.team, pool, other.gpu.units_milli
            ):
                waiting.add((other.team, pool))
        found = frozenset(waiting)
        self._waiting_cache[pool] = (key, found)
        return found

    def _within_guarantee(self, team_name: str, pool: str, units_milli: int) -> bool:
        guaranteed = self.guarantees.get((team_name, pool))
        if guaranteed is None:
            return False
        return self.state.team_used(team_name, pool) + units_milli <= guaranteed

    def queue_limit(self, req: Request) -> Decision | None:
        lim = self.limits
        if lim.per_user and self.queue.per_user[req.user] >= lim.per_user:
            return Decision(Outcome.REFUSED, "queue limit per user", "queue_limit")
        if lim.per_team and self.queue.per_team[req.team] >= lim.per_team:
            return Decision(Outcome.REFUSED, "queue limit per team", "queue_limit")
        return None
