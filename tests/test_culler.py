"""The GPU-aware idle culler: the pure rule, then a real broker (SQLite) fed real heartbeats.

The hub is the one stand-in here (it records which servers it was asked to stop); the
end-to-end path with a real hub is in ``test_prometheus.py``'s hub (the culler's metrics).
"""

from __future__ import annotations

from typing import Any

import pytest
from brokerpolicies import small
from corefactory import request

from jupyter_gpushare.broker.hubclient import HubClient
from jupyter_gpushare.broker.ops.culler import GPUCuller
from jupyter_gpushare.broker.service.broker import Broker
from jupyter_gpushare.broker.service.preempt import NoticeHub
from jupyter_gpushare.broker.store.db import grant_use_table, make_engine
from jupyter_gpushare.core.culling import CullFacts, CullRule, Verdict, verdict
from jupyter_gpushare.core.model import Kind

RULE = CullRule(window_s=3600, warn_s=600, stale_s=300)
T0 = 1_800_000_000.0


def facts(now: float, **kw: Any) -> CullFacts:
    base: dict[str, Any] = dict(interactive=True, granted_at=T0, last_heartbeat=now - 30)
    base.update(kw)
    return CullFacts(now=now, **base)


# -- the rule ---------------------------------------------------------------------------------


def test_rule_warns_after_the_window_and_acts_only_after_the_warning_period() -> None:
    assert verdict(facts(T0 + 3599), RULE) is Verdict.NONE
    assert verdict(facts(T0 + 3600), RULE) is Verdict.WARN
    warned = T0 + 3600
    assert verdict(facts(T0 + 3600 + 599, warned_at=warned), RULE) is Verdict.NONE
    assert verdict(facts(T0 + 3600 + 600, warned_at=warned), RULE) is Verdict.ACT
    # never an act without a warning, however long it has been idle
    assert verdict(facts(T0 + 10 * 86400), RULE) is Verdict.WARN


def test_rule_gpu_work_in_the_window_means_no_action() -> None:
    now = T0 + 5 * 3600
    assert verdict(facts(now, last_gpu_activity=now - 3599), RULE) is Verdict.NONE
    # even when warned before: the warning is withdrawn, never acted on
    assert verdict(facts(now, last_gpu_activity=now - 60, warned_at=now - 900),
                   RULE) is Verdict.CLEAR


def test_rule_kernel_activity_and_running_jobs_reset_the_clock() -> None:
    now = T0 + 5 * 3600
    assert verdict(facts(now, last_kernel_activity=now - 10), RULE) is Verdict.NONE
    assert verdict(facts(now, last_job_activity=now), RULE) is Verdict.NONE
    warned = now - 700
    assert verdict(facts(now, last_kernel_activity=now - 10, warned_at=warned),
                   RULE) is Verdict.CLEAR


def test_rule_leaves_batch_unmeasured_and_unconfigured_grants_alone() -> None:
    now = T0 + 5 * 3600
    assert verdict(facts(now, interactive=False), RULE) is Verdict.NONE
    assert verdict(facts(now, last_heartbeat=None), RULE) is Verdict.NONE
    assert verdict(facts(now, last_heartbeat=now - 301), RULE) is Verdict.NONE
    assert verdict(facts(now), CullRule(window_s=0)) is Verdict.NONE


# -- a real broker ------------------------------------------------------------------------------


class RecordingHub(HubClient):
    """The hub's stop call, recorded (everything else the culler needs is the broker)."""

    def __init__(self) -> None:
        super().__init__("http://127.0.0.1:1/hub/api", "unused")
        self.stopped: list[tuple[str, str]] = []
        self.calls: list[tuple[str, str, Any]] = []

    async def stop_server(self, user: str, server: str) -> bool:
        self.stopped.append((user, server))
        return True

    async def get_user(self, name: str) -> dict[str, Any] | None:
        return {"name": name, "servers": {}}  # the stop has finished

    async def _call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        self.calls.append((method, path, body))
        return 201, None


@pytest.fixture()
def world(tmp_path: Any) -> Any:
    clock = [T0]
    engine = make_engine(f"sqlite:///{tmp_path / 'gpushare.sqlite'}")
    broker = Broker(small(), engine, clock=lambda: clock[0])
    broker.load()
    hub = RecordingHub()
    culls: list[tuple[str, str]] = []
    culler = GPUCuller(broker, hub, NoticeHub(), on_cull=lambda p, a: culls.append((p, a)),
                       windows={"shared": 3600.0}, warn_s=600.0, stale_s=300.0)
    yield clock, broker, hub, culler, culls
    broker.close()
    engine.dispose()


def grant_in(broker: Broker, user: str, kind: Kind = Kind.INTERACTIVE) -> str:
    view = broker.submit(request("a", "shared", fraction=0.25, user=user, kind=kind))
    assert view["status"] == "granted", view
    return str(view["grant_id"])


def beat(broker: Broker, gid: str, ts: float, util: float, kernel: float | None = None) -> None:
    uuid = broker.state.grants[gid].placement.slices[0].gpu_uuid
    broker.heartbeat(gid, ts, [{"uuid": uuid, "utilization_pct": util,
                                "memory_used_mib": 1000.0, "power_w": 90.0}],
                     True, kernel_activity=kernel)


async def run_until(clock: list[float], broker: Broker, culler: GPUCuller, end: float,
                    beats: dict[str, Any]) -> list[dict[str, Any]]:
    """Advance the clock by 60 s steps to ``end``: heartbeats (``beats[gid](t)`` gives
    (util, kernel activity) or None), then a culler pass."""
    events: list[dict[str, Any]] = []
    while clock[0] < end:
        clock[0] += 60
        for gid, f in beats.items():
            if gid in broker.state.grants:
                util, kernel = f(clock[0])
                beat(broker, gid, clock[0], util, kernel)
        events += await culler.tick()
    return events


async def test_warns_waits_then_stops_and_releases(world: Any) -> None:
    clock, broker, hub, culler, culls = world
    gid = grant_in(broker, "alice")
    holder = broker.state.grants[gid].request.holder
    idle = {gid: lambda t: (0.0, None)}
    await run_until(clock, broker, culler, T0 + 3540, idle)
    assert culler.warned == {} and broker.notices(grant_id=gid) == []
    events = await run_until(clock, broker, culler, T0 + 3600, idle)
    assert [e["event"] for e in events] == ["warned"]
    (notice,) = broker.notices(grant_id=gid)
    assert notice["kind"] == "idle" and notice["deadline_ts"] == T0 + 3600 + 600
    assert "no GPU activity for 1 h" in notice["reason"]
    assert broker.notices(user="bob") == []
    # the warning period: nothing happens to the server or the grant
    await run_until(clock, broker, culler, T0 + 3600 + 540, idle)
    assert hub.stopped == [] and gid in broker.state.grants
    events = await run_until(clock, broker, culler, T0 + 3600 + 600, idle)
    assert [e["event"] for e in events] == ["stopped"]
    assert hub.stopped == [("alice", holder)]
    assert gid not in broker.state.grants
    grant = broker.get_grant(gid)
    assert grant is not None and grant["release_reason"].startswith("culled: ")
    assert culls == [("shared", "stop")]
    assert broker.notices(grant_id=gid) == []
    assert [e["event"] for e in culler.history] == ["warned", "stopped"]
    assert gid not in broker.usage.last_seen  # what an ended grant sent is forgotten (bounded)
    # the heartbeats reached the lasting per-grant aggregates (what the report reads)
    with broker.engine.connect() as conn:
        (row,) = conn.execute(grant_use_table.select()).all()
    assert row.grant_id == gid and row.samples == 70


async def test_never_acts_on_a_server_whose_kernel_did_gpu_work(world: Any) -> None:
    clock, broker, hub, culler, _ = world
    busy = grant_in(broker, "alice")
    # GPU work once every 50 minutes, idle otherwise: never 1 h without GPU activity
    beats = {busy: lambda t: (60.0 if int(t - T0) % 3000 == 0 else 0.0, None)}
    events = await run_until(clock, broker, culler, T0 + 6 * 3600, beats)
    assert events == [] and hub.stopped == [] and busy in broker.state.grants


async def test_kernel_activity_and_a_running_job_keep_the_share(world: Any) -> None:
    clock, broker, hub, culler, _ = world
    kernel = grant_in(broker, "alice")
    other = grant_in(broker, "bob")
    job = grant_in(broker, "bob", kind=Kind.BATCH)
    beats = {
        kernel: lambda t: (0.0, t - 120),  # CPU work in a kernel, no GPU use
        other: lambda t: (0.0, None),  # idle, but bob runs a batch job
        job: lambda t: (0.0, None),  # the job itself is never culled
    }
    events = await run_until(clock, broker, culler, T0 + 4 * 3600, beats)
    assert events == [] and hub.stopped == []
    assert {kernel, other, job} <= set(broker.state.grants)


async def test_activity_after_the_warning_withdraws_it(world: Any) -> None:
    clock, broker, hub, culler, _ = world
    gid = grant_in(broker, "alice")
    woke = T0 + 3600 + 300
    beats = {gid: lambda t: (80.0 if t == woke else 0.0, None)}
    events = await run_until(clock, broker, culler, T0 + 3600 + 1200, beats)
    assert [e["event"] for e in events] == ["warned", "cleared"]
    assert hub.stopped == [] and gid in broker.state.grants
    assert broker.notices(grant_id=gid) == []


async def test_cpu_action_restarts_on_the_cpu_profile_and_the_report_counts_it(
    world: Any,
) -> None:
    from jupyter_gpushare.core.ledger import month_of
    from jupyter_gpushare.report import make_report
    from jupyter_gpushare.report.source import load_month

    clock, broker, hub, culler, culls = world
    culler.action, culler.cpu_profile = "cpu", "cpu-only"
    gid = grant_in(broker, "alice")
    holder = broker.state.grants[gid].request.holder
    events = await run_until(clock, broker, culler, T0 + 3600 + 600,
                             {gid: lambda t: (0.0, None)})
    assert [e["event"] for e in events] == ["warned", "moved to cpu"]
    path = f"/users/alice/servers/{holder}" if holder else "/users/alice/server"
    assert hub.stopped == [("alice", holder)]
    assert hub.calls == [("POST", path, {"profile": "cpu-only"})]
    assert culls == [("shared", "cpu")] and gid not in broker.state.grants
    # the ledger says why the grant ended: the monthly report counts it as culled
    year, month = month_of(T0)
    _, _, doc = make_report(load_month(broker.engine, broker.policy, year, month,
                                       now=clock[0] + 1))  # the report at the test's now
    (row,) = [t for t in doc["teams"] if t["team"] == "a" and t["pool"] == "shared"]
    assert row["culled"] == 1
    assert row["measured_gpu_hours"] > 0 and row["idle_share"] == 1.0


# -- end to end: a real hub, a real single-user server, its server extension's heartbeats ------

HUB_POLICY = """
inventory:
  source: simulated
  simulated:
    - {name: lab, pool: interactive, nodes: 1, gpus_per_node: 1, model: H200, gpu_memory: 80GiB,
       cpu: 16, memory: 64GiB}
pools:
  interactive: {mode: shared}
priority_classes:
  interactive: {value: 500, preemptible: false, grace_period: 3s}
teams:
  alpha:
    groups: [alpha]
    quotas:
      interactive: {guaranteed: 1/2}
profiles:
  - {slug: half, display_name: Half GPU, pool: interactive, gpu: {fraction: 1/2},
     cpu: 1, memory: 1GiB}
"""


@pytest.mark.hub
@pytest.mark.slow
def test_a_real_idle_server_is_warned_then_stopped_and_its_grant_released(
    tmp_path: Any,
) -> None:
    import json
    import time
    import urllib.request

    from realhub import free_port, proxy_available, real_hub

    if not proxy_available():
        pytest.skip("configurable-http-proxy is not installed in hub_config/proxy (npm install)")
    policy = tmp_path / "policy.yaml"
    policy.write_text(HUB_POLICY)
    broker_conf = tmp_path / "broker_config.py"
    broker_conf.write_text(
        "c.GPUCuller.windows = {'interactive': 4.0}\n"
        "c.GPUCuller.warn_s = 6.0\nc.GPUCuller.interval_s = 1.0\nc.GPUCuller.stale_s = 30.0\n"
    )
    port = free_port()
    extra = f"""
from jupyter_gpushare.hubsetup import setup_gpushare
setup_gpushare(c, {str(policy)!r}, spawner="simple", broker_port={port}, data_dir=HUB_TMP,
               broker_args=["--BrokerApp.config_file={broker_conf}",
                            "--BrokerLimits.heartbeat_min_interval_s=0"])
c.GPUShareSpawner.policy_file = {str(policy)!r}
c.Spawner.args = ["--allow-root", "--GPUShareServerApp.heartbeat_interval_s=1"]
c.SimpleLocalProcessSpawner.home_dir_template = HUB_TMP + "/home/{{username}}"
"""
    with real_hub(tmp_path / "hub", extra_config=extra) as hub:
        hub.create_user("alice", groups=["alpha"])
        spawner = json.loads((hub.tmp / "gpushare_tokens.json").read_text())["spawner"]

        def broker(path: str) -> Any:
            req = urllib.request.Request(
                f"http://127.0.0.1:{port}/services/gpushare/api/v1{path}",
                headers={"Authorization": f"token {spawner}"})
            with urllib.request.urlopen(req, timeout=10) as resp:
                return json.loads(resp.read())

        def running() -> bool:
            _, model = hub.api("GET", "/users/alice")
            return "" in (model.get("servers") or {})

        status, _ = hub.api("POST", "/users/alice/server", {"profile": "half"})
        assert status in (201, 202), hub.log_text()[-3000:]
        deadline = time.monotonic() + 90
        notice = None
        while time.monotonic() < deadline and notice is None:
            notices = broker("/notices?user=alice")["notices"]
            notice = next((n for n in notices if n["kind"] == "idle"), None)
            time.sleep(0.5)
        assert notice is not None, hub.log_text()[-4000:]
        # warned, not yet acted on: the server still runs and holds its grant
        assert running()
        live = [g for g in broker("/grants?user=alice")["grants"] if not g["released_at"]]
        assert [g["id"] for g in live] == [notice["grant_id"]]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and running():
            time.sleep(0.5)
        assert not running(), hub.log_text()[-4000:]
        # seen stopped no earlier than the warning's deadline (warn_s = 6 s after it)
        assert time.time() >= notice["deadline_ts"]
        grant = broker(f"/grants/{notice['grant_id']}")
        assert grant["released_at"] and grant["release_reason"].startswith("culled: ")


def test_the_server_extension_words_an_idle_warning_as_such() -> None:
    from jupyter_gpushare.serverextension.service import notice_text

    idle = notice_text({"kind": "idle", "reason": "no GPU activity for 2 h",
                        "deadline_ts": T0, "seconds_left": 600})
    assert idle.startswith("IDLE GPU:") and "no GPU activity for 2 h" in idle
    assert "PREEMPTION" not in idle and "in 600 s" in idle
    assert notice_text({"kind": "preemption", "deadline_ts": T0}).startswith("PREEMPTION:")
