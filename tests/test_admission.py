"""Admission decisions and the reasons people read."""

from __future__ import annotations

from corefactory import PRIORITIES, policy, request

from jupyter_gpushare.core.admission import AdmissionFacts, Outcome, decide
from jupyter_gpushare.core.model import Kind, PriorityClass, SharingMode
from jupyter_gpushare.core.preemption import is_candidate, plan_preemption
from jupyter_gpushare.core.state import ClusterState

TRAIN = {"train": SharingMode.EXCLUSIVE}


def grant(state: ClusterState, req, gid: str, **facts):  # type: ignore[no-untyped-def]
    decision = decide(state, req, gid, AdmissionFacts(**facts))
    assert decision.outcome is Outcome.GRANTED, decision.reason
    assert decision.grant is not None
    state.apply(decision.grant)
    return decision.grant


def test_inside_guarantee_is_granted_and_not_borrowed() -> None:
    state = ClusterState(policy({"vision": {"train": (2, 0)}}, TRAIN))
    g = grant(state, request("vision", "train", whole=2), "g1")
    assert not g.borrowed and not g.preemptible
    assert len(g.placement.slices) == 2
    assert state.team_used("vision", "train") == 2000


def test_over_guarantee_without_borrow_limit_is_refused_with_the_figures() -> None:
    state = ClusterState(policy({"vision": {"train": (1, 0)}}, TRAIN))
    grant(state, request("vision", "train", whole=1), "g1")
    decision = decide(state, request("vision", "train", whole=1), "g2")
    assert decision.outcome is Outcome.REFUSED
    assert decision.code == "quota"
    assert "team vision uses 1 of 1 guaranteed GPUs in pool train" in decision.reason


def test_borrowed_grant_is_preemptible_and_counted() -> None:
    state = ClusterState(policy({"a": {"train": (1, 2)}, "b": {"train": (3, 0)}}, TRAIN))
    grant(state, request("a", "train", whole=1), "g1")
    g = grant(state, request("a", "train", whole=2), "g2")
    assert g.borrowed and g.preemptible
    assert state.team_borrowed("a", "train") == 2000


def test_no_borrowing_while_another_team_waits_for_its_guarantee() -> None:
    state = ClusterState(policy({"a": {"train": (1, 3)}, "b": {"train": (3, 0)}}, TRAIN))
    grant(state, request("a", "train", whole=1), "g1")
    facts = AdmissionFacts(waiting_within_guarantee=frozenset({("b", "train")}))
    decision = decide(state, request("a", "train", whole=1, kind=Kind.BATCH,
                                     priority="training"), "g2", facts)
    assert decision.outcome is Outcome.QUEUED
    assert decision.code == "reserved" and "team b" in decision.reason


def test_owner_reclaims_borrowed_capacity_by_preemption() -> None:
    state = ClusterState(policy({"a": {"train": (1, 3)}, "b": {"train": (3, 0)}}, TRAIN))
    grant(state, request("a", "train", whole=1), "g1", now=0)
    grant(state, request("a", "train", whole=3, priority="training"), "g2", now=10)
    decision = decide(state, request("b", "train", whole=2), "g3", AdmissionFacts(now=20))
    assert decision.outcome is Outcome.PREEMPTING
    assert decision.victims == ("g2",)
    assert decision.grant is not None and decision.grant.placement.node == "train-n0"


def test_preemption_picks_the_victim_that_loses_least_work() -> None:
    quotas = {"a": {"train": (0, 4)}, "b": {"train": (4, 0)}}
    state = ClusterState(policy(quotas, TRAIN))
    grant(state, request("a", "train", whole=1), "old", now=0)
    grant(state, request("a", "train", whole=1), "young", now=3000)
    grant(state, request("a", "train", whole=2), "pair", now=2000)
    decision = decide(state, request("b", "train", whole=1), "g", AdmissionFacts(now=3600))
    assert decision.outcome is Outcome.PREEMPTING
    assert decision.victims == ("young",)


def test_interactive_server_inside_its_guarantee_is_never_preempted() -> None:
    state = ClusterState(policy({"a": {"train": (4, 0)}}, TRAIN))
    for i in range(4):
        grant(state, request("a", "train", whole=1, user=f"u{i}"), f"g{i}")
    decision = decide(state, request("a", "train", whole=1, priority="training",
                                     kind=Kind.BATCH), "t", AdmissionFacts(now=1))
    assert decision.outcome is Outcome.QUEUED  # over guarantee (4 of 4): waits for its own team
    assert decision.code == "quota" and not decision.victims
    state2 = ClusterState(policy({"a": {"train": (5, 0)}}, TRAIN))
    for i in range(4):
        grant(state2, request("a", "train", whole=1, user=f"u{i}"), f"g{i}")
    decision = decide(state2, request("a", "train", whole=1, priority="training",
                                      kind=Kind.BATCH), "t", AdmissionFacts(now=1))
    assert decision.outcome is Outcome.QUEUED
    assert not decision.victims


def test_higher_priority_preempts_own_teams_preemptible_research_run() -> None:
    state = ClusterState(policy({"a": {"train": (4, 0)}}, TRAIN))
    grant(state, request("a", "train", whole=4, priority="research", kind=Kind.BATCH,
                         checkpointing=True), "research")
    decision = decide(state, request("a", "train", whole=1, priority="training",
                                     kind=Kind.BATCH), "t", AdmissionFacts(now=5))
    # the team is at its guarantee (4 of 4): the training job does not fit inside it
    assert decision.outcome is Outcome.QUEUED
    state2 = ClusterState(policy({"a": {"train": (5, 0)}}, TRAIN))
    grant(state2, request("a", "train", whole=4, priority="research", kind=Kind.BATCH,
                          checkpointing=True), "research")
    decision = decide(state2, request("a", "train", whole=1, priority="training",
                                      kind=Kind.BATCH), "t", AdmissionFacts(now=5))
    assert decision.outcome is Outcome.PREEMPTING and decision.victims == ("research",)


def test_debug_pool_grants_now_or_refuses_now() -> None:
    state = ClusterState(policy({"a": {"debug": (4, 0)}}, {"debug": SharingMode.DEBUG},
                                gpus=1))
    for i in range(4):
        grant(state, request("a", "debug", fraction=0.25, user=f"u{i}"), f"g{i}")
    batch = request("a", "debug", fraction=0.25, kind=Kind.BATCH, priority="training")
    decision = decide(state, batch, "g9")
    assert decision.outcome is Outcome.REFUSED  # never queued, never preempting
    assert "no GPU in the pool fits 0.25 GPU" in decision.reason


def test_fraction_in_exclusive_pool_is_refused_as_invalid() -> None:
    state = ClusterState(policy({"a": {"train": (2, 0)}}, TRAIN))
    decision = decide(state, request("a", "train", fraction=0.5), "g")
    assert decision.outcome is Outcome.REFUSED and decision.code == "invalid"
    assert "whole GPUs only" in decision.reason


def test_long_preemptible_job_without_checkpointing_is_refused() -> None:
    state = ClusterState(policy({"a": {"train": (2, 0)}}, TRAIN))
    long_job = request("a", "train", whole=1, priority="research", kind=Kind.BATCH,
                       max_runtime_s=3 * 3600)
    decision = decide(state, long_job, "g")
    assert decision.outcome is Outcome.REFUSED
    assert "must declare checkpointing" in decision.reason
    short_job = request("a", "train", whole=1, priority="research", kind=Kind.BATCH,
                        max_runtime_s=600)
    assert decide(state, short_job, "g2").outcome is Outcome.GRANTED


def test_per_user_cap_and_monthly_budget() -> None:
    state = ClusterState(policy({"a": {"train": (4, 0)}}, TRAIN, per_user_cap=1,
                                budgets={"a": 100.0}))
    grant(state, request("a", "train", whole=1, user="ann"), "g1")
    capped = decide(state, request("a", "train", whole=1, user="ann"), "g2")
    assert capped.outcome is Outcome.REFUSED and capped.code == "user_cap"
    assert "per-user cap is 1 GPU" in capped.reason
    facts = AdmissionFacts(gpu_hours_used={("a", "train"): 100.0})
    broke = decide(state, request("a", "train", whole=1, user="bob"), "g3", facts)
    assert broke.outcome is Outcome.REFUSED and broke.code == "budget"
    assert "used 100.0 of 100 GPU-hours this month" in broke.reason


def test_unknown_references_are_refused_as_invalid() -> None:
    state = ClusterState(policy({"a": {"train": (1, 0)}}, TRAIN))
    assert "unknown pool" in decide(state, request("a", "nope", whole=1), "g").reason
    assert "unknown team" in decide(state, request("zz", "train", whole=1), "g").reason
    bad = request("a", "train", whole=1, priority="urgent")
    assert "unknown priority class" in decide(state, bad, "g").reason


def test_a_retried_decision_does_not_teach_placement_the_shape_again() -> None:
    from jupyter_gpushare.core.placement import _index

    state = ClusterState(policy({"a": {"shared": (4, 0)}}, {"shared": SharingMode.SHARED}))
    req = request("a", "shared", fraction=0.25)
    decide(state, req, "g1")
    seen = _index(state).workload.seen
    decide(state, req, "g1", AdmissionFacts(retry=True))
    assert _index(state).workload.seen == seen
    decide(state, req, "g1")
    assert _index(state).workload.seen == seen + 1


# -- "an interactive server inside its team's guarantee is never preempted" -------------------
# With the stock priority classes an interactive server is also non-preemptible, so the rule
# could be removed unnoticed: these use a preemptible class that interactive servers may run
# at ("spot", below every other), so only the rule itself keeps them safe.

SPOT = PRIORITIES + (PriorityClass("spot", 50, preemptible=True, grace_period_s=5),)


def _spot_state(quotas: dict, pools: dict | None = None, gpus: int = 4) -> ClusterState:
    return ClusterState(policy(quotas, pools or TRAIN, gpus=gpus, priorities=SPOT))


def test_own_team_never_preempts_its_interactive_spot_server_inside_the_guarantee() -> None:
    state = _spot_state({"a": {"train": (5, 0)}})
    for i in range(4):
        grant(state, request("a", "train", whole=1, priority="spot", user=f"u{i}"), f"s{i}")
    job = request("a", "train", whole=1, priority="training", kind=Kind.BATCH)
    decision = decide(state, job, "t", AdmissionFacts(now=100))
    assert decision.outcome is Outcome.QUEUED, decision.reason
    assert decision.code == "no_capacity" and not decision.victims
    assert plan_preemption(state, job, 1000, 100) is None


def test_another_teams_guarantee_never_preempts_an_interactive_spot_server_inside_its_own() -> None:
    # an over-subscribed pool: a's guarantee holds all four cards, b's guarantee asks for one
    state = _spot_state({"a": {"train": (4, 0)}, "b": {"train": (2, 0)}})
    for i in range(4):
        grant(state, request("a", "train", whole=1, priority="spot", user=f"u{i}"), f"s{i}")
    for kind, outcome in ((Kind.BATCH, Outcome.QUEUED), (Kind.INTERACTIVE, Outcome.REFUSED)):
        ask = request("b", "train", whole=1, priority="training", kind=kind)
        decision = decide(state, ask, "t", AdmissionFacts(now=100))
        assert decision.outcome is outcome, decision.reason
        assert not decision.victims
    assert not any(is_candidate(g, ask, 1000) for g in state.grants.values())


def test_interactive_spot_share_inside_the_guarantee_is_safe_in_a_shared_pool_too() -> None:
    state = _spot_state({"a": {"shared": (1, 0)}, "b": {"shared": (1, 0)}},
                        {"shared": SharingMode.SHARED}, gpus=1)
    for i in range(4):
        grant(state, request("a", "shared", fraction=0.25, priority="spot", user=f"u{i}"),
              f"s{i}")
    ask = request("b", "shared", fraction=0.5, priority="training", kind=Kind.BATCH)
    decision = decide(state, ask, "t", AdmissionFacts(now=100))
    assert decision.outcome is Outcome.QUEUED and not decision.victims, decision.reason


def test_the_same_spot_grants_are_preempted_when_they_are_batch_or_borrowed() -> None:
    """The controls: what makes the servers above safe is being interactive inside the
    guarantee, not anything else of the setup."""
    state = _spot_state({"a": {"train": (4, 0)}, "b": {"train": (2, 0)}})
    for i in range(4):
        grant(state, request("a", "train", whole=1, priority="spot", kind=Kind.BATCH,
                             user=f"u{i}", checkpointing=True), f"s{i}")
    decision = decide(state, request("b", "train", whole=1, priority="training",
                                     kind=Kind.BATCH), "t", AdmissionFacts(now=100))
    assert decision.outcome is Outcome.PREEMPTING and len(decision.victims) == 1
    # borrowed interactive servers are reclaimable by the owning team, even non-preemptible
    state = _spot_state({"a": {"train": (0, 4)}, "b": {"train": (4, 0)}})
    for i in range(4):
        g = grant(state, request("a", "train", whole=1, user=f"u{i}"), f"i{i}")
        assert g.borrowed
    decision = decide(state, request("b", "train", whole=1), "t", AdmissionFacts(now=100))
    assert decision.outcome is Outcome.PREEMPTING and len(decision.victims) == 1


def test_interactive_server_inside_the_guarantee_is_not_a_candidate_at_any_priority() -> None:
    state = _spot_state({"a": {"train": (4, 0)}, "b": {"train": (4, 0)}})
    server = grant(state, request("a", "train", whole=1, priority="spot"), "srv")
    assert server.preemptible and not server.borrowed
    for team in ("a", "b"):
        ask = request(team, "train", whole=1, priority="training", kind=Kind.BATCH)
        assert not is_candidate(server, ask, 10**6)
