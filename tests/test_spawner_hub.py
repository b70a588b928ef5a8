"""The gpushare spawner in a REAL JupyterHub with its proxy, the real broker service and real
single-user servers (SimpleLocalGPUShareSpawner, simulated GPUs)."""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.request
from pathlib import Path

import psutil
import pytest
import realhub
from realhub import free_port, proxy_available, real_hub, start_hub

pytestmark = [pytest.mark.hub, pytest.mark.slow]

if not proxy_available():
    pytest.skip("configurable-http-proxy is not installed (npm install in hub_config/proxy)",
                allow_module_level=True)

POLICY = """
inventory:
  source: simulated
  simulated:
    - {name: dbg, pool: debug, nodes: 1, gpus_per_node: 1, model: H200, gpu_memory: 80GiB,
       cpu: 16, memory: 64GiB}
    - {name: lab, pool: interactive, nodes: 1, gpus_per_node: 1, model: H200, gpu_memory: 80GiB,
       cpu: 16, memory: 64GiB}
pools:
  debug: {mode: debug}
  interactive: {mode: shared}
priority_classes:
  interactive: {value: 500, preemptible: false, grace_period: 3s}
teams:
  alpha:
    groups: [alpha]
    quotas:
      debug: {guaranteed: 1/4}
      interactive: {guaranteed: 1/2}
  beta:
    groups: [beta]
    quotas:
      debug: {guaranteed: 1/8}
      interactive: {guaranteed: 1/2, borrow_limit: 1/2}
profiles:
  - {slug: debug-eighth, display_name: Debug 1/8 GPU, pool: debug, gpu: {fraction: 1/8},
     cpu: 1, memory: 1GiB}
  - {slug: half, display_name: Half GPU, pool: interactive, gpu: {fraction: 1/2},
     cpu: 1, memory: 1GiB}
  - {slug: alpha-only, display_name: Alpha only, pool: debug, gpu: {fraction: 1/8},
     teams: [alpha]}
"""


def config(policy: Path, broker_port: int) -> str:
    return f"""
from jupyter_gpushare.hubsetup import setup_gpushare
setup_gpushare(c, {str(policy)!r}, spawner="simple", broker_port={broker_port},
               data_dir=HUB_TMP, admin_users=["boss"])
c.GPUShareSpawner.policy_file = {str(policy)!r}
c.GPUShareSpawner.queue_poll_interval = 0.3
c.JupyterHub.allow_named_servers = True
c.JupyterHub.cleanup_servers = False
c.SimpleLocalProcessSpawner.home_dir_template = HUB_TMP + "/home/{{username}}"
"""


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("spawnhub")
    policy = tmp / "policy.yaml"
    policy.write_text(POLICY)
    broker_port = free_port()
    extra = config(policy, broker_port)
    with real_hub(tmp / "hub", extra_config=extra) as hub:
        for name, groups in [("alice", ["alpha"]), ("amy", ["alpha"]), ("bob", ["beta"]),
                             ("bea", ["beta"]), ("boss", [])]:
            hub.create_user(name, groups=groups)
        hub.broker_api = f"http://127.0.0.1:{broker_port}/services/gpushare/api/v1"
        hub.extra = extra
        yield hub
        for user in ("alice", "amy", "bob", "bea"):
            hub.api("DELETE", f"/users/{user}/server")
            hub.api("DELETE", f"/users/{user}/servers/two")


def tokens(hub) -> dict[str, str]:
    return json.loads((hub.tmp / "gpushare_tokens.json").read_text())


def broker(hub, method: str, path: str) -> tuple[int, dict]:
    req = urllib.request.Request(
        hub.broker_api + path, method=method,
        headers={"Authorization": f"token {tokens(hub)['spawner']}"},
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def live_grants(hub, user: str) -> list[dict]:
    status, body = broker(hub, "GET", f"/grants?user={user}")
    assert status == 200, body
    return [g for g in body["grants"] if not g.get("released_at")]


def wait_ready(hub, user: str, server: str = "", timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    model: dict = {}
    while time.monotonic() < deadline:
        status, model = hub.api("GET", f"/users/{user}")
        srv = (model.get("servers") or {}).get(server)
        if srv and srv.get("ready"):
            return srv
        if srv is None and model.get("pending") is None and time.monotonic() > deadline - 55:
            pass
        time.sleep(0.3)
    raise AssertionError(f"{user}/{server} not ready: {model}\n{hub.log_text()[-4000:]}")


def wait_stopped(hub, user: str, server: str = "", timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _, model = hub.api("GET", f"/users/{user}")
        if server not in (model.get("servers") or {}):
            return
        time.sleep(0.3)
    raise AssertionError(f"{user}/{server} still running\n{hub.log_text()[-4000:]}")


def spawn(hub, user: str, profile: str | None, server: str = "", **extra):
    body = dict(extra)
    if profile is not None:
        body["profile"] = profile
    path = f"/users/{user}/servers/{server}" if server else f"/users/{user}/server"
    return hub.api("POST", path, body)


def stop(hub, user: str, server: str = "") -> None:
    path = f"/users/{user}/servers/{server}" if server else f"/users/{user}/server"
    status, body = hub.api("DELETE", path)
    assert status in (202, 204), (status, body)
    wait_stopped(hub, user, server)


def test_team_a_user_gets_a_debug_grant_and_its_enforcement(setup):
    hub = setup
    # the user's own view of the spawn: JupyterHub's progress stream, read while it runs
    reader = ProgressReader(hub, "alice", hub.token_for("alice"))
    reader.start()
    status, body = spawn(hub, "alice", "debug-eighth")
    assert status in (201, 202), (status, body)
    wait_ready(hub, "alice")
    reader.join(60)
    grants = live_grants(hub, "alice")
    assert len(grants) == 1
    g = grants[0]
    assert g["team"] == "alpha" and g["pool"] == "debug" and g["profile"] == "debug-eighth"
    env = hub.server_env("alice")
    assert env["GPUSHARE_GRANT_ID"] == g["id"]
    assert env["GPUSHARE_GPU_UUIDS"] == g["gpus"][0]["uuid"]
    assert env["GPUSHARE_SIMULATED"] == "1"
    assert env["GPUSHARE_TEAM"] == "alpha" and env["GPUSHARE_POOL"] == "debug"
    assert env["GPUSHARE_UNITS"] == "0.125"
    assert env["GPUSHARE_BORROWED"] == "false"
    assert env["GPUSHARE_BROKER_URL"].endswith("/services/gpushare/api/v1")
    assert "sim" not in env.get("CUDA_VISIBLE_DEVICES", "")
    assert env["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    # the progress stream told the user about the grant: its share, node and GPU, then ready
    text = "\n".join(json.dumps(e) for e in reader.events)
    granted = [e for e in reader.events if str(e.get("message", "")).startswith("Granted ")]
    assert granted, (text, reader.errors)
    assert (granted[0].get("gpushare") or {}).get("grant_id") == g["id"], text
    assert g["gpus"][0]["uuid"] in granted[0]["message"], text
    assert reader.events[-1].get("ready"), text
    # stopping releases the grant
    stop(hub, "alice")
    assert live_grants(hub, "alice") == []
    _, view = broker(hub, "GET", f"/grants/{g['id']}")
    assert view.get("released_at")


def test_out_of_quota_without_borrowing_is_refused_at_once(setup):
    hub = setup
    status, body = spawn(hub, "bob", "debug-eighth")
    assert status in (201, 202), (status, body)
    wait_ready(hub, "bob")
    # beta's debug guarantee (1/8) is used and beta may not borrow: a clear refusal, not a 202
    status, body = spawn(hub, "bea", "debug-eighth")
    assert status == 409, (status, body)
    assert "Debug 1/8 GPU" in body["message"]
    assert re.search(r"quota|guarantee|borrow", body["message"], re.I), body
    _, model = hub.api("GET", "/users/bea")
    assert "" not in (model.get("servers") or {})
    assert live_grants(hub, "bea") == []
    stop(hub, "bob")


def test_tampered_options_are_refused_with_4xx_and_no_server(setup):
    hub = setup
    cases = [
        ({"profile": "debug-eighth", "gpu": "8"}, 400, "not offered: gpu"),
        ({"profile": "alpha-only"}, 403, "not allowed for your teams"),
        ({"profile": "no-such"}, 400, "no such profile"),
        ({"profile": ["half", "half"]}, 400, "must be a string"),
    ]
    for body, code, text in cases:
        status, answer = hub.api("POST", "/users/bob/servers/two", body)
        assert status == code, (body, status, answer)
        assert text in answer["message"], answer
        _, model = hub.api("GET", "/users/bob")
        assert "two" not in (model.get("servers") or {}), model
    assert live_grants(hub, "bob") == []


def test_borrowed_server_is_reclaimed_for_the_owning_team(setup):
    hub = setup
    # beta fills the interactive GPU: half within its guarantee, half borrowed from alpha
    assert spawn(hub, "bob", "half")[0] in (201, 202)
    wait_ready(hub, "bob")
    assert spawn(hub, "bea", "half")[0] in (201, 202)
    wait_ready(hub, "bea")
    (victim,) = live_grants(hub, "bea")
    assert victim["borrowed"] and victim["preemptible"]
    assert hub.server_env("bea")["GPUSHARE_BORROWED"] == "true"
    # alpha needs its guarantee back
    # (the spawn call blocks up to the hub's slow_spawn_timeout: run it beside the watcher)
    result: list = []
    caller = threading.Thread(target=lambda: result.append(spawn(hub, "amy", "half")))
    caller.start()
    # the victim is told while its grace period runs (its notice lives as long as its grant)
    seen: list[dict] = []
    deadline = time.monotonic() + 60
    while not seen and time.monotonic() < deadline:
        _, notices = broker(hub, "GET", f"/notices?grant_id={victim['id']}")
        seen = notices.get("notices") or []
        if not seen:
            _, view = broker(hub, "GET", f"/grants/{victim['id']}")
            if view.get("released_at"):
                break
            time.sleep(0.1)
    assert seen, "no preemption notice for the borrowed grant"
    assert seen[0].get("grant_id", victim["id"]) == victim["id"]
    caller.join(60)
    status, body = result[0]
    assert status in (201, 202), (status, body)
    wait_ready(hub, "amy", timeout=90)
    wait_stopped(hub, "bea")
    (amy,) = live_grants(hub, "amy")
    assert amy["team"] == "alpha" and not amy["borrowed"]
    assert live_grants(hub, "bea") == []
    assert len(live_grants(hub, "bob")) == 1  # inside its guarantee: untouched
    stop(hub, "amy")
    stop(hub, "bob")


class ProgressReader(threading.Thread):
    """Reads JupyterHub's progress stream (SSE) of a pending spawn until 'ready' or 'failed'.

    Retries while the spawn is not yet pending (the hub answers 400/404 then)."""

    def __init__(self, hub, user: str, token: str, timeout: float = 60) -> None:
        super().__init__(daemon=True)
        self.url = f"{hub.api_url}/users/{user}/server/progress"
        self.token, self.timeout = token, timeout
        self.events: list[dict] = []
        self.stamps: list[float] = []  # monotonic time each event arrived
        self.errors: list[str] = []

    def run(self) -> None:
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            req = urllib.request.Request(
                self.url, headers={"Authorization": f"token {self.token}",
                                   "Accept": "text/event-stream"})
            try:
                with urllib.request.urlopen(req, timeout=30) as resp:
                    for raw in resp:
                        line = raw.decode().strip()
                        if not line.startswith("data:"):
                            continue  # keepalive blank lines
                        event = json.loads(line[5:])
                        self.events.append(event)
                        self.stamps.append(time.monotonic())
                        if event.get("ready") or event.get("failed"):
                            return
                if self.events:
                    return
            except urllib.error.HTTPError as exc:
                self.errors.append(f"{exc.code}")  # not pending yet: ask again
            except OSError as exc:
                self.errors.append(repr(exc))
            time.sleep(0.05)


def test_waiting_spawn_shows_its_status_on_the_hub_progress_stream(setup):
    """A spawn that must wait (reclaiming a borrowed share for the owning team) tells the
    user why on JupyterHub's own progress stream: waiting with the broker's reason, then the
    grant, then ready."""
    hub = setup
    # beta takes the whole interactive GPU, half of it borrowed from alpha
    assert spawn(hub, "bob", "half")[0] in (201, 202)
    assert spawn(hub, "bea", "half")[0] in (201, 202)
    wait_ready(hub, "bob")
    wait_ready(hub, "bea")
    (victim,) = live_grants(hub, "bea")
    assert victim["borrowed"]
    reader = ProgressReader(hub, "amy", hub.token_for("amy"))  # the user's own token
    result: list = []
    caller = threading.Thread(target=lambda: result.append(spawn(hub, "amy", "half")))
    t0 = time.monotonic()
    caller.start()
    reader.start()
    # while the spawn waits, the broker's own view of the request: status and reason
    pending: dict = {}
    deadline = time.monotonic() + 60
    while not pending and reader.is_alive() and time.monotonic() < deadline:
        for e in list(reader.events):
            rid = (e.get("gpushare") or {}).get("request_id")
            if rid:
                _, view = broker(hub, "GET", f"/requests/{rid}")
                if view.get("status") in ("queued", "preempting"):
                    pending = view
                break
        time.sleep(0.05)
    reader.join(90)
    caller.join(30)
    events = reader.events
    text = "\n".join(json.dumps(e) for e in events)
    assert result and result[0][0] in (201, 202), result
    assert events and events[-1].get("ready"), (text, reader.errors, hub.log_text()[-3000:])
    assert pending, f"the request was never seen waiting at the broker:\n{text}"
    messages = [e.get("message", "") for e in events]
    waiting = [i for i, e in enumerate(events)
               if (e.get("gpushare") or {}).get("status") in ("queued", "preempting")]
    assert waiting, text
    w = events[waiting[0]]
    # the broker's status and reason, in words and as data, for the user to read
    assert w["gpushare"]["status"] == pending["status"], (pending, text)
    assert w["gpushare"]["request_id"] == pending["request_id"], (pending, text)
    assert pending["reason"] and pending["reason"] in w["message"], (pending, text)
    assert "Half GPU" in w["message"], text
    if pending["status"] == "queued":
        assert re.search(r"position \d+|waiting", w["message"]), text
    else:  # reclaiming: the borrowers' grace period is what it waits for
        assert re.search(r"reclaiming", w["message"], re.I), text
        assert re.search(r"reclaiming 1 grant", pending["reason"]), pending
        assert pending["victims"] == [victim["id"]], pending
    granted = [i for i, m in enumerate(messages) if m.startswith("Granted ")]
    assert granted and granted[0] > waiting[0], text
    assert "0.5 GPU" in messages[granted[0]], text
    assert len(events) - 1 > granted[0]  # 'ready' comes last, after the grant
    # the wait is real: the grant came only after the victim's 3 s grace period
    assert reader.stamps[granted[0]] - reader.stamps[waiting[0]] >= 2.0, text
    assert reader.stamps[granted[0]] - t0 >= 2.5, text
    wait_stopped(hub, "bea")
    (amy,) = live_grants(hub, "amy")
    assert amy["team"] == "alpha" and not amy["borrowed"]
    stop(hub, "amy")
    stop(hub, "bob")


def test_hub_restart_keeps_servers_and_grants_consistent(setup, monkeypatch):
    hub = setup
    assert spawn(hub, "alice", "debug-eighth")[0] in (201, 202)
    wait_ready(hub, "alice")
    (before,) = live_grants(hub, "alice")
    pid = hub.server_pid("alice")  # this hub's alice, never another hub's
    proxy_api = int(re.search(r'ConfigurableHTTPProxy.api_url = "http://127.0.0.1:(\d+)"',
                              (hub.tmp / "jupyterhub_config.py").read_text()).group(1))
    hub.stop()
    assert psutil.pid_exists(pid)  # cleanup_servers = False: the server outlives the hub
    ports = iter([hub.port, hub.api_port, proxy_api])
    monkeypatch.setattr(realhub, "free_port", lambda: next(ports))
    new = start_hub(hub.tmp, extra_config=hub.extra)
    hub.proc, hub.admin_token = new.proc, new.admin_token
    srv = wait_ready(hub, "alice")
    assert srv["ready"]
    assert psutil.pid_exists(pid)
    (after,) = live_grants(hub, "alice")
    assert after["id"] == before["id"]
    assert hub.server_env("alice")["GPUSHARE_GRANT_ID"] == before["id"]
    # and the restored spawner still releases it on stop
    stop(hub, "alice")
    assert live_grants(hub, "alice") == []
