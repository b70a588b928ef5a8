"""The spawn form offers only profiles of pools where one of the user's teams has a quota.

A profile open to every team (no ``teams:`` list) can still sit in a pool where a team has
no quota: the broker would refuse it ("team ... has no quota in pool ..."), so the form must
not offer it, and an option naming it must be refused before any request is sent. With two
teams, the profile is offered under the team that holds the pool's quota.
"""

from __future__ import annotations

import pytest
from corefactory import PRIORITIES, nodes

from jupyter_gpushare.core.model import (
    GPUAsk,
    Policy,
    Pool,
    PoolQuota,
    Profile,
    SharingMode,
    Team,
)
from jupyter_gpushare.spawner import form

POLICY = Policy(
    nodes=nodes("train", 1) + nodes("shared", 1),
    pools=(Pool("train", SharingMode.EXCLUSIVE), Pool("shared", SharingMode.SHARED)),
    priority_classes=PRIORITIES,
    teams=(
        Team("interns", ("interns",), (("shared", PoolQuota(500)),)),  # no quota in train
        Team("vision", ("vision",), (("train", PoolQuota(4000)), ("shared", PoolQuota(1000)))),
    ),
    profiles=(
        Profile("lab", "Lab 1/4 GPU", "shared", GPUAsk(fraction_milli=250), "interactive"),
        Profile("train-1", "Train 1 GPU", "train", GPUAsk(whole=1), "training"),  # every team
        Profile("train-2", "Train 2 GPU", "train", GPUAsk(whole=2), "training",
                teams=("vision", "interns")),
    ),
)
KNOWN = [p.slug for p in POLICY.profiles]


def allowed(groups: list[str]) -> list[str]:
    return [c.slug for c in form.choices_for(POLICY, groups)]


def test_a_pool_without_quota_for_the_users_teams_is_not_offered() -> None:
    assert allowed(["vision"]) == ["lab", "train-1", "train-2"]
    # interns may use the train profiles by their team lists, but have no quota in train
    assert allowed(["interns"]) == ["lab"]
    html = form.render_form(form.choices_for(POLICY, ["interns"]))
    assert 'value="lab"' in html
    assert "train-1" not in html and "train-2" not in html and "Train 1 GPU" not in html


def test_an_option_naming_a_pool_without_quota_is_refused_before_the_broker() -> None:
    for slug in ("train-1", "train-2"):
        with pytest.raises(form.OptionsError, match="not allowed for your teams") as err:
            form.validate_options({"profile": slug}, allowed(["interns"]), KNOWN)
        assert err.value.status == 403
    assert form.validate_options({"profile": "lab"}, allowed(["interns"]), KNOWN) == "lab"


def test_the_profile_goes_under_the_team_that_holds_the_pools_quota() -> None:
    # a member of both teams: interns comes first but only vision has a train quota
    assert POLICY.teams_of({"interns", "vision"}) == ("interns", "vision")
    by = {c.slug: c for c in form.choices_for(POLICY, ["interns", "vision"])}
    assert set(by) == {"lab", "train-1", "train-2"}
    assert by["train-1"].team == "vision" and by["train-2"].team == "vision"
    assert by["lab"].team == "interns"
