"""Finding 11 (broker side): a policy whose profile has an absurd ``max_lifetime``
(built directly, bypassing the policy reader's ranges) never makes the broker answer 500
after it stored a grant; every grant it keeps is one the client was told about."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from brokerkit import call, start_broker, static_tokens

from jupyter_gpushare.broker.store.serial import iso
from jupyter_gpushare.policy import parse_policy

CONFIG = Path(__file__).parents[1] / "hub_config" / "gpushare.yaml"


def _policy_with_lifetime(seconds: int) -> Any:
    policy = parse_policy(CONFIG.read_text())
    profiles = tuple(
        dataclasses.replace(p, max_lifetime_s=seconds) if p.slug == "lab-small" else p
        for p in policy.profiles
    )
    return dataclasses.replace(policy, profiles=profiles)


@pytest.mark.parametrize("lifetime", [10**17, 2**63 - 1])
async def test_a_huge_lifetime_answers_and_lists_without_500(tmp_path: Path, lifetime: int) -> None:
    app = await start_broker(_policy_with_lifetime(lifetime), f"sqlite:///{tmp_path}/b.sqlite",
                             static_tokens({"vic": ["vision"]}))
    try:
        status, ans = await call(app, "POST", "/requests", "tok-vic",
                                 {"profile": "lab-small", "server": "s1"})
        assert status == 201 and ans["status"] == "granted", ans
        grant = ans["grant"]
        assert grant["max_lifetime_s"] == lifetime
        assert grant["ends_at"] == "9999-12-31T23:59:59Z"  # clamped: far beyond any use
        status, listed = await call(app, "GET", "/grants", "tok-vic")
        assert status == 200, listed
        assert [g["id"] for g in listed["grants"]] == [grant["id"]]
        status, one = await call(app, "GET", f"/grants/{grant['id']}", "tok-vic")
        assert status == 200 and one["ends_at"] == grant["ends_at"], one
        # released: the row read back from the database answers too
        status, rel = await call(app, "DELETE", f"/grants/{grant['id']}", "tok-vic")
        assert status == 200 and rel["released"] is True, rel
        assert rel["grant"]["ends_at"] == grant["ends_at"]
    finally:
        await app.stop_async()


def test_iso_clamps_what_a_datetime_cannot_hold() -> None:
    assert iso(0.0) == "1970-01-01T00:00:00Z"
    assert iso(1e17) == "9999-12-31T23:59:59Z"
    assert iso(-1e17) == "0001-01-01T00:00:00Z"
    assert iso(float("inf")) == "9999-12-31T23:59:59Z"
    assert iso(float("nan")) is None


def _absurd_policy(big: int) -> Any:
    """Every profile's lifetime and every class's grace period (and the preemptible ones'
    checkpoint threshold) set to ``big``, as the policy reader's ranges would refuse."""
    policy = parse_policy(CONFIG.read_text())
    return dataclasses.replace(
        policy,
        profiles=tuple(dataclasses.replace(p, max_lifetime_s=big) for p in policy.profiles),
        priority_classes=tuple(
            dataclasses.replace(c, grace_period_s=big,
                                checkpoint_required_after_s=big if c.preemptible else None)
            for c in policy.priority_classes
        ),
    )


@pytest.mark.parametrize("big", [10**17, 2**63 - 1, 10**30])
async def test_no_answer_fails_and_every_kept_grant_was_told(tmp_path: Path, big: int) -> None:
    app = await start_broker(_absurd_policy(big), f"sqlite:///{tmp_path}/b.sqlite",
                             static_tokens({"vic": ["vision"], "nat": ["nlp"]}))
    told: set[str] = set()
    try:
        for i, (user, slug, kind) in enumerate([
            ("vic", "lab-small", "interactive"), ("nat", "train-1gpu", "batch"),
            ("vic", "train-4gpu", "interactive"), ("nat", "train-4gpu", "batch"),
            ("vic", "train-4gpu", "batch"), ("nat", "debug-eighth", "interactive"),
            ("vic", "inference-quarter", "batch"), ("nat", "train-4gpu", "interactive"),
        ]):
            status, ans = await call(app, "POST", "/requests", f"tok-{user}",
                                     {"profile": slug, "server": f"s{i}", "kind": kind})
            assert status in (201, 409), (slug, status, ans)
            if ans.get("grant_id"):
                told.add(ans["grant_id"])
            for path in ("/grants", "/requests", "/notices", "/policy/profiles"):
                status, listed = await call(app, "GET", path, f"tok-{user}")
                assert status == 200, (path, listed)
            status, queue = await call(app, "GET", "/admin/queue", "tok-admin")
            assert status == 200, queue
        status, listed = await call(app, "GET", "/grants", "tok-admin")
        assert status == 200 and {g["id"] for g in listed["grants"]} == told, listed
        assert set(app.broker.state.grants) == told
    finally:
        await app.stop_async()
