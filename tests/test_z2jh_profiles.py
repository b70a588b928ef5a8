"""z2jh's profileList under KubeGPUShareSpawner: the shipped values' five entries give pods
that pass kubernetes-validate strictly and carry both the site's overrides and the grant's
GPU share, for every GPU backend; the grant always wins."""

from __future__ import annotations

import kubespawner.spawner as ks_spawner
import pytest
from z2jhkit import (
    container,
    env,
    hub_config,
    make_spawner,
    policy_doc,
    spawn_pod,
    validate_all,
    values,
    write_policy,
)

from jupyter_gpushare.spawner import enforcement
from jupyter_gpushare.spawner.kube import check_kube_profiles

BACKENDS = list(enforcement.KUBE_BACKENDS)
SLUGS = [e["slug"] for e in values()["singleuser"]["profileList"]]


@pytest.fixture(autouse=True)
def no_kubeconfig(monkeypatch):
    monkeypatch.setattr(ks_spawner, "load_config", lambda **kw: None)


@pytest.fixture
def policy_path(tmp_path):
    return write_policy(tmp_path, policy_doc())


def _tolerations(pod):
    return {(t.get("key"), t.get("value")) for t in pod["spec"].get("tolerations") or []}


def _mounts(pod):
    return {m["mountPath"]: m["name"] for m in container(pod).get("volumeMounts") or []}


def _volumes(pod):
    return {v["name"]: v for v in pod["spec"].get("volumes") or []}


def site_debug(pod):
    assert container(pod)["image"] == "quay.io/jupyter/pytorch-notebook:cuda12-latest"
    assert env(pod)["PIP_INDEX_URL"] == "https://pypi.example.org/simple"
    assert pod["metadata"]["labels"]["cost-center"] == "research"


def site_inference(pod):
    assert _volumes(pod)["datasets"]["persistentVolumeClaim"]["claimName"] == "datasets"
    assert _mounts(pod)["/data"] == "datasets"
    assert ("nvidia.com/gpu", None) in _tolerations(pod)


def site_train1(pod):
    assert pod["spec"]["nodeSelector"]["topology.kubernetes.io/zone"] == "zone-a"
    assert ("dedicated", "training") in _tolerations(pod)
    res = container(pod)["resources"]
    assert res["limits"]["ephemeral-storage"] == "50Gi"
    assert res["requests"]["ephemeral-storage"] == "20Gi"


def site_train4(pod):
    assert container(pod)["image"] == "nvcr.io/nvidia/pytorch:25.01-py3"
    assert str(container(pod)["resources"]["limits"]["cpu"]) in ("64", "64.0")
    assert env(pod)["NCCL_DEBUG"] == "WARN"
    assert _volumes(pod)["dshm"]["emptyDir"]["medium"] == "Memory"
    assert _mounts(pod)["/dev/shm"] == "dshm"
    # the policy profile's own kubespawner_override
    assert pod["spec"]["terminationGracePeriodSeconds"] == 120


def site_cpu(pod):
    assert container(pod)["image"] == "quay.io/jupyter/scipy-notebook:latest"
    assert pod["spec"]["nodeSelector"] == {"node-role.example.org/cpu": "true"}


SITE = {
    "debug-eighth": site_debug,
    "inference-quarter": site_inference,
    "train-1gpu": site_train1,
    "train-4gpu": site_train4,
    "cpu-small": site_cpu,
}


def grant_part(pod, grant, backend, sp):
    """Every limit, label, annotation, env var, node pin and scheduler of the grant."""
    frag = enforcement.pod_fragment(
        grant,
        backend,
        broker_url=sp.singleuser_broker_url(),
        pin=True,
        kai_queue=grant.team,
        mig_profile="1g.18gb",
        gpu_total_mib=sp.gpu_memory_map(),
    )
    limits = container(pod)["resources"]["limits"]
    for name, value in frag.limits.items():
        assert str(limits[name]) == value, name
    assert (
        any(k.startswith(("nvidia.com/", "metax-tech.com/")) for k in limits)
        or "gpu-fraction" in frag.annotations
        or "gpu-memory" in frag.annotations
    )
    for name, value in frag.annotations.items():
        assert pod["metadata"]["annotations"][name] == value
    for name, value in frag.labels.items():
        assert pod["metadata"]["labels"][name] == value
    e = env(pod)
    for name, value in frag.env.items():
        assert e[name] == value, name
    assert pod["spec"]["nodeSelector"]["kubernetes.io/hostname"] == grant.node
    if frag.scheduler_name:
        assert pod["spec"]["schedulerName"] == frag.scheduler_name
    if frag.priority_class_name:
        assert pod["spec"]["priorityClassName"] == frag.priority_class_name


def test_the_values_have_five_profiles_each_with_overrides():
    entries = values()["singleuser"]["profileList"]
    assert len(entries) == 5
    assert all(e.get("kubespawner_override") for e in entries)
    assert set(SLUGS) == set(SITE)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("slug", SLUGS)
async def test_each_profile_pod_has_the_sites_overrides_and_the_grant(backend, slug, policy_path):
    sp = make_spawner(hub_config(policy_path, backend), {"profile": slug})
    pod, grant = await spawn_pod(sp)
    validate_all(pod)
    SITE[slug](pod)
    if grant is None:
        assert env(pod)["NVIDIA_VISIBLE_DEVICES"] == "void"
        limits = container(pod)["resources"].get("limits") or {}
        assert not [k for k in limits if k.startswith(("nvidia.com/", "metax-tech.com/"))]
    else:
        grant_part(pod, grant, backend, sp)


async def test_an_option_choice_applies_its_override(policy_path):
    sp = make_spawner(
        hub_config(policy_path, "hami"), {"profile": "debug-eighth", "image": "tensorflow"}
    )
    pod, _ = await spawn_pod(sp)
    validate_all(pod)
    assert container(pod)["image"] == "quay.io/jupyter/tensorflow-notebook:cuda-latest"
    assert container(pod)["resources"]["limits"]["nvidia.com/gpumem"]


async def test_a_choice_not_offered_is_refused_naming_the_option(policy_path):
    from jupyterhub.spawner import SpawnException

    sp = make_spawner(hub_config(policy_path, "whole"))
    await sp._load_site_profiles()
    with pytest.raises(SpawnException) as e:
        sp.resolve_profile({"profile": "debug-eighth", "image": "evil"})
    assert e.value.status_code == 400 and "option 'image'" in str(e.value)
    with pytest.raises(SpawnException) as e:  # an option of another profile
        sp.resolve_profile({"profile": "train-1gpu", "image": "tensorflow"})
    assert e.value.status_code == 400 and "image" in str(e.value)
    assert sp.resolve_profile({"profile": "debug-eighth", "image": "tensorflow"}) == "debug-eighth"


async def test_the_next_spawn_starts_from_the_configured_values(policy_path):
    sp = make_spawner(hub_config(policy_path, "hami"), {"profile": "train-4gpu"})
    first, _ = await spawn_pod(sp)
    assert env(first)["NCCL_DEBUG"] == "WARN"
    sp.user_options = {"profile": "debug-eighth"}
    second, _ = await spawn_pod(sp)
    validate_all(second)
    e = env(second)
    assert "NCCL_DEBUG" not in e and e["PIP_INDEX_URL"]
    assert container(second)["image"] == "quay.io/jupyter/pytorch-notebook:cuda12-latest"
    assert "dshm" not in _volumes(second)
    assert (
        "terminationGracePeriodSeconds" not in second["spec"]
        or second["spec"]["terminationGracePeriodSeconds"] != 120
    )
    assert "nvidia.com/gpu" in container(second)["resources"]["limits"]
    assert container(second)["resources"]["limits"]["nvidia.com/gpucores"] != "100"


def test_the_shipped_values_pass_the_start_up_check(policy_path):
    for backend in BACKENDS:
        assert check_kube_profiles(hub_config(policy_path, backend)) == []


async def test_the_form_offers_the_options_and_reads_them_back(policy_path):
    sp = make_spawner(hub_config(policy_path, "whole"))
    sp.form_broker_timeout = 0.01
    sp.broker_url = "http://127.0.0.1:9/api/v1"  # nothing listens: the form goes on
    sp.broker_retry_window_s = 0
    page = await sp.render_gpushare_form()
    assert 'name="profile-option-debug-eighth--image"' in page
    assert "TensorFlow (CUDA)" in page
    options = sp.options_from_form(
        {
            "profile": ["debug-eighth"],
            "profile-option-debug-eighth--image": ["tensorflow"],
            "profile-option-train-1gpu--image": ["pytorch"],
        }
    )
    assert options == {"profile": "debug-eighth", "image": "tensorflow"}


async def test_a_callable_profile_list_is_evaluated_at_spawn(policy_path):
    c = hub_config(policy_path, "kai")
    entries = c.KubeSpawner.profile_list

    async def profile_list(spawner):
        return entries

    c.KubeSpawner.profile_list = profile_list
    sp = make_spawner(c, {"profile": "debug-eighth", "image": "tensorflow"})
    assert sp.resolve_profile() == "debug-eighth"  # the options wait for the list
    pod, grant = await spawn_pod(sp)
    validate_all(pod)
    assert container(pod)["image"] == "quay.io/jupyter/tensorflow-notebook:cuda-latest"
    grant_part(pod, grant, "kai", sp)


async def test_an_unlisted_choice_goes_through_kubespawners_own_checks(policy_path):
    c = hub_config(policy_path, "hami")
    option = c.KubeSpawner.profile_list[0]["profile_options"]["image"]
    option["unlisted_choice"] = {
        "enabled": True,
        "validation_regex": r"^quay\.io/jupyter/[a-z-]+:[\w.-]+$",
        "kubespawner_override": {"image": "{value}"},
    }
    image = "quay.io/jupyter/r-notebook:2025-01-01"
    sp = make_spawner(c, {"profile": "debug-eighth", "image--unlisted-choice": image})
    pod, _ = await spawn_pod(sp)
    assert container(pod)["image"] == image
    from jupyterhub.spawner import SpawnException

    with pytest.raises(SpawnException) as e:
        sp.resolve_profile({"profile": "debug-eighth", "image--unlisted-choice": "evil.io/x"})
    assert e.value.status_code == 400 and "validation regex" in str(e.value)


async def test_the_form_shows_options_only_for_profiles_the_user_may_start(tmp_path):
    doc = policy_doc()
    for p in doc["profiles"]:
        if p["slug"] == "debug-eighth":
            p["teams"] = ["nlp"]
    sp = make_spawner(hub_config(write_policy(tmp_path, doc), "whole"))
    sp.form_broker_timeout = 0.01
    sp.broker_url = "http://127.0.0.1:9/api/v1"
    sp.broker_retry_window_s = 0
    assert "profile-option-debug-eighth--image" not in await sp.render_gpushare_form()
