"""The shipped z2jh values as a hub would load them, and KubeGPUShareSpawner pods built from
them by the real KubeSpawner (``_mock=True``: no cluster), for tests/test_z2jh_*.py."""

from __future__ import annotations

import copy
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import kubernetes_validate
import yaml
from kubernetes_asyncio.client import ApiClient
from traitlets.config import Config

from jupyter_gpushare.broker.client import GPUShare, GrantInfo
from jupyter_gpushare.core.model import Profile
from jupyter_gpushare.spawner.kube import KubeGPUShareSpawner

ROOT = Path(__file__).parents[1]
VALUES = ROOT / "hub_config" / "z2jh-values.yaml"
K8S_VERSIONS = ["1.30.0", "1.31.0", "1.32.0", "1.33.0", "1.34.0", "1.35.0", "1.36.0", "1.37.0"]

# The values' policy discovers its nodes from the API server; here the same pools are listed.
STATIC_INVENTORY = {
    "source": "static",
    "nodes": [
        {
            "name": "train-0",
            "pool": "train",
            "cpu": 112,
            "memory": "2TiB",
            "gpus": [{"count": 8, "model": "H200", "memory": "141GiB"}],
        },
        {
            "name": "lab-0",
            "pool": "interactive",
            "cpu": 112,
            "memory": "2TiB",
            "gpus": [{"count": 4, "model": "H200", "memory": "141GiB"}],
        },
        {
            "name": "debug-0",
            "pool": "debug",
            "cpu": 32,
            "memory": "256GiB",
            "gpus": [{"count": 1, "model": "H200", "memory": "141GiB"}],
        },
    ],
}


def values() -> dict[str, Any]:
    return yaml.safe_load(VALUES.read_text())


def policy_doc(vals: dict[str, Any] | None = None) -> dict[str, Any]:
    vals = vals or values()
    doc = yaml.safe_load(vals["hub"]["extraFiles"]["gpushare-policy"]["stringData"])
    doc["inventory"] = copy.deepcopy(STATIC_INVENTORY)
    return doc


def write_policy(folder: Path, doc: dict[str, Any], name: str = "gpushare.yaml") -> str:
    path = folder / name
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return str(path)


def hub_config(
    policy_path: str, backend: str, profile_list: list[dict[str, Any]] | None = None, **spawner: Any
) -> Config:
    """What the chart's jupyterhub_config.py and our hub.extraConfig set: singleuser.profileList
    becomes c.KubeSpawner.profile_list, singleuser.image c.KubeSpawner.image."""
    vals = values()
    c = Config()
    single = vals["singleuser"]
    c.KubeSpawner.profile_list = copy.deepcopy(
        single["profileList"] if profile_list is None else profile_list
    )
    c.KubeSpawner.image = f"{single['image']['name']}:{single['image']['tag']}"
    c.GPUShareSpawner.policy_file = policy_path
    c.KubeGPUShareSpawner.gpu_backend = backend
    c.KubeGPUShareSpawner.mig_profile = "1g.18gb"
    for key, value in spawner.items():
        setattr(c.KubeGPUShareSpawner, key, value)
    return c


def make_spawner(config: Config, user_options: dict[str, Any] | None = None) -> KubeGPUShareSpawner:
    user = SimpleNamespace(
        name="alice", id=7, url="/user/alice/", groups=[SimpleNamespace(name="vision")]
    )
    hub = SimpleNamespace(
        public_host="hub",
        url="http://hub:8081/hub/",
        base_url="/hub/",
        api_url="http://hub:8081/hub/api",
    )
    sp = KubeGPUShareSpawner(_mock=True, user=user, hub=hub, config=config)
    sp.api_token = "secret-token"
    sp.user_options = dict(user_options or {})
    return sp


def grant_for(sp: KubeGPUShareSpawner, profile: Profile) -> GrantInfo:
    """The grant the broker would give ``profile`` on its pool's first node."""
    policy = sp.gpushare_policy()
    assert policy is not None
    node = policy.nodes_in(profile.pool)[0]
    n = profile.gpu.whole or 1
    gpu = node.gpus[0]
    if profile.gpu.whole:
        mem, pct, units = gpu.memory_mib, 100.0, float(n)
    else:
        mem, pct = profile.gpu.memory_on(gpu), profile.gpu.compute_on() / 10
        units = profile.gpu.units_milli / 1000
    model = "H100 1g.18gb" if sp.gpu_backend == "mig" else gpu.model
    shares = tuple(
        GPUShare(
            uuid=g.uuid, memory_mib=mem, compute_pct=pct, model=model, total_memory_mib=g.memory_mib
        )
        for g in node.gpus[:n]
    )
    return GrantInfo(
        id="grant-7",
        team="vision",
        pool=profile.pool,
        profile=profile.slug,
        node=node.name,
        gpus=shares,
        units=units,
    )


async def spawn_pod(sp: KubeGPUShareSpawner) -> tuple[dict[str, Any], GrantInfo | None]:
    """GPUShareSpawner.start's steps up to the pod, in its order, the broker's answer made
    here: the site's profile_list, the options checked, the profile, the grant."""
    await sp._load_site_profiles()
    slug = sp.resolve_profile()
    policy = sp.gpushare_policy()
    assert policy is not None
    profile = policy.profile(slug)
    assert profile is not None
    grant = None
    if profile.gpu.is_empty:
        sp.apply_profile(profile)
        sp.apply_no_gpu(profile)
    else:
        grant = grant_for(sp, profile)
        sp.grant_id = grant.id
        sp.apply_profile(profile)
        sp.apply_grant(grant, profile)
    manifest = await sp.get_pod_manifest()
    async with ApiClient() as api:
        return api.sanitize_for_serialization(manifest), grant


def validate_all(obj: dict[str, Any]) -> None:
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(obj, version, strict=True)


def container(pod: dict[str, Any]) -> dict[str, Any]:
    return pod["spec"]["containers"][0]


def env(pod: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value") for e in container(pod).get("env") or []}
