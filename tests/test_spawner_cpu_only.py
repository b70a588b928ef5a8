"""A profile without GPU: no GPU in the environment, no GPU resources in the pod, even on a
spawner that held a grant before (pure; the real-hub path is in test_spawner_userside_hub)."""

from __future__ import annotations

from types import SimpleNamespace

import kubespawner.spawner as ks_spawner
import pytest
from kubernetes_asyncio.client import ApiClient
from test_kube_pods import POLICY_FILE, grant_for, make_spawner, validate_all

from jupyter_gpushare.policy import load_policy
from jupyter_gpushare.spawner import enforcement
from jupyter_gpushare.spawner.local import SimpleLocalGPUShareSpawner


@pytest.fixture(autouse=True)
def no_kubeconfig(monkeypatch):
    monkeypatch.setattr(ks_spawner, "load_config", lambda **kw: None)


def test_no_gpu_env_hides_every_gpu() -> None:
    env = enforcement.no_gpu_env("cpu-only")
    assert env["CUDA_VISIBLE_DEVICES"] == "" and env["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert env["GPUSHARE_GPU"] == "none" and env["GPUSHARE_PROFILE"] == "cpu-only"
    assert "GPUSHARE_GRANT_ID" not in env


async def test_kube_pod_of_a_cpu_only_profile_has_no_gpu_after_a_gpu_spawn() -> None:
    policy = load_policy(POLICY_FILE)
    sp = make_spawner("hami")
    gpu = policy.profile("inference-quarter")
    sp.apply_profile(gpu)
    sp.apply_grant(grant_for("inference-quarter"), gpu)  # the spawner's previous server
    cpu = policy.profile("cpu-only")
    sp.grant_id = None
    sp.apply_profile(cpu)
    sp.apply_no_gpu(cpu)
    pod = ApiClient().sanitize_for_serialization(await sp.get_pod_manifest())
    validate_all(pod)
    c = pod["spec"]["containers"][0]
    assert not any(k.startswith("nvidia.com/") for k in (c["resources"].get("limits") or {}))
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "void" and env["CUDA_VISIBLE_DEVICES"] == ""
    assert "GPUSHARE_GRANT_ID" not in env
    assert pod["spec"].get("schedulerName") in (None, "default-scheduler")


def test_local_env_of_a_cpu_only_server() -> None:
    user = SimpleNamespace(name="alice", id=1, url="/user/alice/", groups=[])
    hub = SimpleNamespace(public_host="hub", url="http://hub:8081/hub/", base_url="/hub/",
                          api_url="http://hub:8081/hub/api")
    sp = SimpleLocalGPUShareSpawner(user=user, hub=hub)
    sp.api_token = "t"
    sp.gpushare_cpu_only, sp.gpushare_profile = True, "cpu-only"
    env = sp.get_env()
    assert env["CUDA_VISIBLE_DEVICES"] == "" and env["GPUSHARE_GPU"] == "none"
    state = sp.get_state()
    assert state["gpushare_cpu_only"] is True and "gpushare_grant_id" not in state
