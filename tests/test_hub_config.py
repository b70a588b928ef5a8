"""hub_config/: the demo jupyterhub_config.py and the zero-to-jupyterhub values."""

from __future__ import annotations

import os
import subprocess
from importlib.metadata import entry_points
from pathlib import Path
from types import SimpleNamespace

import kubernetes_validate
import kubespawner.spawner as ks_spawner
import pytest
import yaml
from kubefixtures import kube_node
from kubernetes_asyncio.client import ApiClient
from traitlets.config import Config

from jupyter_gpushare import discovery
from jupyter_gpushare.broker.client import GPUShare, GrantInfo
from jupyter_gpushare.discovery import load_policy

HUB_CONFIG = Path(__file__).parents[1] / "hub_config"


def load_demo(tmp_path, monkeypatch) -> tuple[Config, dict]:
    monkeypatch.setenv("GPUSHARE_DEMO_DIR", str(tmp_path))
    c = Config()
    ns = {"get_config": lambda: c, "__file__": str(HUB_CONFIG / "jupyterhub_config.py")}
    exec(compile((HUB_CONFIG / "jupyterhub_config.py").read_text(), "jupyterhub_config.py",
                 "exec"), ns)
    return c, ns


def test_demo_config(tmp_path, monkeypatch):
    c, ns = load_demo(tmp_path, monkeypatch)
    assert c.JupyterHub.spawner_class.endswith("SimpleLocalGPUShareSpawner")
    assert c.JupyterHub.port == 8000 and c.JupyterHub.ip == "127.0.0.1"
    groups = c.JupyterHub.load_groups
    assert len(groups) >= 2 and all(groups[t]["users"] for t in groups)
    assert "admin" in c.Authenticator.admin_users
    assert set(c.Authenticator.allowed_users) >= {"alice", "bob", "admin"}
    assert Path(c.GPUShareSpawner.policy_file).exists()
    policy = load_policy(c.GPUShareSpawner.policy_file)
    # every demo team exists in the policy
    assert {t.name for t in policy.teams} >= set(groups)
    assert c.GPUShareSpawner.broker_api_token
    assert (tmp_path / "gpushare_tokens.json").exists()
    assert ("--allow-root" in c.Spawner.args) == (os.geteuid() == 0)
    assert c.ConfigurableHTTPProxy.command[0].endswith("configurable-http-proxy")
    names = [s["name"] for s in c.JupyterHub.services]
    assert "gpushare" in names


def test_demo_uses_discovered_gpus_when_nvml_finds_some(tmp_path, monkeypatch):
    _, ns = load_demo(tmp_path, monkeypatch)
    gpus = [{"uuid": f"GPU-{i}abc", "model": "H200", "memory_mib": 143771} for i in range(3)]
    policy = load_policy(ns["policy_for"](gpus))
    assert policy.inventory_source == "static"
    uuids = {g.uuid: n.pool for n in policy.nodes for g in n.gpus}
    assert uuids == {"GPU-0abc": "interactive", "GPU-1abc": "interactive", "GPU-2abc": "debug"}
    assert not any(g.simulated for n in policy.nodes for g in n.gpus)
    assert ns["policy_for"]([]) == HUB_CONFIG / "gpushare.yaml"


def test_demo_script_is_valid_bash_and_builds_everything():
    script = HUB_CONFIG / "demo.sh"
    assert os.access(script, os.X_OK)
    subprocess.run(["bash", "-n", str(script)], check=True)
    text = script.read_text()
    for needed in ("python3", "-m venv", "pip install", "npm install", "jupyterhub -f",
                   "http://127.0.0.1:", "any password"):
        assert needed in text, needed


def test_spawners_are_registered_entry_points():
    eps = {ep.name: ep for ep in entry_points(group="jupyterhub.spawners")}
    for name, cls in [("gpushare-local", "LocalGPUShareSpawner"),
                      ("gpushare-simple", "SimpleLocalGPUShareSpawner"),
                      ("gpushare-kube", "KubeGPUShareSpawner")]:
        assert eps[name].load().__name__ == cls


async def test_z2jh_values_extra_config_loads_and_builds_a_valid_pod(tmp_path, monkeypatch):
    values = yaml.safe_load((HUB_CONFIG / "z2jh-values.yaml").read_text())
    policy_file = tmp_path / "gpushare.yaml"
    policy_file.write_text(values["hub"]["extraFiles"]["gpushare-policy"]["stringData"])
    monkeypatch.setenv("GPUSHARE_POLICY", str(policy_file))
    # No Kubernetes API server can run here: discovery reads Node objects that pass the
    # published schema (see test_discovery.kube_node) instead of listing them from a cluster.
    cluster = [kube_node(f"gpu-node-{i}", pool, 4)
               for i, pool in enumerate(["train", "train", "interactive", "interactive", "debug"])]
    seen: list[dict] = []

    def fetch(options):  # type: ignore[no-untyped-def]
        seen.append(dict(options))
        return cluster

    monkeypatch.setattr(discovery, "fetch_kubernetes_nodes", fetch)
    monkeypatch.setenv("GPUSHARE_DATA_DIR", str(tmp_path))
    assert values["hub"]["extraEnv"]["GPUSHARE_DATA_DIR"]
    c = Config()
    for name, snippet in values["hub"]["extraConfig"].items():
        exec(compile(snippet, f"extraConfig.{name}", "exec"), {"c": c})
    assert c.JupyterHub.spawner_class == "jupyter_gpushare.spawner.kube.KubeGPUShareSpawner"
    assert c.KubeGPUShareSpawner.gpu_backend == "hami"
    svc = next(s for s in c.JupyterHub.services if s["name"] == "gpushare")
    assert svc["url"] == "http://hub:10101"
    assert "--BrokerApp.ip=0.0.0.0" in svc["command"]
    ports = {p["port"] for p in values["hub"]["service"]["extraPorts"]}
    assert 10101 in ports
    policy = load_policy(str(policy_file))
    assert {p.slug for p in policy.profiles} >= {"debug-eighth", "train-1gpu"}
    assert seen and seen[0]["pool_label"] == "gpushare.jupyter.org/pool"
    assert len(policy.nodes_in("interactive")) == 2 and len(policy.nodes_in("train")) == 2

    # the configured spawner builds a valid pod for a grant
    from jupyter_gpushare.spawner.kube import KubeGPUShareSpawner

    monkeypatch.setattr(ks_spawner, "load_config", lambda **kw: None)
    user = SimpleNamespace(name="alice", id=1, url="/user/alice/",
                           groups=[SimpleNamespace(name="vision")])
    sp = KubeGPUShareSpawner(_mock=True, config=c, user=user)
    sp.api_token = "t"
    assert sp.resolve_profile({"profile": "inference-quarter"}) == "inference-quarter"
    grant = GrantInfo(id="g1", team="vision", pool="interactive", profile="inference-quarter",
                      node="gpu-node-3", units=0.25,
                      gpus=(GPUShare(uuid="GPU-3f9c", memory_mib=28876, compute_pct=25.0,
                                     model="H100"),))
    sp.grant_id = grant.id
    sp.apply_profile(policy.profile("inference-quarter"))
    sp.apply_grant(grant, policy.profile("inference-quarter"))
    pod = ApiClient().sanitize_for_serialization(await sp.get_pod_manifest())
    kubernetes_validate.validate(pod, "1.33.0", strict=True)
    assert pod["spec"]["schedulerName"] == "hami-scheduler"
    assert pod["metadata"]["annotations"]["nvidia.com/use-gpuuuid"] == "GPU-3f9c"
    assert pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem"] == "28876"
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert env["GPUSHARE_BROKER_URL"] == "http://hub:10101/services/gpushare/api/v1"


@pytest.mark.parametrize("key", ["extraConfig", "extraFiles", "extraEnv"])
def test_values_have_hub_sections(key):
    values = yaml.safe_load((HUB_CONFIG / "z2jh-values.yaml").read_text())
    assert values["hub"][key]


def test_a_restarted_hub_checks_servers_for_a_second_before_starting_the_broker(tmp_path):
    """The broker is the hub's managed service, started once init_spawners is done or its
    timeout passed; a server that was starting when the hub died holds that for the whole
    timeout (JupyterHub's 10 s: the soak harness measured 16.9 s to a hub that answers)."""
    from jupyter_gpushare.hubsetup import INIT_SPAWNERS_TIMEOUT_S, setup_gpushare

    policy = Path(__file__).resolve().parent.parent / "hub_config" / "gpushare.yaml"
    c = Config()
    setup_gpushare(c, str(policy), data_dir=str(tmp_path))
    assert c.JupyterHub.init_spawners_timeout == INIT_SPAWNERS_TIMEOUT_S == 1
    mine = Config()
    mine.JupyterHub.init_spawners_timeout = 30  # an admin's own value stays
    setup_gpushare(mine, str(policy), data_dir=str(tmp_path))
    assert mine.JupyterHub.init_spawners_timeout == 30
    zero = Config()
    zero.JupyterHub.init_spawners_timeout = 0  # 0 is a value (no waiting at all), not unset
    setup_gpushare(zero, str(policy), data_dir=str(tmp_path))
    assert zero.JupyterHub.init_spawners_timeout == 0
