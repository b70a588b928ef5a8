"""The broker's authorisation, in-process, where no real hub can run (no npm proxy needed).

The broker runs with its production token path: ``HubTokenAuthenticator`` (JupyterHub's own
``HubAuth``) asks a stand-in hub (``fakehub.FakeHub``, real HTTP) who a token belongs to and
which scopes it carries, and ``HubClient`` asks it for the user's groups, exactly as against a
real hub. ``test_broker_hub.py`` checks the same rules with a real JupyterHub where its proxy
is installed; this module never skips.

Read rules checked: a user sees only their own grants, requests, notices, profiles and jobs
(list filters and single objects), a team's usage only as its member; a server token reads
its own user's things only; the spawner and admins see everyone's; admin and metrics
endpoints need their scopes; no token is 401, an unknown token or one without access to the
service 403, on every endpoint.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from brokerkit import ACCESS, call
from brokerpolicies import small
from fakehub import FakeHub, start_broker_with_hub

from jupyter_gpushare.core.model import GPUAsk, Policy, Profile

PROFILES = (
    Profile("lab", "Lab 1/4 GPU", "shared", GPUAsk(fraction_milli=250), "interactive"),
    Profile("dbg", "Debug 1/8 GPU", "debug", GPUAsk(fraction_milli=125), "interactive"),
    Profile("train1", "Train 1 GPU", "train", GPUAsk(whole=1), "training"),
    Profile("b-only", "Team b only", "shared", GPUAsk(fraction_milli=125), "interactive",
            teams=("b",)),
)


def authz_policy() -> Policy:
    """``small()`` (teams a and b; train, shared and debug pools) with profiles."""
    return dataclasses.replace(small(), profiles=PROFILES, _index={})


@pytest.fixture
async def env(tmp_path: Any) -> Any:
    hub = FakeHub()
    hub.start()
    for name, groups in {"alice": ["a"], "carol": ["a"], "bob": ["b"]}.items():
        hub.add_user(name, groups)
    t = {
        "alice": hub.user_token("alice"),
        "alice-lab": hub.server_token("alice", "lab"),
        "carol": hub.user_token("carol"),
        "bob": hub.user_token("bob"),
        "bob-srv": hub.server_token("bob", ""),
        "spawner": hub.token("gpushare-spawner", ["custom:gpushare:act-as-users", ACCESS],
                             kind="service"),
        "admin": hub.token("boss", ["custom:gpushare:admin", ACCESS]),
        "metrics": hub.token("prom", ["custom:gpushare:metrics"], kind="service"),
        "noaccess": hub.token("alice", ["access:servers!user=alice"]),
        "hubadmin": hub.token("root", ["admin:users", "admin:servers", "access:servers",
                                       "read:users"]),
    }
    app = await start_broker_with_hub(authz_policy(), f"sqlite:///{tmp_path}/b.sqlite", hub)
    yield app, hub, t
    await app.stop_async()
    hub.stop()


async def grant(app: Any, token: str, profile: str, server: str) -> dict[str, Any]:
    status, ans = await call(app, "POST", "/requests", token,
                             {"profile": profile, "server": server})
    assert status == 201 and ans["status"] == "granted", ans
    return ans


async def test_tokens_are_checked_with_the_hub(env: Any) -> None:
    app, hub, t = env
    before = hub.calls
    status, prof = await call(app, "GET", "/policy/profiles", t["alice"])
    assert status == 200 and prof["teams"] == ["a"]
    assert hub.calls > before  # the broker asked the hub (HubAuth), it did not guess
    assert "b-only" not in [p["slug"] for p in prof["profiles"]]
    status, prof = await call(app, "GET", "/policy/profiles", t["bob"])
    assert status == 200 and prof["teams"] == ["b"]
    assert "b-only" in [p["slug"] for p in prof["profiles"]]


async def test_a_user_reads_only_their_own_grants_and_requests(env: Any) -> None:
    app, hub, t = env
    a = await grant(app, t["alice"], "lab", "lab")
    b = await grant(app, t["bob"], "lab", "")
    ga, gb = a["grant"]["id"], b["grant"]["id"]
    for tok in ("alice", "alice-lab", "spawner", "admin"):
        assert (await call(app, "GET", f"/grants/{ga}", t[tok]))[0] == 200, tok
        assert (await call(app, "GET", f"/requests/{a['request_id']}", t[tok]))[0] == 200, tok
    for tok in ("bob", "bob-srv", "carol", "metrics"):  # carol: alice's team, not alice
        assert (await call(app, "GET", f"/grants/{ga}", t[tok]))[0] == 403, tok
        assert (await call(app, "GET", f"/requests/{a['request_id']}", t[tok]))[0] == 403, tok
    # lists: filtered to the caller; asking for another user's is refused
    for tok, own in (("alice", ga), ("alice-lab", ga), ("bob", gb), ("bob-srv", gb)):
        status, listed = await call(app, "GET", "/grants", t[tok])
        assert status == 200 and [g["id"] for g in listed["grants"]] == [own], (tok, listed)
        status, listed = await call(app, "GET", "/requests", t[tok])
        assert status == 200 and {r["user"] for r in listed["requests"]} == {
            "alice" if own == ga else "bob"}, (tok, listed)
    status, listed = await call(app, "GET", "/grants", t["carol"])
    assert status == 200 and listed["grants"] == []
    for path in ("/grants?user=alice", "/requests?user=alice"):
        assert (await call(app, "GET", path, t["bob"]))[0] == 403, path
        assert (await call(app, "GET", path, t["carol"]))[0] == 403, path
        assert (await call(app, "GET", path, t["spawner"]))[0] == 200, path
    status, listed = await call(app, "GET", "/grants", t["admin"])
    assert status == 200 and {g["id"] for g in listed["grants"]} == {ga, gb}
    # bob may not release alice's grant or cancel her request either
    assert (await call(app, "DELETE", f"/grants/{ga}", t["bob"]))[0] == 403
    assert (await call(app, "DELETE", f"/requests/{a['request_id']}", t["bob"]))[0] == 403
    status, view = await call(app, "GET", f"/grants/{ga}", t["alice"])
    assert status == 200 and not view.get("released_at")


async def test_team_usage_notices_profiles_and_jobs_only_for_their_owners(env: Any) -> None:
    app, hub, t = env
    assert (await call(app, "GET", "/teams/a/usage", t["alice"]))[0] == 200
    assert (await call(app, "GET", "/teams/a/usage", t["carol"]))[0] == 200
    assert (await call(app, "GET", "/teams/a/usage", t["bob"]))[0] == 403
    assert (await call(app, "GET", "/teams/b/usage", t["alice"]))[0] == 403
    assert (await call(app, "GET", "/teams/b/usage", t["admin"]))[0] == 200
    for path in ("/notices?user=bob", "/notices/stream?user=bob", "/policy/profiles?user=bob",
                 "/jobs?user=bob"):
        assert (await call(app, "GET", path, t["alice"]))[0] == 403, path
        assert (await call(app, "GET", path, t["alice-lab"]))[0] == 403, path
    status, notes = await call(app, "GET", "/notices", t["alice"])
    assert status == 200 and all(n.get("user") == "alice" for n in notes["notices"])
    assert (await call(app, "GET", "/policy/profiles?user=bob", t["spawner"]))[0] == 200
    status, prof = await call(app, "GET", "/policy/profiles?user=bob", t["admin"])
    assert status == 200 and prof["teams"] == ["b"]


async def test_admin_and_metrics_need_their_scopes(env: Any) -> None:
    app, hub, t = env
    for tok in ("alice", "alice-lab", "spawner", "metrics", "hubadmin"):
        assert (await call(app, "GET", "/admin/queue", t[tok]))[0] == 403, tok
        assert (await call(app, "POST", "/admin/nodes/train-n0/drain", t[tok]))[0] == 403, tok
        assert (await call(app, "POST", "/admin/reconcile", t[tok]))[0] == 403, tok
    assert (await call(app, "GET", "/admin/queue", t["admin"]))[0] == 200
    for tok in ("alice", "spawner", "hubadmin"):
        assert (await call(app, "GET", "/metrics", t[tok]))[0] == 403, tok
    status, text = await call(app, "GET", "/metrics", t["metrics"])
    assert status == 200 and "gpushare_" in text
    # the hub's own admin is not a gpushare admin: no acting for users, no other's grants
    status, _ = await call(app, "POST", "/requests", t["hubadmin"],
                           {"user": "alice", "profile": "lab"})
    assert status == 403


ENDPOINTS = [
    ("POST", "/requests", {"profile": "lab"}),
    ("GET", "/requests", None),
    ("GET", "/requests/r-x", None),
    ("DELETE", "/requests/r-x", None),
    ("GET", "/grants", None),
    ("GET", "/grants/g-x", None),
    ("DELETE", "/grants/g-x", None),
    ("GET", "/teams/a/usage", None),
    ("GET", "/notices", None),
    ("GET", "/notices/stream", None),
    ("POST", "/heartbeats", {"grant_id": "g-x"}),
    ("POST", "/admin/nodes/train-n0/drain", None),
    ("POST", "/admin/nodes/train-n0/resume", None),
    ("POST", "/admin/reconcile", None),
    ("GET", "/admin/queue", None),
    ("GET", "/metrics", None),
    ("GET", "/policy/profiles", None),
    ("GET", "/jobs", None),
    ("GET", "/jobs/j-x", None),
]


async def test_every_endpoint_refuses_strangers(env: Any) -> None:
    app, hub, t = env
    for method, path, body in ENDPOINTS:
        assert (await call(app, method, path, None, body))[0] == 401, (method, path)
        assert (await call(app, method, path, "not-a-token", body))[0] == 403, (method, path)
        assert (await call(app, method, path, t["noaccess"], body))[0] == 403, (method, path)
