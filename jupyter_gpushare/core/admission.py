"""Admission: grant, queue, preempt or refuse a request, always with a readable reason.

``decide`` looks at the policy, the live state and a few facts the broker supplies
(GPU-hours used this month, which teams have requests waiting inside their guarantee)
and returns a :class:`Decision`. It never changes the state: the broker applies a
granted decision with ``state.apply(decision.grant)`` in the same transaction as it
writes the grant to its database.

Order of checks:

1. the request is valid against the policy (pool, team quota, priority, shape, checkpoint rule);
2. the per-user cap and the team's monthly GPU-hour budget;
3. inside the team's guarantee: place it, or plan a preemption;
4. above it: borrow idle capacity up to the borrow limit, unless another team waits for
   its guarantee in this pool;
5. otherwise batch requests queue, interactive ones are refused, and the debug pool
   never queues nor preempts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum

from .model import Grant, Kind, Placement, Pool, PoolQuota, PriorityClass, Request, SharingMode
from .model import from_milli as units
from .placement import place
from .placement_why import note_ask, why_nothing_fits
from .preemption import plan_preemption
from .state import ClusterState


class Outcome(str, Enum):
    """What happened to a request."""

    GRANTED = "granted"
    PREEMPTING = "preempting"  # victims must leave first; the request waits for them
    QUEUED = "queued"
    REFUSED = "refused"


@dataclass(frozen=True)
class Decision:
    """The answer to a request: the outcome, why, and the grant or victims if any."""

    outcome: Outcome
    reason: str
    code: str = ""  # machine-readable reason: invalid, user_cap, budget, no_capacity, ...
    grant: Grant | None = None  # GRANTED: apply it; PREEMPTING: where it will land
    victims: tuple[str, ...] = ()


@dataclass(frozen=True)
class AdmissionFacts:
    """What the broker knows beyond the state."""

    now: float = 0.0
    gpu_hours_used: Mapping[tuple[str, str], float] = field(default_factory=dict)
    waiting_within_guarantee: frozenset[tuple[str, str]] = frozenset()  # (team, pool)
    retry: bool = False  # the request was decided before (queued): don't learn its shape again


def _validate(state: ClusterState, request: Request) -> str | None:
    """Why the request cannot be served by this policy at all, or ``None``."""
    policy = state.policy
    pool = policy.pool(request.pool)
    if pool is None:
        return f"unknown pool {request.pool!r}"
    team = policy.team(request.team)
    if team is None:
        return f"unknown team {request.team!r}"
    if team.quota(request.pool) is None:
        return f"team {team.name} has no quota in pool {pool.name}"
    priority = policy.priority(request.priority)
    if priority is None:
        return f"unknown priority class {request.priority!r}"
    ask = request.gpu
    if ask.is_fraction and pool.mode in (SharingMode.EXCLUSIVE, SharingMode.MIG):
        return f"pool {pool.name} hands out whole GPUs only; {ask.describe()} is a fraction"
    if ask.fraction_milli > 1000 or ask.whole < 0 or ask.fraction_milli < 0:
        return f"invalid GPU request {ask.describe()}"
    limit = priority.checkpoint_required_after_s
    if (
        request.kind is Kind.BATCH
        and priority.preemptible
        and limit is not None
        and not request.checkpointing
        and (request.max_runtime_s is None or request.max_runtime_s > limit)
    ):
        return (
            f"priority {priority.name} is preemptible: a job that runs longer than "
            f"{limit // 3600 if limit >= 3600 else limit}{'h' if limit >= 3600 else 's'} "
            "must declare checkpointing"
        )
    return None


def _why(state: ClusterState, pool: Pool, request: Request, facts: AdmissionFacts) -> str:
    """Why nothing fits (``: <cause>``), or "" where nobody reads it: a queued request decided
    again that stays queued keeps the reason it was given (the scan would be wasted)."""
    if facts.retry and request.kind is Kind.BATCH and pool.queues:
        return ""
    return f": {why_nothing_fits(state, request)}"


def _cannot_now(pool: Pool, request: Request, reason: str, code: str) -> Decision:
    if request.kind is Kind.BATCH and pool.queues:
        return Decision(Outcome.QUEUED, reason, code)
    return Decision(Outcome.REFUSED, reason, code)


def _grant(
    request: Request,
    placement: Placement,
    grant_id: str,
    borrowed: bool,
    priority: PriorityClass,
    now: float,
) -> Grant:
    return Grant(
        id=grant_id,
        request=request,
        placement=placement,
        units_milli=request.gpu.units_milli,
        borrowed=borrowed,
        priority_value=priority.value,
        preemptible=priority.preemptible or borrowed,
        granted_at=now,
        grace_period_s=priority.grace_period_s,
    )


def _limits(
    state: ClusterState, request: Request, quota: PoolQuota, facts: AdmissionFacts
) -> Decision | None:
    """Per-user cap and monthly budget; ``None`` when both allow the request."""
    pool = state.policy.pool(request.pool)
    assert pool is not None
    cap = quota.per_user_cap_milli
    if cap is not None:
        used = state.user_used(request.user, request.pool)
        if used + request.gpu.units_milli > cap:
            return _cannot_now(
                pool,
                request,
                f"user {request.user} holds {units(used):g} GPU in pool {pool.name}; "
                f"the per-user cap is {units(cap):g} GPU",
                "user_cap",
            )
    budget = quota.gpu_hours_per_month
    spent = facts.gpu_hours_used.get((request.team, request.pool), 0.0)
    if budget is not None and request.gpu.units_milli and spent >= budget:
        return Decision(
            Outcome.REFUSED,
            f"team {request.team} used {spent:.1f} of {budget:g} GPU-hours this month "
            f"in pool {pool.name}",
            "budget",
        )
    return None


def decide(
    state: ClusterState, request: Request, grant_id: str, facts: AdmissionFacts | None = None
) -> Decision:
    """Grant, plan a preemption for, queue or refuse ``request``."""
    facts = facts or AdmissionFacts()
    invalid = _validate(state, request)
    if invalid:
        return Decision(Outcome.REFUSED, invalid, "invalid")
    policy = state.policy
    pool = policy.pool(request.pool)
    team = policy.team(request.team)
    priority = policy.priority(request.priority)
    assert pool is not None and team is not None and priority is not None
    if not facts.retry:
        note_ask(state, request, pool.mode)
    quota = team.quota(pool.name)
    assert quota is not None
    limited = _limits(state, request, quota, facts)
    if limited:
        return limited

    used = state.team_used(team.name, pool.name)
    ask = request.gpu.units_milli
    guaranteed, borrow = quota.guaranteed_milli, quota.borrow_limit_milli
    status = (
        f"team {team.name} uses {units(used):g} of {units(guaranteed):g} guaranteed GPUs "
        f"in pool {pool.name}"
    )
    if used + ask <= guaranteed:
        placement = place(state, request, observe=not facts.retry)
        if placement is not None:
            grant = _grant(request, placement, grant_id, False, priority, facts.now)
            return Decision(
                Outcome.GRANTED, f"granted inside the guarantee; {status}", "guaranteed", grant
            )
        if pool.queues:
            plan = plan_preemption(state, request, priority.value, facts.now)
            if plan is not None:
                grant = _grant(request, plan.placement, grant_id, False, priority, facts.now)
                return Decision(
                    Outcome.PREEMPTING,
                    f"reclaiming {len(plan.victims)} grant(s) on {plan.placement.node} "
                    f"for team {team.name}'s guarantee",
                    "preempting",
                    grant,
                    plan.victims,
                )
        return _cannot_now(
            pool,
            request,
            f"{status}; no GPU in the pool fits {request.gpu.describe()}"
            f"{_why(state, pool, request, facts)}; nothing may be preempted for it",
            "no_capacity",
        )

    if used + ask > guaranteed + borrow:
        return _cannot_now(
            pool,
            request,
            f"{status}; borrowing {request.gpu.describe()} would pass its borrow limit "
            f"of {units(borrow):g}",
            "quota",
        )
    waiting = sorted(
        t for t, p in facts.waiting_within_guarantee if p == pool.name and t != team.name
    )
    if waiting:
        return _cannot_now(
            pool,
            request,
            f"{status}; idle capacity is held for team {', '.join(waiting)} waiting for "
            "its guarantee",
            "reserved",
        )
    placement = place(state, request, observe=not facts.retry)
    if placement is not None:
        grant = _grant(request, placement, grant_id, True, priority, facts.now)
        return Decision(
            Outcome.GRANTED,
            f"granted as borrowed (preemptible) capacity; {status}",
            "borrowed",
            grant,
        )
    return _cannot_now(
        pool,
        request,
        f"{status}; nothing to borrow for {request.gpu.describe()}"
        f"{_why(state, pool, request, facts)}",
        "no_capacity",
    )
