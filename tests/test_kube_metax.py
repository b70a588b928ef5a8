"""MetaX cards on Kubernetes through HAMi: pods built by the real KubeSpawner (_mock=True)
from a policy the planner drafted for MetaX C500 cards, validated with kubernetes-validate.

Resource names are HAMi's (docs/metax-support.md, charts' devices.metax.*):
``metax-tech.com/sgpu`` (count), ``metax-tech.com/vcore`` (% of the card, 100 = the whole
card), ``metax-tech.com/vmemory`` (a bare number is GiB, so we write ``<MiB>Mi``), and the
annotation ``metax-tech.com/use-gpuuuid`` to pin a card.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import kubernetes_validate
import kubespawner.spawner as ks_spawner
import pytest
from kubernetes_asyncio.client import ApiClient

from jupyter_gpushare.broker.client import GPUShare, GrantInfo
from jupyter_gpushare.planner import draft_policy, make_plan, read_plan_file
from jupyter_gpushare.policy import load_policy
from jupyter_gpushare.spawner.enforcement import KUBE_BACKENDS, pod_fragment
from jupyter_gpushare.spawner.kube import KubeGPUShareSpawner

ORG2 = Path(__file__).parent / "data" / "planner" / "org2-metax-mixed.yaml"
K8S_VERSIONS = ["1.30.0", "1.33.0", "1.37.0"]


@pytest.fixture(autouse=True)
def no_kubeconfig(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ks_spawner, "load_config", lambda **kw: None)


@pytest.fixture
def metax_policy(tmp_path: Path) -> str:
    path = tmp_path / "metax-policy.yaml"
    path.write_text(draft_policy(make_plan(read_plan_file(ORG2))))
    return str(path)


def grant_for(policy_file: str, slug: str, team: str, simulated: bool = False) -> GrantInfo:
    policy = load_policy(policy_file)
    profile = policy.profile(slug)
    assert profile is not None
    node = policy.nodes_in(profile.pool)[0]
    n = profile.gpu.whole or 1
    gpu = node.gpus[0]
    if profile.gpu.whole:
        mem, pct, units = gpu.memory_mib, 100.0, float(n)
    else:
        mem = profile.gpu.memory_on(gpu)
        pct = profile.gpu.compute_on() / 10
        units = profile.gpu.units_milli / 1000
    shares = tuple(GPUShare(uuid=g.uuid, memory_mib=mem, compute_pct=pct, model=g.model,
                            simulated=simulated, total_memory_mib=g.memory_mib)
                   for g in node.gpus[:n])
    return GrantInfo(id="grant-mx", team=team, pool=profile.pool, profile=slug,
                     node=node.name, gpus=shares, units=units)


async def pod_for(policy_file: str, slug: str, team: str, **kw: bool) -> dict:
    user = SimpleNamespace(name="mei", id=3, url="/user/mei/",
                           groups=[SimpleNamespace(name=team)])
    hub = SimpleNamespace(public_host="hub", url="http://hub:8081/hub/", base_url="/hub/",
                          api_url="http://hub:8081/hub/api")
    sp = KubeGPUShareSpawner(_mock=True, user=user, hub=hub, gpu_backend="hami-metax",
                             policy_file=policy_file)
    sp.api_token = "secret-token"
    policy = load_policy(policy_file)
    profile = policy.profile(slug)
    grant = grant_for(policy_file, slug, team, **kw)
    sp.grant_id = grant.id
    sp.apply_profile(profile)  # type: ignore[arg-type]
    sp.apply_grant(grant, profile)
    pod = await sp.get_pod_manifest()
    out: dict = ApiClient().sanitize_for_serialization(pod)
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(out, version, strict=True)
    return out


def limits(pod: dict) -> dict:
    return pod["spec"]["containers"][0]["resources"]["limits"]


def test_backend_is_offered() -> None:
    assert "hami-metax" in KUBE_BACKENDS
    assert "hami-metax" in KubeGPUShareSpawner.gpu_backend.values  # type: ignore[attr-defined]


async def test_fraction_of_a_c500(metax_policy: str) -> None:
    # chat/llama7b: 17,976 MiB of a C500 (343 milli of 52,428 usable MiB)
    pod = await pod_for(metax_policy, "chat-llama7b", "chat")
    lim = limits(pod)
    assert lim["metax-tech.com/sgpu"] == "1"
    assert lim["metax-tech.com/vmemory"] == "17976Mi"
    assert lim["metax-tech.com/vcore"] == "34"  # 343 milli of compute -> 34 %
    assert not any(k.startswith("nvidia.com/") for k in lim)
    assert pod["spec"]["schedulerName"] == "hami-scheduler"
    assert pod["metadata"]["annotations"]["metax-tech.com/use-gpuuuid"] == "GPU-inference-0-0"
    assert pod["spec"]["nodeSelector"]["kubernetes.io/hostname"] == "inference-0"


async def test_whole_c500_for_training(metax_policy: str) -> None:
    pod = await pod_for(metax_policy, "pretrain-gpt2", "pretrain")
    lim = limits(pod)
    # vcore 100 asks HAMi for the card exclusively; no vmemory = all of its memory
    assert (lim["metax-tech.com/sgpu"], lim["metax-tech.com/vcore"]) == ("1", "100")
    assert "metax-tech.com/vmemory" not in lim


async def test_simulated_grant_is_not_pinned(metax_policy: str) -> None:
    pod = await pod_for(metax_policy, "chat-llama7b", "chat", simulated=True)
    assert "metax-tech.com/use-gpuuuid" not in pod["metadata"]["annotations"]
    assert "kubernetes.io/hostname" not in (pod["spec"].get("nodeSelector") or {})


def test_fraction_never_asks_for_the_whole_card() -> None:
    grant = GrantInfo(id="g", team="t", pool="inference", profile="p", node="n1",
                      gpus=(GPUShare(uuid="GPU-1", memory_mib=60000, compute_pct=100.0,
                                     model="MetaX C500", total_memory_mib=65536),),
                      units=0.9)
    frag = pod_fragment(grant, "hami-metax")
    assert frag.limits["metax-tech.com/vcore"] == "99"
    assert frag.limits["metax-tech.com/vmemory"] == "60000Mi"
