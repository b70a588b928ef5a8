"""core/rules.py: who may ask for what (issue 8, items 1-3), and the policy fields behind it.

Each condition of :func:`check_request` has a test that passes a request breaking only that
condition, so removing any one check turns exactly those tests red.
"""

from __future__ import annotations

import pytest

from jupyter_gpushare.core import rules
from jupyter_gpushare.core.model import Policy
from jupyter_gpushare.core.rules import RuleRefusal, allowed_priorities, check_request, choose_team
from jupyter_gpushare.policy import check_policy, parse_policy, summarize

POLICY = """\
inventory:
  source: simulated
  simulated:
    - {pool: train, nodes: 1, gpus_per_node: 4, gpu_memory: 80GiB}
    - {pool: lab, nodes: 1, gpus_per_node: 2, gpu_memory: 80GiB}
pools:
  train: {mode: exclusive}
  lab: {mode: shared}
priority_classes:
  training: {value: 1000}
  interactive: {value: 500}
  research: {value: 100, preemptible: true}
teams:
  vision:
    quotas:
      train: {guaranteed: 2, explicit_requests: true}
      lab: {guaranteed: 1}
  research:
    priorities: [interactive, research]
    quotas:
      train: {guaranteed: 1, borrow_limit: 2}
      lab: {guaranteed: 1, explicit_requests: true}
  nlp:
    quotas:
      train: {guaranteed: 1}
profiles:
  - slug: train-4gpu
    pool: train
    gpu: {count: 4}
    priority: training
    teams: [vision]
  - slug: train-1gpu
    pool: train
    gpu: {count: 1}
    priority: research
    priorities: [training, interactive]
  - slug: lab
    pool: lab
    gpu: 1/4
"""


@pytest.fixture(scope="module")
def policy() -> Policy:
    return parse_policy(POLICY, "rules.yaml")


def check(policy: Policy, **overrides: object) -> RuleRefusal | None:
    """check_request with a request that passes every rule, changed by ``overrides``."""
    args: dict[str, object] = {
        "user_teams": ("vision",), "team": "vision", "profile": policy.profile("train-4gpu"),
        "explicit_pool": None, "priority": "training", "is_admin": False,
    }
    args.update(overrides)
    return check_request(policy, **args)  # type: ignore[arg-type]


def test_the_baseline_request_passes(policy: Policy) -> None:
    assert check(policy) is None


# ------------------------------------------------------------------ item 1: team


def test_a_team_the_user_is_not_in_is_refused(policy: Policy) -> None:
    refusal = check(policy, user_teams=("research",))
    assert refusal is not None and (refusal.code, refusal.field) == (rules.NOT_MEMBER, "team")
    assert "team vision" in refusal.message and "research" in refusal.message


def test_an_admin_may_charge_any_team(policy: Policy) -> None:
    assert check(policy, user_teams=(), is_admin=True) is None


def test_a_team_of_the_user_that_the_profile_is_not_for_is_refused(policy: Policy) -> None:
    # rita passing "team": "nlp", one of her teams, with a vision-only profile (item 1);
    # nlp may use every priority class, so only the profile's team list refuses it
    refusal = check(policy, user_teams=("nlp", "vision"), team="nlp")
    assert refusal is not None
    assert (refusal.code, refusal.field) == (rules.PROFILE_NOT_FOR_TEAM, "team")
    assert "train-4gpu" in refusal.message and "not team nlp" in refusal.message


def test_the_profile_list_holds_for_admins_too(policy: Policy) -> None:
    refusal = check(policy, user_teams=(), team="nlp", is_admin=True)
    assert refusal is not None and refusal.code == rules.PROFILE_NOT_FOR_TEAM


def test_a_profile_whose_own_priority_the_team_may_not_use_is_refused(policy: Policy) -> None:
    # open profile train-1gpu has its own priority research: fine for research; change the
    # team's classes so that the profile's own priority is not among them
    refusal = check(policy, user_teams=("research",), team="research",
                    profile=policy.profile("train-1gpu"), priority="interactive")
    assert refusal is None
    text = POLICY.replace("priorities: [interactive, research]", "priorities: [interactive]")
    narrow = parse_policy(text)
    refusal = check(narrow, user_teams=("research",), team="research",
                    profile=narrow.profile("train-1gpu"), priority="interactive")
    assert refusal is not None and refusal.code == rules.PROFILE_NOT_FOR_TEAM
    assert "priority research" in refusal.message


def test_an_unknown_team_is_refused(policy: Policy) -> None:
    refusal = check(policy, user_teams=("ghosts",), team="ghosts", is_admin=True)
    assert refusal is not None and (refusal.code, refusal.field) == (rules.UNKNOWN_TEAM, "team")


# -------------------------------------------------------------- item 2: explicit


def explicit(policy: Policy, **overrides: object) -> RuleRefusal | None:
    base: dict[str, object] = {"profile": None, "explicit_pool": "train"}
    base.update(overrides)
    return check(policy, **base)


def test_an_explicit_ask_where_the_team_may_send_one_passes(policy: Policy) -> None:
    assert explicit(policy) is None


def test_an_explicit_ask_where_the_team_may_not_is_refused(policy: Policy) -> None:
    refusal = explicit(policy, explicit_pool="lab", priority="interactive")
    assert refusal is not None
    assert (refusal.code, refusal.field) == (rules.EXPLICIT_NOT_ALLOWED, "profile")
    assert "team vision" in refusal.message and "pool lab" in refusal.message
    assert "explicit_requests" in refusal.message


def test_an_explicit_ask_in_a_pool_without_quota_is_refused(policy: Policy) -> None:
    refusal = explicit(policy, explicit_pool="elsewhere")
    assert refusal is not None and refusal.code == rules.EXPLICIT_NOT_ALLOWED


def test_admins_may_always_send_explicit_asks(policy: Policy) -> None:
    assert explicit(policy, explicit_pool="lab", is_admin=True) is None


# -------------------------------------------------------------- item 3: priority


def test_a_profile_allows_only_its_own_priority_by_default(policy: Policy) -> None:
    assert allowed_priorities(policy, "vision", policy.profile("lab")) == ("interactive",)
    refusal = check(policy, profile=policy.profile("lab"), priority="training")
    assert refusal is not None
    assert (refusal.code, refusal.field) == (rules.PRIORITY_NOT_ALLOWED, "priority")
    assert "training" in refusal.message and "lab" in refusal.message
    assert "allowed: interactive" in refusal.message


def test_a_profile_may_offer_more_priorities(policy: Policy) -> None:
    profile = policy.profile("train-1gpu")
    assert allowed_priorities(policy, "vision", profile) == ("research", "training",
                                                             "interactive")
    assert check(policy, profile=profile, priority="training") is None


def test_the_team_limits_the_profile_priorities(policy: Policy) -> None:
    profile = policy.profile("train-1gpu")
    assert allowed_priorities(policy, "research", profile) == ("research", "interactive")
    refusal = check(policy, user_teams=("research",), team="research", profile=profile,
                    priority="training")
    assert refusal is not None and refusal.code == rules.PRIORITY_NOT_ALLOWED
    assert "team research" in refusal.message


def test_the_team_limits_explicit_asks_and_admins(policy: Policy) -> None:
    assert allowed_priorities(policy, "research", None) == ("interactive", "research")
    refusal = explicit(policy, user_teams=("research",), team="research", explicit_pool="lab",
                       priority="training", is_admin=True)
    assert refusal is not None and refusal.code == rules.PRIORITY_NOT_ALLOWED
    assert "explicit GPU request" in refusal.message


def test_an_unknown_priority_is_refused(policy: Policy) -> None:
    refusal = check(policy, priority="urgent")
    assert refusal is not None and (refusal.code, refusal.field) == (rules.UNKNOWN_PRIORITY,
                                                                     "priority")


def test_allowed_priorities_of_an_unknown_team_are_none(policy: Policy) -> None:
    assert allowed_priorities(policy, "ghosts", policy.profile("lab")) == ()


# ---------------------------------------------------------------- choosing a team


def test_choose_team_skips_teams_that_may_not(policy: Policy) -> None:
    profile = policy.profile("train-1gpu")
    team, refusal = choose_team(policy, user_teams=("research", "vision"), profile=profile,
                                explicit_pool=None, priority="training", is_admin=False)
    assert (team, refusal) == ("vision", None)
    team, refusal = choose_team(policy, user_teams=("research",), profile=profile,
                                explicit_pool=None, priority="training", is_admin=False)
    assert team is None and refusal is not None and refusal.code == rules.PRIORITY_NOT_ALLOWED
    team, refusal = choose_team(policy, user_teams=("vision",), profile=None,
                                explicit_pool="nowhere", priority="training", is_admin=False)
    assert (team, refusal) == (None, None)


# ------------------------------------------------------------------- the loader


def test_fields_are_read(policy: Policy) -> None:
    vision, research = policy.team("vision"), policy.team("research")
    assert vision is not None and research is not None
    assert vision.priorities is None and research.priorities == ("interactive", "research")
    assert vision.quota("train").explicit_requests  # type: ignore[union-attr]
    assert not vision.quota("lab").explicit_requests  # type: ignore[union-attr]
    assert policy.profile("train-1gpu").priorities == ("training", "interactive")  # type: ignore
    assert policy.profile("lab").priorities == ()  # type: ignore[union-attr]


def errors(text: str) -> list[str]:
    return [str(i) for i in check_policy(text, "p.yaml").errors]


def test_unknown_classes_in_priorities_are_errors() -> None:
    found = errors(POLICY.replace("priorities: [interactive, research]",
                                  "priorities: [interactiv]"))
    assert any("p.yaml:19: teams.research.priorities[0]: unknown priority class 'interactiv'"
               in e and "did you mean 'interactive'" in e for e in found), found
    found = errors(POLICY.replace("priorities: [training, interactive]", "priorities: [urgent]"))
    assert any("profiles[1].priorities[0]: unknown priority class 'urgent'" in e
               for e in found), found


def test_explicit_requests_must_be_true_or_false() -> None:
    found = errors(POLICY.replace("explicit_requests: true}", "explicit_requests: yes-please}", 1))
    assert any("teams.vision.quotas.train.explicit_requests" in e and "true or false" in e
               for e in found), found


def test_a_profile_listing_a_team_that_may_not_use_its_priority_is_an_error() -> None:
    text = POLICY.replace("teams: [vision]", "teams: [vision, research]")
    found = errors(text)
    assert any("profiles[0].teams[1]" in e and "team research may not use priority training"
               in e for e in found), found


def test_an_open_profile_a_team_may_not_use_is_a_warning_and_not_offered() -> None:
    text = POLICY.replace("priorities: [interactive, research]", "priorities: [research]")
    check_ = check_policy(text, "p.yaml")
    assert check_.policy is not None
    warned = [str(w) for w in check_.warnings if w.path == "profiles[2].priority"]
    assert warned and "team research may not use priority interactive" in warned[0]
    slugs = {p.slug for p in check_.policy.profiles_for({"research"})}
    assert slugs == {"train-1gpu"}
    research_part = summarize(check_.policy).split("research (groups")[1].split("nlp (groups")[0]
    assert "train-1gpu" in research_part and " lab " not in research_part
