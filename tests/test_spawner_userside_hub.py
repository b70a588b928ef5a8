"""What a user sees and gets, through a REAL JupyterHub with its proxy, the real broker service
and real single-user servers (SimpleLocalGPUShareSpawner, simulated GPUs): heartbeats reach
the broker, CPU-only profiles start without a grant, a killed server's grant goes at once, the
spawn page tells the truth, and a preempted user is told why.

Processes are found only by the pid the hub reports for the server (its state), never by name.
"""

from __future__ import annotations

import http.cookiejar
import json
import os
import re
import signal
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import psutil
import pytest
from realhub import free_port, proxy_available, real_hub

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
  interactive: {value: 500, preemptible: false, grace_period: 6s}
teams:
  alpha:
    groups: [alpha]
    quotas:
      debug: {guaranteed: 1/4}
      interactive: {guaranteed: 1/2, gpu_hours_per_month: 100}
  beta:
    groups: [beta]
    quotas:
      debug: {guaranteed: 1/8}
      interactive: {guaranteed: 1/2, borrow_limit: 1/2, per_user_cap: 1/2}
profiles:
  - {slug: debug-eighth, display_name: Debug 1/8 GPU, pool: debug, gpu: {fraction: 1/8},
     cpu: 1, memory: 1GiB}
  - {slug: half, display_name: Half GPU, pool: interactive, gpu: {fraction: 1/2},
     cpu: 1, memory: 1GiB, max_lifetime: 8h}
  - {slug: quarter, display_name: Quarter GPU, pool: interactive, gpu: {fraction: 1/4},
     cpu: 1, memory: 1GiB}
  - {slug: lab-16g, display_name: Notebook 16 GiB GPU, pool: interactive,
     gpu: {memory: 16GiB, compute: 10%}, cpu: 1, memory: 1GiB}
  - {slug: cpu-only, display_name: CPU only, description: No GPU, cpu: 1, memory: 1GiB}
"""


def config(policy: Path, broker_port: int) -> str:
    return f"""
from jupyter_gpushare.hubsetup import setup_gpushare
setup_gpushare(c, {str(policy)!r}, spawner="simple", broker_port={broker_port},
               data_dir=HUB_TMP, admin_users=["boss"])
c.GPUShareSpawner.policy_file = {str(policy)!r}
c.GPUShareSpawner.queue_poll_interval = 0.3
c.GPUShareSpawner.countdown_interval = 1.0
c.JupyterHub.allow_named_servers = True
c.Spawner.args = ["--allow-root", "--GPUShareServerApp.heartbeat_interval_s=1",
                  "--GPUShareServerApp.notices_interval_s=1"]
c.SimpleLocalProcessSpawner.home_dir_template = HUB_TMP + "/home/{{username}}"
"""


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("userside")
    policy = tmp / "policy.yaml"
    policy.write_text(POLICY)
    broker_port = free_port()
    with real_hub(tmp / "hub", extra_config=config(policy, broker_port)) as h:
        for name, groups in [("alice", ["alpha"]), ("amy", ["alpha"]), ("bob", ["beta"]),
                             ("bea", ["beta"])]:
            h.create_user(name, groups=groups)
        h.broker_api = f"http://127.0.0.1:{broker_port}/services/gpushare/api/v1"
        yield h
        for user in ("alice", "amy", "bob", "bea"):
            h.api("DELETE", f"/users/{user}/server")
            h.api("DELETE", f"/users/{user}/servers/two")


@pytest.fixture(autouse=True)
def no_servers_left(hub):
    """Each test starts with no server running, even after a failed one."""
    yield
    for user in ("alice", "amy", "bob", "bea"):
        for server in ("", "two"):
            if server_model(hub, user, server) is not None:
                path = f"/users/{user}/servers/{server}" if server else f"/users/{user}/server"
                hub.api("DELETE", path)
                wait_stopped(hub, user, server)


# ------------------------------------------------------------------------------ helpers


def tokens(hub) -> dict[str, str]:
    return json.loads((hub.tmp / "gpushare_tokens.json").read_text())


def broker(hub, method: str, path: str, token: str | None = None) -> tuple[int, Any]:
    req = urllib.request.Request(
        hub.broker_api + path, method=method,
        headers={"Authorization": f"token {token or tokens(hub)['spawner']}"},
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def live_grants(hub, user: str, server: str | None = None) -> list[dict]:
    status, body = broker(hub, "GET", f"/grants?user={user}")
    assert status == 200, body
    return [g for g in body["grants"] if not g.get("released_at")
            and (server is None or g.get("server") == server)]


def server_model(hub, user: str, server: str = "") -> dict | None:
    _, model = hub.api("GET", f"/users/{user}")
    return (model.get("servers") or {}).get(server)


def wait_ready(hub, user: str, server: str = "", timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        srv = server_model(hub, user, server)
        if srv and srv.get("ready"):
            return srv
        time.sleep(0.3)
    raise AssertionError(f"{user}/{server} not ready\n{hub.log_text()[-4000:]}")


def wait_stopped(hub, user: str, server: str = "", timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server_model(hub, user, server) is None:
            return
        time.sleep(0.2)
    raise AssertionError(f"{user}/{server} still running\n{hub.log_text()[-4000:]}")


def server_pid(hub, user: str, server: str = "") -> int:
    """The pid of the user's server, as the hub's spawner state records it."""
    srv = server_model(hub, user, server)
    assert srv and srv.get("state", {}).get("pid"), srv
    return int(srv["state"]["pid"])


def spawn(hub, user: str, profile: str | None, server: str = ""):
    body = {} if profile is None else {"profile": profile}
    path = f"/users/{user}/servers/{server}" if server else f"/users/{user}/server"
    return hub.api("POST", path, body)


def stop(hub, user: str, server: str = "") -> None:
    path = f"/users/{user}/servers/{server}" if server else f"/users/{user}/server"
    status, body = hub.api("DELETE", path)
    assert status in (202, 204), (status, body)
    wait_stopped(hub, user, server)


class Browser:
    """A logged-in browser session (cookies, XSRF) on the hub's HTML pages."""

    def __init__(self, hub, user: str) -> None:
        self.hub = hub
        self.jar = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.jar))
        page = self.get("/hub/login")[1]
        self.post("/hub/login", {"username": user, "password": "any"}, page)

    def _xsrf(self, page: str) -> str:
        m = re.search(r'name="_xsrf"\s+value="([^"]+)"', page)
        if m:
            return m.group(1)
        return next((c.value for c in self.jar if c.name == "_xsrf"), "")

    def get(self, path: str) -> tuple[int, str]:
        try:
            with self.opener.open(self.hub.url + path, timeout=60) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def post(self, path: str, fields: dict[str, str], page: str = "") -> tuple[int, str]:
        data = urllib.parse.urlencode({**fields, "_xsrf": self._xsrf(page)}).encode()
        try:
            with self.opener.open(self.hub.url + path, data=data, timeout=90) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()


def card(page: str, slug: str) -> str:
    """The text of one profile's card on the spawn page."""
    m = re.search(rf'<label class="gpushare-profile[^"]*" data-slug="{slug}".*?</label>', page,
                  re.S)
    assert m, f"no card for {slug}"
    return re.sub(r"<[^>]+>", " ", m.group(0))


# ------------------------------------------------------------------------------ item 11


def test_heartbeats_of_a_real_server_are_accepted_and_reach_the_team_usage(hub):
    assert spawn(hub, "alice", "half")[0] in (201, 202)
    wait_ready(hub, "alice")
    (g,) = live_grants(hub, "alice")
    deadline = time.monotonic() + 45
    usage = None
    while time.monotonic() < deadline and not usage:
        _, view = broker(hub, "GET", f"/grants/{g['id']}")
        usage = view.get("usage")
        time.sleep(0.5)
    log = hub.log_text()
    assert usage, f"no heartbeat accepted for {g['id']}\n{log[-3000:]}"
    assert "ts must be a number" not in log
    assert [x["uuid"] for x in usage["gpus"]] == [g["gpus"][0]["uuid"]]
    # and the team's usage carries the measured use of the pool
    status, team = broker(hub, "GET", "/teams/alpha/usage")
    assert status == 200, team
    measured = team["pools"]["interactive"].get("measured") or {}
    assert measured.get("heartbeats", 0) >= 1, team
    assert measured.get("last_heartbeat"), team
    stop(hub, "alice")


# ------------------------------------------------------------------------------ item 12


def test_cpu_only_profile_starts_without_a_grant_and_the_form_says_so(hub):
    status, body = spawn(hub, "alice", "cpu-only")
    assert status in (201, 202), (status, body)
    wait_ready(hub, "alice")
    assert live_grants(hub, "alice") == []
    # the broker never saw a request for this server
    status, reqs = broker(hub, "GET", "/requests?user=alice")
    assert status == 200, reqs
    assert not [r for r in reqs.get("requests", []) if r.get("profile") == "cpu-only"], reqs
    env = psutil.Process(server_pid(hub, "alice")).environ()
    assert env["CUDA_VISIBLE_DEVICES"] == "" and env["GPUSHARE_GPU"] == "none"
    assert "GPUSHARE_GRANT_ID" not in env
    stop(hub, "alice")
    page = Browser(hub, "alice").get("/hub/spawn")[1]
    assert "without a GPU grant" in card(page, "cpu-only")


# ------------------------------------------------------------------------------ item 14


def test_a_killed_server_loses_its_grant_within_10_seconds(hub):
    assert spawn(hub, "alice", "debug-eighth")[0] in (201, 202)
    wait_ready(hub, "alice")
    (g,) = live_grants(hub, "alice")
    pid = server_pid(hub, "alice")
    os.kill(pid, signal.SIGKILL)
    t0 = time.monotonic()
    while live_grants(hub, "alice") and time.monotonic() - t0 < 40:
        time.sleep(0.2)
    took = time.monotonic() - t0
    assert not live_grants(hub, "alice"), "grant still live 40 s after the server died"
    assert took <= 10.0, f"the grant of a killed server lived {took:.1f} s"
    _, view = broker(hub, "GET", f"/grants/{g['id']}")
    assert view.get("released_at")
    wait_stopped(hub, "alice")


# ------------------------------------------------------------------------------ item 15


def test_spawn_page_labels_simulated_gpus_and_shows_limits_in_words(hub):
    page = Browser(hub, "bob").get("/hub/spawn")[1]
    assert "SIMULATED" in page and "gpushare-simulated" in page
    lab = card(page, "lab-16g")
    assert "16 GiB, 10 % compute" in lab and "0.2 GPU" not in lab
    half = card(page, "half")
    assert "stopped after 8 h" in half
    assert "per-user cap 0.5 GPU in pool interactive" in half
    alice = Browser(hub, "alice").get("/hub/spawn")[1]
    assert re.search(r"team alpha: [\d.]+ GPU-hours left this month", card(alice, "half"))


def test_a_refusal_reads_as_a_sentence_keeps_the_pick_and_matches_the_card(hub):
    # bob holds his per-user cap (1/2) in the interactive pool
    assert spawn(hub, "bob", "half")[0] in (201, 202)
    wait_ready(hub, "bob")
    browser = Browser(hub, "bob")
    status, form_page = browser.get("/hub/spawn/bob/two")
    assert status == 200
    status, page = browser.post("/hub/spawn/bob/two", {"profile": "quarter"}, form_page)
    assert status == 409, page[-2000:]
    assert "SpawnException" not in page and "reason=" not in page
    m = re.search(r"Cannot start profile &#39;Quarter GPU&#39;: ([^<]+)", page) or re.search(
        r"Cannot start profile 'Quarter GPU': ([^<]+)", page)
    assert m, page[-3000:]
    said = m.group(1).strip()
    assert said.endswith(".")
    # the refused profile stays selected, and its card gives the broker's own reason
    assert re.search(r'value="quarter"\s+checked', page), page[-3000:]
    quarter = card(page, "quarter")
    assert "not available now" in quarter
    assert said.rstrip(".").split(";")[0] in " ".join(quarter.split()), (said, quarter)
    assert "no GPU free" not in quarter
    assert "cap" in said
    assert live_grants(hub, "bob", "two") == []
    stop(hub, "bob")


# ------------------------------------------------------------------------------ item 16


class ProgressReader(threading.Thread):
    """Reads JupyterHub's progress stream (SSE) of a pending spawn until ready or failed."""

    def __init__(self, hub, user: str, token: str, timeout: float = 90) -> None:
        super().__init__(daemon=True)
        self.url = f"{hub.api_url}/users/{user}/server/progress"
        self.token, self.timeout = token, timeout
        self.events: list[dict] = []
        self.stamps: list[float] = []

    def run(self) -> None:
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            req = urllib.request.Request(self.url, headers={
                "Authorization": f"token {self.token}", "Accept": "text/event-stream"})
            try:
                with urllib.request.urlopen(req, timeout=30) as resp:
                    for raw in resp:
                        line = raw.decode().strip()
                        if not line.startswith("data:"):
                            continue
                        event = json.loads(line[5:])
                        self.events.append(event)
                        self.stamps.append(time.time())
                        if event.get("ready") or event.get("failed"):
                            return
                if self.events:
                    return
            except (urllib.error.HTTPError, OSError):
                pass
            time.sleep(0.05)


def test_reclaim_countdown_for_the_owner_and_the_reason_for_the_preempted(hub):
    # beta fills the interactive GPU, half of it borrowed from alpha
    assert spawn(hub, "bob", "half")[0] in (201, 202)
    wait_ready(hub, "bob")
    assert spawn(hub, "bea", "half")[0] in (201, 202)
    wait_ready(hub, "bea")
    (victim,) = live_grants(hub, "bea")
    assert victim["borrowed"]
    reader = ProgressReader(hub, "amy", hub.token_for("amy"))
    result: list = []
    caller = threading.Thread(target=lambda: result.append(spawn(hub, "amy", "half")))
    caller.start()
    reader.start()
    notice: dict = {}
    deadline = time.monotonic() + 30
    while not notice and time.monotonic() < deadline:
        _, body = broker(hub, "GET", f"/notices?grant_id={victim['id']}")
        notice = (body.get("notices") or [{}])[0]
        time.sleep(0.1)
    assert notice, "no preemption notice"
    reader.join(90)
    caller.join(30)
    assert result and result[0][0] in (201, 202), result
    counted = [e for e in reader.events
               if (e.get("gpushare") or {}).get("status") == "preempting"
               and "deadline" in e["gpushare"]]
    assert len(counted) >= 3, json.dumps(reader.events, indent=1)
    broker_deadline = float(notice["deadline_ts"])
    for e in counted:
        # the deadline shown is the broker's (the victims' grace period), to within a poll
        from datetime import datetime
        shown = datetime.fromisoformat(e["gpushare"]["deadline"]).timestamp()
        assert abs(shown - broker_deadline) < 2.0, (e, notice)
        assert re.search(r"stopped at \d\d:\d\d:\d\d UTC \(in \d+ s\)", e["message"]), e
    lefts = [e["gpushare"]["seconds_left"] for e in counted]
    assert lefts == sorted(lefts, reverse=True) and lefts[0] > lefts[-1], lefts
    wait_ready(hub, "amy", timeout=60)
    wait_stopped(hub, "bea")
    # bea's pages say why her server is gone
    browser = Browser(hub, "bea")
    home = browser.get("/hub/home")[1]
    assert "gpushare-stop-reason" in home, home[-3000:]
    assert "owning team needed it back" in home
    status, gone = browser.get("/user/bea/lab")
    assert "owning team needed it back" in gone, gone[-3000:]
    stop(hub, "amy")
    stop(hub, "bob")
