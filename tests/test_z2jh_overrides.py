"""Overrides that would undo the grant are refused at start-up, naming profile and key; a
policy profile's kubespawner_override is read and checked; unmapped entries are warned of."""

from __future__ import annotations

import logging

import kubespawner.spawner as ks_spawner
import pytest
from jupyterhub.spawner import SpawnException
from z2jhkit import env, hub_config, make_spawner, policy_doc, spawn_pod, values, write_policy

from jupyter_gpushare.policy import PolicyError, load_policy
from jupyter_gpushare.spawner.kube import KubeProfileError, check_kube_profiles


@pytest.fixture(autouse=True)
def no_kubeconfig(monkeypatch):
    monkeypatch.setattr(ks_spawner, "load_config", lambda **kw: None)


@pytest.fixture
def policy_path(tmp_path):
    return write_policy(tmp_path, policy_doc())


def entries_with(slug: str, override: dict) -> list[dict]:
    entries = values()["singleuser"]["profileList"]
    for e in entries:
        if e["slug"] == slug:
            e["kubespawner_override"] = {**e["kubespawner_override"], **override}
    return entries


REFUSED = [
    (
        "whole",
        {"extra_resource_limits": {"nvidia.com/gpu": 2}},
        "extra_resource_limits.nvidia.com/gpu",
    ),
    (
        "hami",
        {"extra_resource_limits": {"nvidia.com/gpumem": 80000}},
        "extra_resource_limits.nvidia.com/gpumem",
    ),
    (
        "mig",
        {"extra_resource_guarantees": {"nvidia.com/mig-3g.71gb": 1}},
        "extra_resource_guarantees.nvidia.com/mig-3g.71gb",
    ),
    (
        "hami-metax",
        {"extra_resource_limits": {"metax-tech.com/sgpu": 1}},
        "extra_resource_limits.metax-tech.com/sgpu",
    ),
    (
        "timeslice",
        {"environment": {"CUDA_VISIBLE_DEVICES": "0,1"}},
        "environment.CUDA_VISIBLE_DEVICES",
    ),
    (
        "whole",
        {"environment": {"NVIDIA_VISIBLE_DEVICES": "all"}},
        "environment.NVIDIA_VISIBLE_DEVICES",
    ),
    (
        "whole",
        {"environment": {"GPUSHARE_MEMORY_LIMIT_MIB": "999999"}},
        "environment.GPUSHARE_MEMORY_LIMIT_MIB",
    ),
    ("hami", {"scheduler_name": "default-scheduler"}, "scheduler_name"),
    ("kai", {"priority_class_name": "train"}, "priority_class_name"),
    (
        "kai",
        {"extra_labels": {"kai.scheduler/queue": "other-team"}},
        "extra_labels.kai.scheduler/queue",
    ),
    (
        "hami",
        {"extra_annotations": {"nvidia.com/use-gpuuuid": "GPU-x"}},
        "extra_annotations.nvidia.com/use-gpuuuid",
    ),
    ("kai", {"extra_annotations": {"gpu-fraction": "1"}}, "extra_annotations.gpu-fraction"),
    (
        "whole",
        {"node_selector": {"kubernetes.io/hostname": "other"}},
        "node_selector.kubernetes.io/hostname",
    ),
    ("whole", {"extra_pod_config": {"nodeName": "other"}}, "extra_pod_config.nodeName"),
    ("hami", {"extra_pod_config": {"schedulerName": "x"}}, "extra_pod_config.schedulerName"),
    (
        "whole",
        {"extra_container_config": {"resources": {"limits": {"nvidia.com/gpu": 8}}}},
        "extra_container_config.resources.limits.nvidia.com/gpu",
    ),
    (
        "whole",
        {
            "extra_containers": [
                {"name": "side", "image": "x", "resources": {"limits": {"nvidia.com/gpu": 1}}}
            ]
        },
        "extra_containers[0].resources.limits.nvidia.com/gpu",
    ),
    ("whole", {"env_keep": ["CUDA_VISIBLE_DEVICES"]}, "env_keep CUDA_VISIBLE_DEVICES"),
]


@pytest.mark.parametrize(("backend", "override", "key"), REFUSED)
def test_a_profile_list_override_of_the_grant_is_refused_at_start_up(
    backend, override, key, policy_path
):
    c = hub_config(policy_path, backend, entries_with("train-1gpu", override))
    with pytest.raises(KubeProfileError) as e:
        check_kube_profiles(c)
    text = str(e.value)
    assert f"profile_list entry 'train-1gpu': kubespawner_override.{key}" in text
    assert "grant" in text


@pytest.mark.parametrize(
    ("backend", "override"),
    [
        ("whole", {"scheduler_name": "volcano"}),  # whole GPUs leave the scheduler to the site
        ("hami", {"priority_class_name": "high"}),
        ("whole", {"node_selector": {"topology.kubernetes.io/zone": "b"}}),
        ("whole", {"extra_labels": {"team": "vision"}, "environment": {"OMP_NUM_THREADS": "8"}}),
    ],
)
def test_what_the_backend_leaves_alone_is_allowed(backend, override, policy_path):
    assert (
        check_kube_profiles(hub_config(policy_path, backend, entries_with("train-1gpu", override)))
        == []
    )


def test_pin_to_grant_off_lets_the_site_pick_the_host(policy_path):
    over = {"node_selector": {"kubernetes.io/hostname": "gpu-7"}}
    c = hub_config(policy_path, "whole", entries_with("train-1gpu", over), pin_to_grant=False)
    assert check_kube_profiles(c) == []


def test_an_option_choice_is_named_when_refused(policy_path):
    entries = values()["singleuser"]["profileList"]
    choice = entries[0]["profile_options"]["image"]["choices"]["tensorflow"]
    choice["kubespawner_override"]["environment"] = {"CUDA_VISIBLE_DEVICES": "all"}
    with pytest.raises(KubeProfileError) as e:
        check_kube_profiles(hub_config(policy_path, "hami", entries))
    assert (
        "profile_list entry 'debug-eighth' option 'image' choice 'tensorflow': "
        "kubespawner_override.environment.CUDA_VISIBLE_DEVICES"
    ) in str(e.value)


def test_an_unknown_trait_is_named_with_a_suggestion(policy_path):
    with pytest.raises(KubeProfileError) as e:
        check_kube_profiles(
            hub_config(policy_path, "whole", entries_with("cpu-small", {"imagee": "x"}))
        )
    assert (
        "profile_list entry 'cpu-small': kubespawner_override.imagee is not a KubeSpawner "
        "trait (did you mean 'image'?)"
    ) in str(e.value)


def test_every_problem_is_listed_not_only_the_first(policy_path):
    entries = entries_with("train-1gpu", {"extra_resource_limits": {"nvidia.com/gpu": 2}})
    for e in entries:
        if e["slug"] == "cpu-small":
            e["kubespawner_override"]["environment"] = {"CUDA_VISIBLE_DEVICES": "0"}
    with pytest.raises(KubeProfileError) as e:
        check_kube_profiles(hub_config(policy_path, "whole", entries))
    assert len(e.value.problems) == 2


def test_a_policy_profiles_override_is_checked_too(tmp_path):
    doc = policy_doc()
    doc["profiles"][2]["kubespawner_override"] = {
        "tolerations": [{"key": "a", "operator": "Exists"}],
        "extra_resource_limits": {"nvidia.com/gpu": 4},
        "imag": "x",
    }
    path = write_policy(tmp_path, doc)
    with pytest.raises(KubeProfileError) as e:
        check_kube_profiles(hub_config(path, "whole"))
    text = str(e.value)
    assert (
        "policy profile 'train-1gpu': kubespawner_override.extra_resource_limits.nvidia.com/gpu"
    ) in text
    assert "policy profile 'train-1gpu': kubespawner_override.imag is not a KubeSpawner" in text


def test_the_policy_reads_kubespawner_override_in_file_order(tmp_path):
    doc = policy_doc()
    policy = load_policy(write_policy(tmp_path, doc))
    assert dict(policy.profile("train-4gpu").kubespawner_override) == {
        "extra_pod_config": {"terminationGracePeriodSeconds": 120}
    }
    assert policy.profile("train-1gpu").kubespawner_override == ()


@pytest.mark.parametrize(
    ("bad", "expected"),
    [
        (["image"], "expected a mapping of KubeSpawner trait names"),
        ({"Image": "x"}, "'Image' is not a trait name"),
        ({"node-selector": {}}, "'node-selector' is not a trait name"),
    ],
)
def test_a_malformed_override_is_a_policy_error_with_file_and_line(tmp_path, bad, expected):
    doc = policy_doc()
    doc["profiles"][1]["kubespawner_override"] = bad
    path = write_policy(tmp_path, doc)
    with pytest.raises(PolicyError) as e:
        load_policy(path)
    text = str(e.value)
    assert "profiles[1].kubespawner_override" in text and expected in text
    assert f"{path}:" in text


async def test_an_unmapped_entry_is_warned_of_and_not_offered(policy_path, caplog):
    entries = values()["singleuser"]["profileList"]
    entries.append(
        {
            "display_name": "Big memory",
            "slug": "bigmem",
            "kubespawner_override": {"mem_limit": "1T"},
        }
    )
    c = hub_config(policy_path, "whole", entries)
    with caplog.at_level(logging.WARNING):
        warnings = check_kube_profiles(c)
    assert len(warnings) == 1 and "profile_list entry 'bigmem' (Big memory)" in warnings[0]
    assert "not offered" in warnings[0]
    sp = make_spawner(c, {"profile": "bigmem"})
    await sp._load_site_profiles()
    with pytest.raises(SpawnException) as e:
        sp.resolve_profile()
    assert e.value.status_code == 400 and "no such profile" in str(e.value)


async def test_a_callable_override_is_checked_when_the_server_starts(policy_path):
    entries = entries_with("train-1gpu", {})
    c = hub_config(policy_path, "whole", entries)
    c.KubeSpawner.profile_list[2]["kubespawner_override"]["environment"] = lambda spawner: {
        "CUDA_VISIBLE_DEVICES": "0,1,2,3"
    }
    assert check_kube_profiles(c) == []  # not known before it runs
    sp = make_spawner(c, {"profile": "train-1gpu"})
    with pytest.raises(SpawnException) as e:
        await spawn_pod(sp)
    assert "environment.CUDA_VISIBLE_DEVICES" in str(e.value)


async def test_a_spawn_refuses_a_bad_override_too(policy_path):
    c = hub_config(
        policy_path,
        "whole",
        entries_with("train-1gpu", {"environment": {"NVIDIA_VISIBLE_DEVICES": "all"}}),
    )
    sp = make_spawner(c, {"profile": "train-1gpu"})
    with pytest.raises(SpawnException) as e:
        await spawn_pod(sp)
    assert e.value.status_code == 500


async def test_a_callable_that_stays_off_the_grant_is_applied(policy_path):
    c = hub_config(policy_path, "whole")
    c.KubeSpawner.profile_list[2]["kubespawner_override"]["environment"] = lambda spawner: {
        "RUN_BY": spawner.user.name
    }
    pod, grant = await spawn_pod(make_spawner(c, {"profile": "train-1gpu"}))
    assert env(pod)["RUN_BY"] == "alice" and env(pod)["GPUSHARE_GRANT_ID"] == grant.id


@pytest.mark.parametrize(
    ("override", "said"),
    [
        ({"cpu_guarantee": 32}, "cpu_guarantee 32 is more than policy profile 'train-1gpu'"),
        ({"mem_guarantee": "500G"}, "mem_guarantee 500G (512000 MiB) is more than policy"),
    ],
)
def test_a_guarantee_above_the_policys_is_warned_of(override, said, policy_path):
    warnings = check_kube_profiles(
        hub_config(policy_path, "whole", entries_with("train-1gpu", override))
    )
    assert len(warnings) == 1 and said in warnings[0] and "may not fit" in warnings[0]
    within = {"cpu_guarantee": 24, "mem_guarantee": "400G", "cpu_limit": 96}
    assert (
        check_kube_profiles(hub_config(policy_path, "whole", entries_with("train-1gpu", within)))
        == []
    )
