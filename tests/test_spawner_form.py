"""Spawn form and option rules against the example policy (pure)."""

from __future__ import annotations

from pathlib import Path

import pytest

from jupyter_gpushare.policy import load_policy
from jupyter_gpushare.spawner import form

POLICY = load_policy(Path(__file__).parents[1] / "hub_config" / "gpushare.yaml")
KNOWN = [p.slug for p in POLICY.profiles]


def slugs(groups):
    return [c.slug for c in form.choices_for(POLICY, groups)]


def test_profiles_follow_the_teams_of_the_user():
    vision = slugs(["vision"])
    assert "train-4gpu" in vision and "debug-eighth" in vision
    research = slugs(["research"])
    assert "train-4gpu" not in research  # restricted to vision and nlp
    assert "train-1gpu" in research
    nlp = slugs(["nlp-interns"])
    assert "debug-eighth" in nlp and "train-4gpu" in nlp
    # nobody in a group: the default team (research)
    assert slugs([]) == research


def test_share_descriptions():
    by = {c.slug: c for c in form.choices_for(POLICY, ["vision"])}
    assert by["debug-eighth"].share.startswith("1/8 GPU (")
    assert "12.5 % compute" in by["debug-eighth"].share
    assert by["train-4gpu"].share == "4 whole GPUs"
    assert by["cpu-only"].share == "no GPU"
    # a profile stated by its peak memory reads as what the user gets, not "0.142 GPU"
    assert by["lab-small"].share == "16 GiB, 10 % compute"


def test_validate_options_rules():
    allowed = slugs(["research"])
    assert form.validate_options({}, allowed, KNOWN) == allowed[0]
    assert form.validate_options({"profile": "train-1gpu"}, allowed, KNOWN) == "train-1gpu"
    with pytest.raises(form.OptionsError) as e:
        form.validate_options({"profile": "train-4gpu"}, allowed, KNOWN)
    assert e.value.status == 403 and "not allowed for your teams" in e.value.message
    with pytest.raises(form.OptionsError) as e:
        form.validate_options({"profile": "nope"}, allowed, KNOWN)
    assert e.value.status == 400 and "no such profile" in e.value.message
    with pytest.raises(form.OptionsError) as e:
        form.validate_options({"profile": "debug-eighth", "image": "evil"}, allowed, KNOWN)
    assert e.value.status == 400 and "not offered: image" in e.value.message
    with pytest.raises(form.OptionsError) as e:
        form.validate_options({"profile": ["a", "b"]}, allowed, KNOWN)
    assert e.value.status == 400
    with pytest.raises(form.OptionsError) as e:
        form.validate_options({}, [], KNOWN)
    assert e.value.status == 403


def test_options_from_form_keeps_unknown_fields_for_refusal():
    opts = form.options_from_form({"profile": ["debug-eighth"], "_xsrf": ["x"], "gpu": ["8"]})
    assert opts == {"profile": "debug-eighth", "gpu": "8"}


BROKER_VIEW = [
    {
        "slug": "debug-eighth",
        "availability": {
            "vision": {"guaranteed": 0.25, "borrow_limit": 0.25, "in_use": 0.25,
                       "within_guarantee": False, "within_borrow_limit": True, "fits_now": True}
        },
    },
    {
        "slug": "inference-quarter",
        "availability": {
            "vision": {"guaranteed": 1.5, "borrow_limit": 1, "in_use": 0.5,
                       "within_guarantee": True, "within_borrow_limit": True, "fits_now": False}
        },
    },
    {
        "slug": "train-1gpu",
        "availability": {
            "vision": {"guaranteed": 4, "borrow_limit": 2, "in_use": 6,
                       "within_guarantee": False, "within_borrow_limit": False, "fits_now": True}
        },
    },
    {"slug": "cpu-only", "availability": {}},
]


def test_availability_and_form_html():
    choices = form.with_availability(
        form.choices_for(POLICY, ["vision"]), BROKER_VIEW, {("vision", "interactive"): 3}
    )
    by = {c.slug: c for c in choices}
    assert set(by) == {"debug-eighth", "inference-quarter", "train-1gpu", "cpu-only"}
    d = by["debug-eighth"]
    assert d.would_borrow and d.preemptible and d.available and d.team_left == 0
    assert d.borrow_left == 0.25
    q = by["inference-quarter"]
    assert q.would_borrow is False and q.team_left == 1.0 and q.queue == 3
    assert q.available is False and "no GPU free" in q.note
    t = by["train-1gpu"]
    assert t.available is False and "borrow limit" in t.note
    html = form.render_form(choices)
    assert html.count('type="radio" name="profile"') == 4
    assert "would borrow idle capacity: preemptible" in html
    assert "queue: 3 waiting" in html
    assert "0 GPU left of its guarantee, may borrow 0.25 more" in html
    assert "pool debug" in html
    # the first available profile is preselected
    assert 'value="debug-eighth" checked' in html
    assert 'value="inference-quarter" checked' in form.render_form(choices, "inference-quarter")


def test_form_escapes_and_says_when_nothing_is_open():
    assert "No server profile" in form.render_form([])
    c = form.ProfileChoice(slug="x", display_name="<b>x</b>", description="", pool="p",
                           share="s", units=0.5)
    assert "<b>x</b>" not in form.render_form([c])


def test_fraction_is_described_as_its_share_of_the_shareable_memory() -> None:
    from jupyter_gpushare.policy import load_policy
    from jupyter_gpushare.spawner.form import describe_share

    policy = load_policy(Path(__file__).parent.parent / "hub_config" / "gpushare.yaml")
    debug = policy.profile("debug-eighth")
    assert debug is not None
    # 141 GiB H200 with 20 % headroom: 1/8 of the shareable 112.8 GiB
    assert describe_share(debug, policy) == "1/8 GPU (14.1 GiB, 12.5 % compute)"


def test_card_verdict_and_reason_are_the_brokers_dry_run():
    """With the broker's own decision for this user, the card says what the broker says."""
    view = [
        {
            "slug": "train-1gpu",
            "availability": {
                "vision": {"guaranteed": 4, "borrow_limit": 2, "in_use": 4,
                           "within_guarantee": False, "within_borrow_limit": True,
                           "fits_now": False,
                           "decision": {"outcome": "refused", "code": "user_cap",
                                        "reason": "user alice holds 4 GPU in pool train; "
                                                  "the per-user cap is 4 GPU"}},
            },
        },
        {
            "slug": "train-4gpu",
            "availability": {
                "vision": {"guaranteed": 4, "borrow_limit": 2, "in_use": 4,
                           "within_guarantee": False, "within_borrow_limit": False,
                           "fits_now": True,
                           "decision": {"outcome": "refused", "code": "borrow_limit",
                                        "reason": "team vision would pass its borrow limit"}},
            },
        },
    ]
    choices = form.with_availability(form.choices_for(POLICY, ["vision"]), view)
    by = {c.slug: c for c in choices}
    t1 = by["train-1gpu"]
    assert t1.available is False and t1.outcome == "refused"
    assert t1.note == "user alice holds 4 GPU in pool train; the per-user cap is 4 GPU"
    assert "no GPU free" not in form._status_line(t1)
    html = form.render_form(choices, "train-1gpu")
    # the refused profile stays selected (it is what the user asked for)
    assert 'value="train-1gpu" checked' in html


def test_no_card_says_it_may_borrow_and_has_used_its_borrow_limit():
    view = [{
        "slug": "train-4gpu",
        "availability": {"vision": {"guaranteed": 4, "borrow_limit": 2, "in_use": 4,
                                    "within_guarantee": False, "within_borrow_limit": False,
                                    "fits_now": True}},
    }]
    (c,) = [x for x in form.with_availability(form.choices_for(POLICY, ["vision"]), view)
            if x.slug == "train-4gpu"]
    line = form._status_line(c)
    assert "may borrow 2 more" in line
    assert "has used its guarantee and borrow limit" not in line
    assert "needs 4 GPU" in line and "only 2 more" in line
    # an unavailable card does not promise "inside the guarantee" or "would borrow"
    assert "would borrow" not in line and "not preempted" not in line


def test_form_shows_lifetime_cap_hours_and_the_simulated_label():
    choices = form.choices_for(POLICY, ["vision"])
    view = [{"slug": c.slug, "availability": {}} for c in choices]
    by = {c.slug: c for c in form.with_availability(
        choices, view, hours_left={("vision", "debug"): 12.5})}
    debug = by["debug-eighth"]
    assert debug.max_lifetime_s == 7200 and debug.user_cap == 0.125
    html = form.render_form(list(by.values()), simulated=True)
    assert "SIMULATED" in html and "gpushare-simulated" in html
    assert "stopped after 2 h" in html
    assert "per-user cap 0.125 GPU in pool debug" in html
    assert "12.5 GPU-hours left this month" not in html  # no availability: not merged
    withhours = form.with_availability(
        choices, [{"slug": "debug-eighth", "availability": {"vision": {
            "guaranteed": 0.25, "borrow_limit": 0.25, "in_use": 0, "within_guarantee": True,
            "within_borrow_limit": True, "fits_now": True}}}],
        hours_left={("vision", "debug"): 12.5})
    assert "team vision: 12.5 GPU-hours left this month" in form.render_form(withhours)
    cpu = by["cpu-only"]
    assert "without a GPU grant" in form._facts_line(cpu)
    assert "SIMULATED" not in form.render_form(list(by.values()))
