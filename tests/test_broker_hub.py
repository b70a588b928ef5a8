"""The broker as a real JupyterHub managed service, wired by ``setup_gpushare``, with real tokens.

One hub (with its proxy) for the module; the broker is started by the hub from the
service entry that ``hubsetup.setup_gpushare`` writes, and every call goes through the proxy
at ``/services/gpushare/api/v1`` with tokens the hub issued. Every handler is checked to
refuse calls without a token, with an unknown token, with a token lacking access to the
service, and from the wrong user.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any

import pytest
from realhub import REPO, free_port, proxy_available, real_hub

pytestmark = [pytest.mark.hub, pytest.mark.slow]

POLICY = REPO / "hub_config" / "gpushare.yaml"
SERVER_SCOPES = [
    "access:servers!server=alice/",
    "custom:gpushare:use",
    "users:activity!user=alice",
]


class Client:
    def __init__(self, base: str) -> None:
        self.base = base

    def __call__(
        self, method: str, path: str, token: str | None = None, body: Any = None
    ) -> tuple[int, Any]:
        headers = {"Content-Type": "application/json"}
        if token:
            headers["Authorization"] = f"token {token}"
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                raw = resp.read()
                status = resp.status
        except urllib.error.HTTPError as exc:
            raw, status = exc.read(), exc.code
        try:
            return status, json.loads(raw) if raw else None
        except ValueError:
            return status, raw.decode(errors="replace")


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Any:
    if not proxy_available():
        pytest.skip("configurable-http-proxy is not installed in hub_config/proxy (npm install)")
    tmp = tmp_path_factory.mktemp("hub")
    port = free_port()
    extra = f"""
c.JupyterHub.allow_named_servers = True
from jupyter_gpushare.hubsetup import setup_gpushare
setup_gpushare(c, {str(POLICY)!r}, spawner=None, broker_port={port}, admin_users=["ada"],
               data_dir=HUB_TMP, broker_args=["--BrokerApp.reconcile_min_age_s=0",
                                              "--BrokerApp.reconcile_interval_s=0"])
"""
    with real_hub(tmp, extra) as hub:
        client = Client(hub.url + "/services/gpushare/api/v1")
        deadline = time.monotonic() + 60
        while True:
            try:
                status, body = client("GET", "/health")
                if status == 200 and body.get("status") == "ok":
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("broker did not start:\n" + hub.log_text()[-5000:])
            time.sleep(0.3)
        hub.create_user("alice", ["vision"])
        hub.create_user("bob", ["nlp"])
        tokens = json.loads((tmp / "gpushare_tokens.json").read_text())
        toks = {
            "alice": hub.token_for("alice"),
            "alice-srv": hub.token_for("alice", SERVER_SCOPES),
            "alice-noaccess": hub.token_for("alice", ["read:users:name!user=alice"]),
            "bob": hub.token_for("bob"),
            "ada": hub.token_for("ada"),
            "spawner": tokens["spawner"],
            "hubadmin": hub.admin_token,
        }
        yield hub, client, toks


def test_setup_wires_service_roles_and_scopes(env: Any) -> None:
    hub, client, toks = env
    status, svc = hub.api("GET", "/services/gpushare")
    assert status == 200 and svc["name"] == "gpushare"
    status, user = hub.api("GET", "/user", token=toks["alice-srv"])
    assert "access:servers!server=alice/" in user["scopes"]
    assert "custom:gpushare:use" in user["scopes"]
    status, ada = hub.api("GET", "/user", token=toks["ada"])
    assert "custom:gpushare:admin" in ada["scopes"]
    status, spawner = hub.api("GET", "/user", token=toks["spawner"])
    assert "custom:gpushare:act-as-users" in spawner["scopes"]


def test_openapi_is_public(env: Any) -> None:
    _, client, _ = env
    status, text = client("GET", "/openapi.yaml")
    assert status == 200 and "openapi: 3" in text


def test_alice_gets_a_grant_and_bob_cannot_touch_it(env: Any) -> None:
    hub, client, t = env
    status, ans = client("POST", "/requests", t["alice"], {"profile": "lab-small", "server": "lab"})
    assert status == 201, ans
    assert ans["status"] == "granted" and ans["team"] == "vision" and ans["user"] == "alice"
    gid = ans["grant"]["id"]
    assert ans["grant"]["gpus"][0]["simulated"] is True

    assert client("GET", f"/grants/{gid}", t["alice"])[0] == 200
    assert client("GET", f"/grants/{gid}", t["bob"])[0] == 403
    assert client("DELETE", f"/grants/{gid}", t["bob"])[0] == 403
    assert client("GET", f"/requests/{ans['request_id']}", t["bob"])[0] == 403
    assert client("DELETE", f"/requests/{ans['request_id']}", t["bob"])[0] == 403
    assert client("GET", "/grants?user=alice", t["bob"])[0] == 403
    status, listed = client("GET", "/grants", t["bob"])
    assert status == 200 and listed["grants"] == []
    status, listed = client("GET", "/grants", t["alice"])
    assert [g["id"] for g in listed["grants"]] == [gid]
    # bob may not act for alice, nor choose a team he is not in
    assert (
        client("POST", "/requests", t["bob"], {"user": "alice", "profile": "lab-small"})[0] == 403
    )
    assert (
        client("POST", "/requests", t["bob"], {"profile": "lab-small", "team": "vision"})[0] == 403
    )
    # heartbeats: only the holder
    uuid = ans["grant"]["gpus"][0]["uuid"]
    beat = {
        "grant_id": gid,
        "gpus": [{"uuid": uuid, "memory_used_mib": 10, "utilization_pct": 5}],
        "simulated": True,
    }
    assert client("POST", "/heartbeats", t["bob"], beat)[0] == 403
    assert client("POST", "/heartbeats", t["alice"], beat)[0] == 204
    # the hub's own admin (no custom:gpushare scope) is not a gpushare admin
    assert (
        client("POST", "/requests", t["hubadmin"], {"user": "alice", "profile": "lab-small"})[0]
        == 403
    )
    assert client("GET", "/admin/queue", t["hubadmin"])[0] == 403
    # release by the owner, idempotent
    status, rel = client("DELETE", f"/grants/{gid}", t["alice"])
    assert status == 200 and rel["released"] is True
    status, rel = client("DELETE", f"/grants/{gid}", t["alice"])
    assert status == 200 and rel["released"] is False and rel["grant"]["released_at"]


def test_server_token_acts_only_for_its_server(env: Any) -> None:
    _, client, t = env
    status, ans = client(
        "POST", "/requests", t["alice-srv"], {"profile": "lab-small", "server": "other"}
    )
    assert status == 403, ans
    status, ans = client("POST", "/requests", t["alice-srv"], {"profile": "lab-small"})
    assert status == 201 and ans["server"] == "", ans
    gid = ans["grant"]["id"]
    status, ans2 = client(
        "POST", "/requests", t["alice"], {"profile": "lab-small", "server": "two"}
    )
    assert status == 201
    # the default server's token may read alice's grants but not release another server's
    assert client("DELETE", f"/grants/{ans2['grant']['id']}", t["alice-srv"])[0] == 403
    assert client("DELETE", f"/grants/{gid}", t["alice-srv"])[0] == 200
    assert client("DELETE", f"/grants/{ans2['grant']['id']}", t["alice"])[0] == 200


def test_team_usage_and_profiles_only_for_members(env: Any) -> None:
    _, client, t = env
    status, usage = client("GET", "/teams/vision/usage", t["alice"])
    assert status == 200 and usage["pools"]["interactive"]["guaranteed"] == 1.5
    assert client("GET", "/teams/nlp/usage", t["alice"])[0] == 403
    assert client("GET", "/teams/nlp/usage", t["ada"])[0] == 200
    status, prof = client("GET", "/policy/profiles", t["alice"])
    assert status == 200 and "lab-small" in [p["slug"] for p in prof["profiles"]]
    assert client("GET", "/policy/profiles?user=bob", t["alice"])[0] == 403
    assert client("GET", "/policy/profiles?user=bob", t["spawner"])[0] == 200
    assert client("GET", "/notices?user=bob", t["alice"])[0] == 403
    assert client("GET", "/notices", t["alice"])[0] == 200


def test_spawner_acts_for_any_user_and_admin_sees_all(env: Any) -> None:
    _, client, t = env
    status, ans = client(
        "POST",
        "/requests",
        t["spawner"],
        {
            "user": "bob",
            "server": "",
            "profile": "lab-small",
            "groups": ["nlp"],
            "idempotency_key": "spawn-1",
        },
    )
    assert status == 201 and ans["team"] == "nlp", ans
    again = client(
        "POST",
        "/requests",
        t["spawner"],
        {
            "user": "bob",
            "server": "",
            "profile": "lab-small",
            "groups": ["nlp"],
            "idempotency_key": "spawn-1",
        },
    )[1]
    assert again["request_id"] == ans["request_id"]
    # a user may not pass groups (they come from the hub)
    assert (
        client("POST", "/requests", t["bob"], {"profile": "lab-small", "groups": ["vision"]})[0]
        == 403
    )
    status, listed = client("GET", "/grants", t["ada"])
    assert ans["grant"]["id"] in [g["id"] for g in listed["grants"]]
    assert client("GET", "/admin/queue", t["ada"])[0] == 200
    assert client("GET", "/admin/queue", t["alice"])[0] == 403
    assert client("POST", "/admin/nodes/lab-0/drain", t["alice"])[0] == 403
    assert client("GET", "/metrics", t["alice"])[0] == 403
    status, text = client("GET", "/metrics", t["ada"])
    assert status == 200 and "gpushare_team_used_gpus" in text
    # reconcile: bob has no running server, so the hub says the holder is gone
    status, changes = client("POST", "/admin/reconcile", t["ada"])
    assert status == 200, changes
    assert ans["grant"]["id"] in [c["grant_id"] for c in changes["released"]]
    status, grant = client("GET", f"/grants/{ans['grant']['id']}", t["ada"])
    assert grant["released_at"] and "reconciled" in grant["release_reason"]


def _wait(predicate: Any, what: str, hub: Any, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached:\n" + hub.log_text()[-4000:])
        time.sleep(0.3)


def _server(hub: Any, user: str, name: str) -> dict[str, Any] | None:
    status, model = hub.api("GET", f"/users/{user}")
    assert status == 200, model
    found: dict[str, Any] | None = (model.get("servers") or {}).get(name)
    return found


def _start_server(hub: Any, user: str, name: str, profile: str) -> None:
    """Start a plain (grant-less) server through the hub with the profile as its option."""
    status, body = hub.api("POST", f"/users/{user}/servers/{name}", {"profile": profile})
    assert status in (201, 202), (status, body)
    _wait(lambda: bool((_server(hub, user, name) or {}).get("ready")), f"{name} ready", hub)


def test_running_server_holds_one_grant_and_keeps_it(env: Any) -> None:
    """Items 4 and 5: no second grant for a running server, and its user cannot release the
    grant while it runs (an admin's release stops the server)."""
    hub, client, t = env
    status, ans = client("POST", "/requests", t["alice"], {"profile": "lab-small", "server": "g1"})
    assert status == 201 and ans["status"] == "granted", ans
    gid = ans["grant"]["id"]
    _start_server(hub, "alice", "g1", "lab-small")
    srv = hub.token_for(
        "alice", ["access:servers!server=alice/g1", "custom:gpushare:use"]
    )
    for token in (t["alice"], srv):
        status, err = client("POST", "/requests", token, {"profile": "lab-small", "server": "g1"})
        assert status == 409 and gid in err["error"], err
    status, err = client("DELETE", f"/grants/{gid}", t["alice"])
    assert status == 409 and "running" in err["error"], err
    status, grant = client("GET", f"/grants/{gid}", t["alice"])
    assert grant["released_at"] is None
    status, rel = client("DELETE", f"/grants/{gid}", t["ada"])
    assert status == 200 and rel["released"] is True
    _wait(lambda: _server(hub, "alice", "g1") is None, "g1 stopped by the admin's release", hub)


def test_reconcile_stops_servers_without_grant_and_releases_unknown_jobs(env: Any) -> None:
    """Item 5: a server running a GPU profile with no grant is stopped; a batch grant whose
    job nobody knows is released."""
    hub, client, t = env
    status, job = client(
        "POST",
        "/requests",
        t["alice"],
        {"profile": "lab-small", "kind": "batch", "server": "made-up-job"},
    )
    assert status == 201 and job["status"] == "granted", job
    _start_server(hub, "alice", "nogrant", "lab-small")
    status, changes = client("POST", "/admin/reconcile", t["ada"])
    assert status == 200, changes
    orphans = [(o["user"], o["server"], o["stopped"]) for o in changes["servers_without_grant"]]
    assert ("alice", "nogrant", True) in orphans, changes
    assert job["grant"]["id"] in [c["grant_id"] for c in changes["released"]], changes
    _wait(lambda: _server(hub, "alice", "nogrant") is None, "nogrant stopped", hub)
    status, grant = client("GET", f"/grants/{job['grant']['id']}", t["alice"])
    assert grant["released_at"] and "made-up-job" in grant["release_reason"]


def test_concurrent_idempotency_key_through_the_hub(env: Any) -> None:
    """Item 7: 20 concurrent requests with one key get the one idempotent answer."""
    from concurrent.futures import ThreadPoolExecutor

    _, client, t = env
    body = {"profile": "lab-small", "server": "idem", "idempotency_key": "same-key"}
    with ThreadPoolExecutor(20) as pool:
        answers = list(pool.map(lambda _: client("POST", "/requests", t["bob"], body), range(20)))
    assert {status for status, _ in answers} == {201}, answers
    ids = {ans["request_id"] for _, ans in answers}
    assert len(ids) == 1
    gid = answers[0][1]["grant"]["id"]
    status, listed = client("GET", "/grants", t["bob"])
    assert [g["id"] for g in listed["grants"] if g["server"] == "idem"] == [gid]
    assert client("DELETE", f"/grants/{gid}", t["bob"])[0] == 200


def test_heartbeat_shows_up_in_team_usage(env: Any) -> None:
    """Item 9: a heartbeat (ts as an ISO string, as the server extension sends it) is
    accepted and its measured use appears in the team's usage; a faster one is a 429."""
    _, client, t = env
    status, ans = client("POST", "/requests", t["bob"], {"profile": "lab-small", "server": "hb"})
    assert status == 201, ans
    gid, uuid = ans["grant"]["id"], ans["grant"]["gpus"][0]["uuid"]
    beat = {
        "grant_id": gid,
        "ts": ans["created_at"],
        "gpus": [{"uuid": uuid, "memory_used_mib": 2048, "utilization_pct": 30}],
    }
    status, before = client("GET", "/teams/nlp/usage", t["bob"])
    n = before["pools"]["interactive"]["measured"]["heartbeats"]
    assert client("POST", "/heartbeats", t["bob"], beat)[0] == 204
    assert client("POST", "/heartbeats", t["bob"], beat)[0] == 429
    status, usage = client("GET", "/teams/nlp/usage", t["bob"])
    assert usage["pools"]["interactive"]["measured"]["heartbeats"] == n + 1
    assert client("DELETE", f"/grants/{gid}", t["bob"])[0] == 200


def test_policy_rules_on_teams_explicit_asks_and_priorities(env: Any) -> None:
    """Items 1-3: a profile not for the team, an explicit ask where the team may not send
    one, a priority class the profile does not offer: each a 403 naming the field, for user
    and server tokens; admins may send explicit asks."""
    hub, client, t = env
    hub.create_user("rita", ["research"])
    rita = hub.token_for("rita")
    for body in ({"profile": "train-4gpu", "team": "research"}, {"profile": "train-4gpu"}):
        status, err = client("POST", "/requests", rita, {**body, "server": "r"})
        assert status == 403 and err["field"] == "team", err
        assert err["code"] == "profile_not_for_team" and "vision" in err["error"]
    explicit = {"pool": "interactive", "gpu": {"fraction": 0.125}, "server": ""}
    for token in (t["alice"], t["alice-srv"]):
        status, err = client("POST", "/requests", token, explicit)
        assert status == 403 and err["field"] == "profile", err
        assert err["code"] == "explicit_not_allowed"
    status, err = client(
        "POST",
        "/requests",
        t["alice"],
        {**explicit, "profile": {"pool": "interactive", "gpu": {"fraction": 0.125}}},
    )
    assert status == 403 and err["field"] == "profile", err
    status, ans = client("POST", "/requests", t["ada"], {**explicit, "user": "alice"})
    assert status == 201 and ans["status"] == "granted", ans
    assert client("DELETE", f"/grants/{ans['grant']['id']}", t["ada"])[0] == 200
    # vision may send explicit asks in train (explicit_requests: true)
    status, ans = client(
        "POST", "/requests", t["alice"], {"pool": "train", "gpu": {"count": 1}, "server": "x"}
    )
    assert status == 201 and ans["status"] == "granted", ans
    assert client("DELETE", f"/grants/{ans['grant']['id']}", t["alice"])[0] == 200
    # priorities: lab-small offers only its own class; train-1gpu also offers research
    status, err = client(
        "POST", "/requests", t["alice"], {"profile": "lab-small", "priority": "training"}
    )
    assert status == 403 and err["field"] == "priority" and "interactive" in err["error"], err
    status, ans = client(
        "POST",
        "/requests",
        t["alice"],
        {
            "profile": "train-1gpu",
            "priority": "research",
            "server": "p",
            "kind": "batch",
            "checkpointing": True,
        },
    )
    assert status == 201 and ans["status"] == "granted", ans
    assert ans["grant"]["priority"] == "research" and ans["grant"]["preemptible"] is True
    assert client("DELETE", f"/grants/{ans['grant']['id']}", t["alice"])[0] == 200


ENDPOINTS = [
    ("POST", "/requests", {"profile": "lab-small"}),
    ("GET", "/requests", None),
    ("GET", "/requests/r-x", None),
    ("DELETE", "/requests/r-x", None),
    ("GET", "/grants", None),
    ("GET", "/grants/g-x", None),
    ("DELETE", "/grants/g-x", None),
    ("GET", "/teams/vision/usage", None),
    ("GET", "/notices", None),
    ("GET", "/notices/stream", None),
    ("POST", "/heartbeats", {"grant_id": "g-x"}),
    ("POST", "/admin/nodes/lab-0/drain", None),
    ("POST", "/admin/nodes/lab-0/resume", None),
    ("POST", "/admin/reconcile", None),
    ("GET", "/admin/queue", None),
    ("GET", "/metrics", None),
    ("GET", "/policy/profiles", None),
]


@pytest.mark.parametrize(("method", "path", "body"), ENDPOINTS)
def test_every_endpoint_refuses_strangers(env: Any, method: str, path: str, body: Any) -> None:
    _, client, t = env
    assert client(method, path, None, body)[0] == 401
    assert client(method, path, "not-a-token", body)[0] == 403
    assert client(method, path, t["alice-noaccess"], body)[0] == 403
