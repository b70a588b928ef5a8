"""The real spawn path with the shipped z2jh values: KubeGPUShareSpawner.start asks a real
broker for the grant, and the pod KubeSpawner would create carries the site's overrides and
that grant. Only KubeSpawner's _start is replaced (it talks to an API server, and none can run
here): it builds the pod manifest as the real one does, after load_user_options."""

from __future__ import annotations

from typing import Any

import kubespawner.spawner as ks_spawner
import pytest
from brokerkit import start_broker, static_tokens
from kubernetes_asyncio.client import ApiClient
from kubespawner import KubeSpawner
from z2jhkit import container, env, hub_config, make_spawner, policy_doc, validate_all, write_policy

from jupyter_gpushare.policy import load_policy

BASE = "/services/gpushare/api/v1"


@pytest.fixture(autouse=True)
def no_cluster(monkeypatch):
    monkeypatch.setattr(ks_spawner, "load_config", lambda **kw: None)

    async def _start(self: KubeSpawner) -> Any:
        await self.load_user_options()  # as KubeSpawner._start does first
        pod = await self.get_pod_manifest()
        async with ApiClient() as api:
            self.__dict__["z2jh_pod"] = api.sanitize_for_serialization(pod)
        return ("10.0.0.7", 8888)

    monkeypatch.setattr(KubeSpawner, "_start", _start)


@pytest.fixture
async def broker(tmp_path):
    path = write_policy(tmp_path, policy_doc())
    app = await start_broker(
        load_policy(path), f"sqlite:///{tmp_path}/b.sqlite", static_tokens({"alice": ["vision"]})
    )
    yield app, path
    await app.stop_async()


@pytest.mark.parametrize(
    ("backend", "slug", "options"),
    [
        ("hami", "debug-eighth", {"image": "tensorflow"}),
        ("whole", "train-4gpu", {}),
        ("kai", "inference-quarter", {}),
    ],
)
async def test_start_gets_a_real_grant_and_the_sites_overrides(broker, backend, slug, options):
    app, policy_path = broker
    sp = make_spawner(hub_config(policy_path, backend), {"profile": slug, **options})
    sp.broker_url = f"http://127.0.0.1:{app.port}{BASE}"
    sp.broker_api_token = "tok-spawner"
    sp.queue_poll_interval = 0.05
    assert await sp.start() == ("10.0.0.7", 8888)
    try:
        pod = sp.__dict__["z2jh_pod"]
        validate_all(pod)
        grant = sp.gpushare_grant
        assert grant is not None and grant.profile == slug
        e = env(pod)
        assert e["GPUSHARE_GRANT_ID"] == grant.id and e["GPUSHARE_ENFORCEMENT"] == backend
        assert pod["metadata"]["annotations"]["gpushare.jupyter.org/grant-id"] == grant.id
        assert pod["spec"]["nodeSelector"]["kubernetes.io/hostname"] == grant.node
        limits = container(pod)["resources"]["limits"]
        if slug == "debug-eighth":
            image = "quay.io/jupyter/tensorflow-notebook:cuda-latest"
            assert container(pod)["image"] == image
            assert e["PIP_INDEX_URL"] and limits["nvidia.com/gpumem"]
            assert pod["spec"]["schedulerName"] == "hami-scheduler"
        elif slug == "train-4gpu":
            assert container(pod)["image"] == "nvcr.io/nvidia/pytorch:25.01-py3"
            assert limits["nvidia.com/gpu"] == "4" and e["NCCL_DEBUG"] == "WARN"
            assert pod["spec"]["terminationGracePeriodSeconds"] == 120
        else:
            mounts = {m["mountPath"] for m in container(pod)["volumeMounts"]}
            assert "/data" in mounts and pod["spec"]["schedulerName"] == "kai-scheduler"
            # KAI: a fraction (or, the pool keeping headroom, the granted memory)
            annotations = pod["metadata"]["annotations"]
            assert {"gpu-fraction", "gpu-memory"} & set(annotations)
            assert "nvidia.com/gpu" not in limits
    finally:
        await sp.release_grant(sp.grant_id)
