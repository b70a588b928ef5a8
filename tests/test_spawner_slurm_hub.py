"""Servers as Slurm jobs: a REAL JupyterHub with its proxy and the real broker service,
``SlurmGPUShareSpawner`` submitting to a REAL Slurm cluster (slurmctld and slurmd nodes in
network namespaces, fake GPUs, tests/slurmcluster.py), real single-user servers running
inside a node's namespace and reached through the proxy."""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.error
import urllib.request

import pytest
import realhub
from realhub import free_port, proxy_available, start_hub
from slurmcluster import SlurmCluster, needs_slurm, slurm_cluster  # noqa: F401 - fixture
from slurmhub import hub_env, slurm_hub_config
from test_spawner_hub import ProgressReader

pytestmark = [pytest.mark.hub, pytest.mark.slow, needs_slurm]

if not proxy_available():
    pytest.skip("configurable-http-proxy is not installed (npm install in hub_config/proxy)",
                allow_module_level=True)

# node1 is the broker's (and Jupyter's) node; the cluster's other nodes are not in the policy
POLICY = """
inventory:
  source: simulated
  nodes:
    - name: node1
      pool: interactive
      cpu: 4
      memory: 4000MiB
      gpus: [{model: H200, memory: 80GiB, count: 2}]
    - name: node2
      pool: train
      cpu: 4
      memory: 4000MiB
      gpus: [{model: H200, memory: 80GiB, count: 2}]
pools:
  interactive: {mode: shared}
  train: {mode: exclusive}
priority_classes:
  interactive: {value: 500, preemptible: false, grace_period: 3s}
teams:
  alpha:
    groups: [alpha]
    quotas:
      interactive: {guaranteed: 1}
      train: {guaranteed: 1}
profiles:
  - {slug: quarter, display_name: Quarter GPU, pool: interactive, gpu: {fraction: 1/4},
     cpu: 1, memory: 1GiB, max_lifetime: 2h}
  - {slug: one-gpu, display_name: One GPU, pool: train, gpu: {count: 1}, cpu: 1,
     memory: 1GiB}
"""

# what the job's environment holds, written by the batch script before the server starts
JOB_ENV = """
c.TestSlurmGPUShareSpawner.req_prologue = 'env > "$HOME/.job-env-$SLURM_JOB_ID"'
"""


@pytest.fixture(scope="module")
def setup(tmp_path_factory, slurm_cluster: SlurmCluster):  # noqa: F811
    tmp = tmp_path_factory.mktemp("slurmhub")
    policy = tmp / "policy.yaml"
    policy.write_text(POLICY)
    broker_port = free_port()
    extra = slurm_hub_config(slurm_cluster, tmp / "home", policy=policy,
                             broker_port=broker_port) + JOB_ENV
    hub = start_hub(tmp / "hub", extra_config=extra, env=hub_env(slurm_cluster))
    try:
        for name in ("alice", "bob"):
            hub.create_user(name, groups=["alpha"])
        hub.broker_api = (f"http://{slurm_cluster.host_ip}:{broker_port}"
                          "/services/gpushare/api/v1")
        hub.extra = extra
        hub.cluster = slurm_cluster
        hub.home = tmp / "home"
        yield hub
        for user in ("alice", "bob"):
            hub.api("DELETE", f"/users/{user}/server")
    finally:
        hub.stop()


# ------------------------------------------------------------------ helpers


def broker(hub, path: str) -> dict:
    tokens = json.loads((hub.tmp / "gpushare_tokens.json").read_text())
    req = urllib.request.Request(hub.broker_api + path,
                                 headers={"Authorization": f"token {tokens['spawner']}"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read() or b"{}")


def live_grants(hub, user: str) -> list[dict]:
    return [g for g in broker(hub, f"/grants?user={user}")["grants"] if not g.get("released_at")]


def server_model(hub, user: str) -> dict | None:
    status, model = hub.api("GET", f"/users/{user}")
    assert status == 200, model
    return (model.get("servers") or {}).get("")


def wait_ready(hub, user: str, timeout: float = 150) -> dict:
    deadline = time.monotonic() + timeout
    srv = None
    while time.monotonic() < deadline:
        srv = server_model(hub, user)
        if srv and srv.get("ready"):
            return srv
        time.sleep(0.3)
    raise AssertionError(f"{user} not ready: {srv}\n{hub.log_text()[-5000:]}\n"
                         + hub.cluster.logs(1500))


def stop(hub, user: str, timeout: float = 60) -> None:
    status, body = hub.api("DELETE", f"/users/{user}/server")
    assert status in (202, 204), (status, body)
    deadline = time.monotonic() + timeout
    while server_model(hub, user) is not None:
        assert time.monotonic() < deadline, hub.log_text()[-4000:]
        time.sleep(0.3)


def job_info(cluster: SlurmCluster, job_id: str) -> dict[str, str]:
    """``scontrol show job`` as key=value pairs."""
    out = cluster.run("scontrol", "show", "job", job_id, check=False).stdout
    return dict(m.groups() for m in re.finditer(r"(\w[\w/:]*)=(\S*)", out))


def in_queue(cluster: SlurmCluster, job_id: str) -> bool:
    return bool(cluster.run("squeue", "-h", "-j", job_id, check=False).stdout.strip())


def get_via_proxy(hub, path: str, token: str) -> tuple[int, dict]:
    req = urllib.request.Request(hub.url + path, headers={"Authorization": f"token {token}"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return exc.code, {}


def spawn(hub, user: str, profile: str = "quarter") -> tuple[int, object]:
    return hub.api("POST", f"/users/{user}/server", {"profile": profile}, timeout=200)


def job_env(hub, user: str, job_id: str) -> dict[str, str]:
    """The environment the Slurm job started the server with (the JOB_ENV prologue)."""
    path = hub.home / user / f".job-env-{job_id}"
    lines = path.read_text().splitlines()
    return dict(ln.split("=", 1) for ln in lines if "=" in ln)


def check_running_job(hub, user: str) -> tuple[str, dict]:
    """The user's server is a running Slurm job holding the grant's GRES on its node."""
    srv = server_model(hub, user)
    assert srv and srv["ready"], srv
    job_id = str((srv.get("state") or {}).get("job_id") or "")
    assert job_id.isdigit(), srv
    (grant,) = live_grants(hub, user)
    assert srv["state"]["gpushare_grant_id"] == grant["id"]
    info = job_info(hub.cluster, job_id)
    assert info["JobState"] == "RUNNING", info
    assert info["TresPerNode"] == "gres:shard:2", info  # 1/4 GPU x 8 shards per GPU
    assert info["ReqNodeList"] == grant["node"] == "node1" == info["NodeList"], info
    assert info["Account"] == "alpha", info  # the team
    assert info["TimeLimit"] == "02:00:00", info  # the profile's max lifetime
    assert info["Partition"] == hub.cluster.partition
    assert info["Requeue"] == "0", info  # a server's job is never rerun by Slurm
    # the hub reaches the server through the proxy, on the node's address
    token = hub.token_for(user)
    status, body = get_via_proxy(hub, f"/user/{user}/api/status", token)
    assert status == 200 and "started" in body, (status, body)
    # the grant reached the server: its extension asks the broker (across the bridge)
    status, answer = get_via_proxy(hub, f"/user/{user}/gpushare/api/grant", token)
    assert status == 200, (status, answer)
    assert json.dumps(answer).count(grant["id"]) >= 1, answer
    return job_id, grant


# ------------------------------------------------------------------ tests


def test_a_fraction_server_is_a_slurm_job_reached_through_the_proxy(setup):
    hub = setup
    reader = ProgressReader(hub, "alice", hub.token_for("alice"), timeout=150)
    reader.start()
    status, body = spawn(hub, "alice")
    assert status in (201, 202), (status, body)
    wait_ready(hub, "alice")
    reader.join(60)
    job_id, grant = check_running_job(hub, "alice")
    # the grant's environment reached the server through --export, beside Slurm's own
    env = job_env(hub, "alice", job_id)
    assert env["GPUSHARE_GRANT_ID"] == grant["id"]
    assert env["GPUSHARE_SLURM_GRES"] == "shard:2"
    assert env["GPUSHARE_ENFORCEMENT"] == "slurm-shard"
    assert env["GPUSHARE_UNITS"] == "0.25" and env["GPUSHARE_TEAM"] == "alpha"
    assert env["GPUSHARE_BROKER_URL"] == hub.broker_api  # reachable from the node
    # framework caps hold the memory share (shards do not): the grant's MiB of the 80 GiB card
    share = grant["gpus"][0]["memory_mib"] / 81920
    assert 0 < share <= 0.25
    assert float(env["XLA_PYTHON_CLIENT_MEM_FRACTION"]) == pytest.approx(share, abs=0.001)
    assert env["GPUSHARE_TORCH_MEMORY_FRACTION"] == env["XLA_PYTHON_CLIENT_MEM_FRACTION"]
    assert env["SLURM_JOB_ID"] == job_id
    assert env.get("CUDA_VISIBLE_DEVICES") == "0", env.get("CUDA_VISIBLE_DEVICES")  # Slurm's
    assert env["JUPYTERHUB_API_URL"].startswith(f"http://{hub.cluster.host_ip}:")
    text = "\n".join(json.dumps(e) for e in reader.events)
    messages = [str(e.get("message", "")) for e in reader.events]
    assert any(m.startswith("Granted 0.25 GPU on node1") for m in messages), text
    submit = [e for e in reader.events if (e.get("gpushare") or {}).get("slurm")]
    assert submit and submit[0]["gpushare"]["slurm"]["--gres"] == "shard:2", text
    assert any(f"Slurm job {job_id} running on" in m for m in messages), text
    assert reader.events[-1].get("ready"), text
    # stop: the job is cancelled (gone from the queue) and the grant released
    stop(hub, "alice")
    assert not in_queue(hub.cluster, job_id)
    assert job_info(hub.cluster, job_id)["JobState"] in ("CANCELLED", "COMPLETED"), job_id
    assert live_grants(hub, "alice") == []
    assert broker(hub, f"/grants/{grant['id']}").get("released_at")

    # batchspawner would lay user options over its script's variables: none but the
    # profile is accepted, and nothing is submitted
    status, body = hub.api("POST", "/users/alice/server", {"profile": "quarter", "gres": "gpu:2"})
    assert status == 400 and "not offered: gres" in body["message"], (status, body)
    assert server_model(hub, "alice") is None and live_grants(hub, "alice") == []


def test_a_whole_gpu_server_gets_gres_gpu(setup):
    hub = setup
    assert spawn(hub, "bob", "one-gpu")[0] in (201, 202)
    wait_ready(hub, "bob")
    srv = server_model(hub, "bob")
    job_id = str(srv["state"]["job_id"])
    (grant,) = live_grants(hub, "bob")
    info = job_info(hub.cluster, job_id)
    assert info["JobState"] == "RUNNING", info
    assert info["TresPerNode"] == "gres:gpu:1", info
    assert info["ReqNodeList"] == grant["node"] == "node2", info
    env = job_env(hub, "bob", job_id)
    assert env["GPUSHARE_SLURM_GRES"] == "gpu:1"
    assert env["GPUSHARE_ENFORCEMENT"] == "slurm-gpu"
    assert "XLA_PYTHON_CLIENT_MEM_FRACTION" not in env  # the whole card is the job's
    assert env.get("CUDA_VISIBLE_DEVICES") in ("0", "1"), env.get("CUDA_VISIBLE_DEVICES")
    stop(hub, "bob")
    assert not in_queue(hub.cluster, job_id)
    assert live_grants(hub, "bob") == []


def test_a_spawn_waiting_in_slurm_shows_the_reason(setup):
    """The broker grants (the GPU has room) but Slurm cannot start the job yet: work
    submitted outside Jupyter holds the node's CPUs. The spawn page says so, with Slurm's
    reason and the queue position, and the server starts once the node frees up."""
    hub = setup
    cluster: SlurmCluster = hub.cluster
    blocker = cluster.run("sbatch", "--parsable", "--nodelist=node1",
                          f"--cpus-per-task={cluster.cpus_per_node}",
                          f"--output={cluster.dir}/blocker-%j.log", "--wrap", "sleep 600"
                          ).stdout.strip()
    try:
        deadline = time.monotonic() + 30
        while job_info(cluster, blocker).get("JobState") != "RUNNING":
            assert time.monotonic() < deadline, job_info(cluster, blocker)
            time.sleep(0.2)
        reader = ProgressReader(hub, "bob", hub.token_for("bob"), timeout=150)
        reader.start()
        result: list = []
        caller = threading.Thread(target=lambda: result.append(spawn(hub, "bob")))
        caller.start()
        waiting: list[dict] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any(
            (e.get("gpushare") or {}).get("slurm_reason") == "Resources" for e in waiting
        ):
            waiting = [e for e in list(reader.events)
                       if (e.get("gpushare") or {}).get("slurm_state") == "PENDING"]
            time.sleep(0.2)
        text = "\n".join(json.dumps(e) for e in reader.events)
        pending = [e for e in waiting if e["gpushare"]["slurm_reason"] == "Resources"]
        assert pending, text
        job_id = pending[0]["gpushare"]["slurm_job_id"]
        assert pending[0]["gpushare"]["queue_position"] == 1, text
        assert (f"Slurm job {job_id} pending: position 1 in the Slurm queue "
                "(reason: Resources") in pending[0]["message"], text
        # the broker already granted it; Slurm holds it
        (grant,) = live_grants(hub, "bob")
        assert job_info(cluster, job_id)["JobState"] == "PENDING"
        assert server_model(hub, "bob") and not server_model(hub, "bob")["ready"]
        cluster.run("scancel", blocker)
        wait_ready(hub, "bob")
        caller.join(60)
        reader.join(60)
        assert result and result[0][0] in (201, 202), result
        check_running_job(hub, "bob")
        assert reader.events[-1].get("ready"), "\n".join(json.dumps(e) for e in reader.events)
        stop(hub, "bob")
        assert not in_queue(cluster, job_id)
        assert live_grants(hub, "bob") == []
    finally:
        cluster.run("scancel", blocker, check=False)


def test_hub_restart_keeps_the_slurm_job_and_its_grant(setup, monkeypatch):
    hub = setup
    assert spawn(hub, "alice")[0] in (201, 202)
    wait_ready(hub, "alice")
    job_id, before = check_running_job(hub, "alice")
    proxy_api = int(re.search(r'ConfigurableHTTPProxy.api_url = "http://127.0.0.1:(\d+)"',
                              (hub.tmp / "jupyterhub_config.py").read_text()).group(1))
    hub.stop()
    assert job_info(hub.cluster, job_id)["JobState"] == "RUNNING"  # the job outlives the hub
    ports = iter([hub.port, hub.api_port, proxy_api])
    monkeypatch.setattr(realhub, "free_port", lambda: next(ports))
    new = start_hub(hub.tmp, extra_config=hub.extra, env=hub_env(hub.cluster))
    hub.proc, hub.admin_token = new.proc, new.admin_token
    wait_ready(hub, "alice")
    # the restored spawner polled Slurm (job still running) and the broker (grant live)
    assert re.search(rf"grant {before['id']} of \S+ confirmed by the broker", _log(hub)), (
        _log(hub)[-3000:])
    again, after = check_running_job(hub, "alice")
    assert again == job_id and after["id"] == before["id"]
    # and the restored spawner still cancels the job and releases the grant on stop
    stop(hub, "alice")
    assert not in_queue(hub.cluster, job_id)
    assert live_grants(hub, "alice") == []


def _log(hub) -> str:
    deadline = time.monotonic() + 30
    text = hub.log_text()
    while "confirmed by the broker" not in text and time.monotonic() < deadline:
        time.sleep(0.5)
        text = hub.log_text()
    return text


def test_a_job_that_ends_by_itself_releases_its_grant(setup):
    """scancel outside the hub (an admin, the time limit, a dead node): the hub's poll finds
    the job gone and the grant goes at once."""
    hub = setup
    assert spawn(hub, "alice")[0] in (201, 202)
    wait_ready(hub, "alice")
    job_id, grant = check_running_job(hub, "alice")
    hub.cluster.run("scancel", job_id)
    deadline = time.monotonic() + 60
    while live_grants(hub, "alice"):
        assert time.monotonic() < deadline, hub.log_text()[-3000:]
        time.sleep(0.5)
    assert broker(hub, f"/grants/{grant['id']}")["released_at"]
    deadline = time.monotonic() + 60
    while server_model(hub, "alice") is not None:
        assert time.monotonic() < deadline, hub.log_text()[-3000:]
        time.sleep(0.5)
    # the spawner noticed it as its own server dying (the reason the hub's pages show),
    # though batchspawner's poll had already cleared the job from the state
    assert "gpushare alice: Your server stopped by itself" in hub.log_text(), (
        hub.log_text()[-3000:])


def test_a_dead_node_ends_the_server_and_releases_its_grant(setup):
    """node1 dies (its slurmd and every process in its namespace, the server included):
    Slurm fails the job (NODE_FAIL, no requeue), the hub's poll finds it gone and the grant
    is released. Last in the module: the node is started again afterwards."""
    hub = setup
    cluster: SlurmCluster = hub.cluster
    assert spawn(hub, "alice")[0] in (201, 202)
    wait_ready(hub, "alice")
    job_id, grant = check_running_job(hub, "alice")
    cluster.kill_node("node1")
    try:
        deadline = time.monotonic() + 120
        while live_grants(hub, "alice"):
            assert time.monotonic() < deadline, (job_info(cluster, job_id),
                                                 hub.log_text()[-3000:])
            time.sleep(1)
        info = job_info(cluster, job_id)
        assert info["JobState"] in ("NODE_FAIL", "FAILED", "CANCELLED"), info
        assert info["Restarts"] == "0", info  # not requeued behind the hub's back
        assert not in_queue(cluster, job_id)
        deadline = time.monotonic() + 60
        while server_model(hub, "alice") is not None:
            assert time.monotonic() < deadline, hub.log_text()[-3000:]
            time.sleep(0.5)
        assert broker(hub, f"/grants/{grant['id']}")["released_at"]
    finally:
        cluster.restart_node("node1")
