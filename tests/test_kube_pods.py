"""KubeGPUShareSpawner pods, built by the real KubeSpawner (_mock=True, no cluster) and
validated strictly with kubernetes-validate for every supported Kubernetes version."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import kubernetes_validate
import kubespawner.spawner as ks_spawner
import pytest
from kubernetes_asyncio.client import ApiClient

from jupyter_gpushare.broker.client import GPUShare, GrantInfo
from jupyter_gpushare.policy import load_policy
from jupyter_gpushare.spawner.kube import KubeGPUShareSpawner

POLICY_FILE = str(Path(__file__).parents[1] / "hub_config" / "gpushare.yaml")
K8S_VERSIONS = ["1.30.0", "1.31.0", "1.32.0", "1.33.0", "1.34.0", "1.35.0", "1.36.0", "1.37.0"]
"""The Kubernetes versions we support (kubernetes-validate ships their schemas)."""


@pytest.fixture(autouse=True)
def no_kubeconfig(monkeypatch):
    monkeypatch.setattr(ks_spawner, "load_config", lambda **kw: None)


def make_spawner(backend: str, **kw) -> KubeGPUShareSpawner:
    user = SimpleNamespace(
        name="alice", id=7, url="/user/alice/", groups=[SimpleNamespace(name="vision")]
    )
    hub = SimpleNamespace(public_host="hub", url="http://hub:8081/hub/", base_url="/hub/",
                          api_url="http://hub:8081/hub/api")
    sp = KubeGPUShareSpawner(_mock=True, user=user, hub=hub, gpu_backend=backend,
                             policy_file=POLICY_FILE, **kw)
    sp.api_token = "secret-token"
    return sp


def grant_for(slug: str, *, simulated: bool = False, model: str = "H200") -> GrantInfo:
    policy = load_policy(POLICY_FILE)
    profile = policy.profile(slug)
    assert profile is not None
    node = policy.nodes_in(profile.pool)[0]
    gpu = node.gpus[0]
    n = profile.gpu.whole or 1
    if profile.gpu.whole:
        mem, pct, units = gpu.memory_mib, 100.0, float(n)
    else:
        mem = profile.gpu.memory_on(gpu)
        pct = profile.gpu.compute_on() / 10
        units = profile.gpu.units_milli / 1000
    shares = tuple(
        GPUShare(uuid=g.uuid.replace("sim-", "") if not simulated else g.uuid, memory_mib=mem,
                 compute_pct=pct, model=model, simulated=simulated, total_memory_mib=g.memory_mib)
        for g in node.gpus[:n]
    )
    return GrantInfo(id="grant-123", team="vision", pool=profile.pool, profile=slug,
                     node=node.name, gpus=shares, units=units)


async def pod_for(backend: str, slug: str, **kw) -> dict:
    sp = make_spawner(backend)
    policy = load_policy(POLICY_FILE)
    profile = policy.profile(slug)
    grant = grant_for(slug, **kw)
    sp.grant_id = grant.id
    sp.apply_profile(profile)
    sp.apply_grant(grant, profile)
    pod = await sp.get_pod_manifest()
    return ApiClient().sanitize_for_serialization(pod)


def validate_all(pod: dict) -> None:
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(pod, version, strict=True)


def limits(pod):
    return pod["spec"]["containers"][0]["resources"]["limits"]


def env(pod):
    return {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}


async def test_whole_gpus_pod():
    pod = await pod_for("whole", "train-4gpu")
    validate_all(pod)
    assert limits(pod)["nvidia.com/gpu"] == "4"
    assert pod["spec"]["nodeSelector"] == {"kubernetes.io/hostname": "train-0"}
    assert pod["spec"]["containers"][0]["image"] == "quay.io/jupyter/pytorch-notebook:cuda12-latest"
    e = env(pod)
    assert e["GPUSHARE_GRANT_ID"] == "grant-123" and e["GPUSHARE_ENFORCEMENT"] == "whole"
    assert "CUDA_VISIBLE_DEVICES" not in e
    assert pod["metadata"]["annotations"]["gpushare.jupyter.org/grant-id"] == "grant-123"


async def test_hami_pod():
    pod = await pod_for("hami", "inference-quarter")
    validate_all(pod)
    lim = limits(pod)
    assert lim["nvidia.com/gpu"] == "1"
    # the grant's memory, a quarter of the 141 GiB card, is the pod's hard limit (MiB)
    assert lim["nvidia.com/gpumem"] == str(144384 // 4) == str(grant_for("inference-quarter")
                                                                .gpus[0].memory_mib)
    assert lim["nvidia.com/gpucores"] == "25"
    assert pod["spec"]["schedulerName"] == "hami-scheduler"
    assert pod["metadata"]["annotations"]["nvidia.com/use-gpuuuid"].startswith("GPU-")
    assert "sim" not in pod["metadata"]["annotations"]["nvidia.com/use-gpuuuid"]
    assert pod["spec"]["nodeSelector"]["kubernetes.io/hostname"] == "lab-0"
    # the profile's CPU and memory
    assert pod["spec"]["containers"][0]["resources"]["requests"]["cpu"] == 4.0 or \
        str(pod["spec"]["containers"][0]["resources"]["requests"]["cpu"]) in ("4", "4.0")


async def test_kai_pod():
    pod = await pod_for("kai", "debug-eighth")
    validate_all(pod)
    assert pod["spec"]["schedulerName"] == "kai-scheduler"
    assert pod["spec"]["priorityClassName"] == "build"
    assert pod["metadata"]["labels"]["kai.scheduler/queue"] == "vision"
    assert pod["metadata"]["annotations"]["gpu-fraction"] == "0.125"
    assert "nvidia.com/gpu" not in limits(pod)
    pod = await pod_for("kai", "lab-small")
    validate_all(pod)
    assert pod["metadata"]["annotations"]["gpu-memory"] == "16384"


async def test_mig_pod():
    pod = await pod_for("mig", "debug-eighth", model="H100 1g.18gb")
    validate_all(pod)
    assert limits(pod)["nvidia.com/mig-1g.18gb"] == "1"


async def test_timeslice_pod_and_simulated_grants_are_not_pinned():
    pod = await pod_for("timeslice", "inference-quarter", simulated=True)
    validate_all(pod)
    assert limits(pod)["nvidia.com/gpu.shared"] == "1"
    assert "nodeSelector" not in pod["spec"] or not pod["spec"]["nodeSelector"]
    assert env(pod)["GPUSHARE_SIMULATED"] == "1"


async def test_a_second_grant_does_not_stack_on_the_first():
    sp = make_spawner("hami", extra_labels={"site": "x"})
    policy = load_policy(POLICY_FILE)
    g1 = grant_for("inference-quarter")
    sp.grant_id = g1.id
    sp.apply_grant(g1, policy.profile("inference-quarter"))
    g2 = grant_for("train-1gpu")
    sp.apply_grant(g2, policy.profile("train-1gpu"))
    pod = ApiClient().sanitize_for_serialization(await sp.get_pod_manifest())
    validate_all(pod)
    assert pod["metadata"]["labels"]["site"] == "x"
    assert pod["metadata"]["labels"]["gpushare.jupyter.org/pool"] == "train"
    assert limits(pod)["nvidia.com/gpucores"] == "100"


async def test_invalid_pod_is_caught_by_the_validator():
    """The validator really is strict: an unknown field fails."""
    pod = await pod_for("whole", "train-1gpu")
    pod["spec"]["gpuShare"] = 1
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(pod, K8S_VERSIONS[-1], strict=True)


async def test_options_are_checked_on_the_hub():
    from jupyterhub.spawner import SpawnException

    sp = make_spawner("whole")
    assert sp.resolve_profile({"profile": "train-4gpu"}) == "train-4gpu"
    with pytest.raises(SpawnException) as e:
        sp.resolve_profile({"profile": "train-4gpu", "image": "evil"})
    assert e.value.status_code == 400
    sp.user.groups = [SimpleNamespace(name="research")]
    with pytest.raises(SpawnException) as e:
        sp.resolve_profile({"profile": "train-4gpu"})
    assert e.value.status_code == 403


async def test_state_round_trip_keeps_the_grant():
    sp = make_spawner("whole")
    g = grant_for("train-1gpu")
    sp.grant_id, sp.gpushare_grant, sp.gpushare_profile = g.id, g, "train-1gpu"
    state = sp.get_state()
    assert state["gpushare_grant_id"] == "grant-123"
    sp2 = make_spawner("whole")
    sp2.load_state(state)
    assert sp2.grant_id == "grant-123" and sp2.gpushare_profile == "train-1gpu"
    assert sp2.get_state()["pod_name"] == state["pod_name"]
