"""The preemption planner reads only the grants some request could ever preempt.

``ClusterState.possible_victims(pool)`` keeps, per pool and in the order they were applied, the
grants that are borrowed or preemptible and not an interactive server inside its guarantee
(``could_be_victim``). ``plan_preemption`` used to read every grant of the pool for each request
that did not fit: at 21,000 live grants that was about 20 ms of CPU per such request, and a
full cluster at 500 requests/s saturated the broker (``benchmarks/broker.py --profile-open``).

Guarded here: on random clusters filled by the core's own admission (interactive servers and
batch jobs of three teams, three priority classes, borrowing, releases, preemptions under
way), the plan from the index equals, victim for victim and in order, the plan from a scan of
every grant of the pool; and every grant ``is_candidate`` accepts for any request is indexed.
"""

from __future__ import annotations

import random

import pytest
from corefactory import policy, request

from jupyter_gpushare.core.admission import AdmissionFacts, Outcome, decide
from jupyter_gpushare.core.model import Kind, PriorityClass, SharingMode
from jupyter_gpushare.core.preemption import is_candidate, plan_preemption
from jupyter_gpushare.core.state import ClusterState, could_be_victim

PRIORITIES = (
    PriorityClass("training", 1000, preemptible=False, grace_period_s=60),
    PriorityClass("interactive", 500, preemptible=False, grace_period_s=30),
    PriorityClass("research", 100, preemptible=True, grace_period_s=10),
    PriorityClass("spot", 10, preemptible=True, grace_period_s=5),
)
TEAMS = ("a", "b", "c")
POOLS = {"train": SharingMode.EXCLUSIVE, "shared": SharingMode.SHARED}


def random_ask(rng: random.Random) -> object:
    pool = rng.choice(list(POOLS))
    kw = {"whole": rng.choice((1, 1, 2))} if pool == "train" else {
        "fraction": rng.choice((0.25, 0.5, 1.0))}
    return request(rng.choice(TEAMS), pool, priority=rng.choice([p.name for p in PRIORITIES]),
                   kind=rng.choice((Kind.INTERACTIVE, Kind.BATCH)),
                   user=f"u{rng.randrange(6)}", **kw)


def scan_plan(state: ClusterState, ask: object, priority: int, now: float) -> object:
    """The plan as it was made before the index: from every grant of the pool."""
    indexed = state.possible_victims
    state.possible_victims = state.grants_in  # type: ignore[method-assign]
    try:
        return plan_preemption(state, ask, priority, now)  # type: ignore[arg-type]
    finally:
        state.possible_victims = indexed  # type: ignore[method-assign]


@pytest.mark.parametrize("seed", range(12))
def test_the_plan_from_the_index_equals_the_plan_from_every_grant(seed: int) -> None:
    rng = random.Random(seed)
    quotas = {t: {p: (rng.choice((1, 2, 3)), rng.choice((0, 2, 4))) for p in POOLS}
              for t in TEAMS}
    state = ClusterState(policy(quotas, POOLS, node_count=3, priorities=PRIORITIES))
    prio = {p.name: p.value for p in PRIORITIES}
    compared = planned = 0
    for step in range(400):
        now = float(step)
        if state.grants and rng.random() < 0.25:
            state.release(rng.choice(sorted(state.grants)))
        ask = random_ask(rng)
        decision = decide(state, ask, f"g{step}", AdmissionFacts(now=now))  # type: ignore[arg-type]
        if decision.outcome is Outcome.GRANTED and decision.grant is not None:
            state.apply(decision.grant)
        elif decision.outcome is Outcome.PREEMPTING:
            for victim in decision.victims:  # preemptions under way, as the broker marks them
                state.preempting.setdefault(victim, ask.id)  # type: ignore[attr-defined]
        for other in (ask, random_ask(rng)):
            value = prio[other.priority]  # type: ignore[attr-defined]
            got = plan_preemption(state, other, value, now)  # type: ignore[arg-type]
            assert got == scan_plan(state, other, value, now), (seed, step)
            compared += 1
            planned += got is not None
            for grant in state.grants.values():
                if is_candidate(grant, other, value):  # type: ignore[arg-type]
                    assert grant.id in state.victims_by_pool[grant.pool]
                    assert could_be_victim(grant)
    index = {gid for pool in state.victims_by_pool.values() for gid in pool}
    assert index == {g.id for g in state.grants.values() if could_be_victim(g)}
    assert compared == 800 and planned > 20, planned  # the plans were not all "none"


def test_an_interactive_server_inside_its_guarantee_is_not_indexed_and_a_borrowed_one_is() -> None:
    state = ClusterState(policy({"a": {"train": (1, 2)}}, {"train": SharingMode.EXCLUSIVE},
                                priorities=PRIORITIES))
    inside = decide(state, request("a", "train", whole=1, priority="spot"), "g1").grant
    assert inside is not None and not inside.borrowed
    state.apply(inside)
    borrowed = decide(state, request("a", "train", whole=1, priority="spot"), "g2").grant
    assert borrowed is not None and borrowed.borrowed
    state.apply(borrowed)
    batch = decide(state, request("a", "train", whole=1, priority="spot", kind=Kind.BATCH),
                   "g3").grant
    assert batch is not None
    state.apply(batch)
    assert [g.id for g in state.possible_victims("train")] == ["g2", "g3"]
    state.release("g2")
    assert [g.id for g in state.possible_victims("train")] == ["g3"]
    assert state.possible_victims("nowhere") == []
