"""Inventory discovery: Kubernetes nodes (against the published schema) and NVML."""

from __future__ import annotations

from pathlib import Path

import pytest
from kubefixtures import kube_node

from jupyter_gpushare.discovery import DiscoveryError, load_policy, nodes_from_kubernetes, nvml_gpus
from jupyter_gpushare.policy import DiscoverySpec, PolicyError, parse_policy

NODES = [
    kube_node("gpu-a", "train", 8),
    kube_node("gpu-b", None, 4),
    kube_node("gpu-c", "train", 8, unschedulable=True),
    kube_node("cpu-a", "train", 0),
]


def test_kubernetes_nodes_become_inventory_nodes() -> None:
    nodes = nodes_from_kubernetes(NODES, {})
    assert [n.name for n in nodes] == ["gpu-a"]  # no pool, cordoned and CPU-only are skipped
    node = nodes[0]
    assert node.pool == "train" and len(node.gpus) == 8
    assert node.gpus[0].model == "NVIDIA-H100-80GB-HBM3" and node.gpus[0].memory_mib == 81559
    assert node.cpu_milli == 96000 and node.memory_mib == 1056561448 // 1024
    with_default = nodes_from_kubernetes(NODES, {"default_pool": "shared"})
    assert {n.name: n.pool for n in with_default} == {"gpu-a": "train", "gpu-b": "shared"}


POLICY = """\
inventory:
  source: kubernetes
  discovery: {default_pool: shared}
pools:
  train: {mode: exclusive}
  shared: {mode: shared}
priority_classes:
  interactive: {value: 500, preemptible: false}
teams:
  vision:
    quotas:
      train: {guaranteed: 8}
      shared: {guaranteed: 4}
profiles:
  - slug: quarter
    display_name: Quarter
    pool: shared
    gpu: {fraction: 1/4}
"""


def test_policy_with_a_kubernetes_inventory_loads_through_discovery(tmp_path: Path) -> None:
    spec_seen: list[DiscoverySpec] = []

    def discover(spec: DiscoverySpec):  # type: ignore[no-untyped-def]
        spec_seen.append(spec)
        return nodes_from_kubernetes(NODES, spec.options)

    policy = parse_policy(POLICY, "p.yaml", discover)
    assert spec_seen[0].source == "kubernetes" and spec_seen[0].line == 2
    assert {n.name for n in policy.nodes} == {"gpu-a", "gpu-b"}
    assert len(policy.nodes_in("shared")[0].gpus) == 4


def _nvml_works() -> bool:
    try:
        nvml_gpus()
    except DiscoveryError:
        return False
    return True


@pytest.mark.skipif(_nvml_works(), reason="this machine has a GPU: the no-GPU path is not seen")
def test_nvml_inventory_without_a_gpu_is_an_error_with_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "nvml.yaml"
    path.write_text(POLICY.replace("source: kubernetes", "source: nvml").replace(
        "{default_pool: shared}", "{pool: shared}"))
    with pytest.raises(PolicyError) as err:
        load_policy(path)
    text = str(err.value)
    assert f"{path}:2:" in text and "discovery from nvml failed" in text


@pytest.mark.gpu
@pytest.mark.skipif(not _nvml_works(), reason="NVML finds no GPU on this machine")
def test_nvml_inventory_on_a_real_gpu(tmp_path: Path) -> None:
    path = tmp_path / "nvml.yaml"
    path.write_text(POLICY.replace("source: kubernetes", "source: nvml").replace(
        "{default_pool: shared}", "{pool: shared}"))
    policy = load_policy(path)
    gpus = policy.nodes_in("shared")[0].gpus
    assert gpus and all(g.uuid.startswith("GPU-") and g.memory_mib > 1000 for g in gpus)


async def _answer() -> int:
    return 42


def test_run_to_completion_outside_a_loop() -> None:
    from jupyter_gpushare.discovery import _run_to_completion

    assert _run_to_completion(_answer) == 42


async def test_run_to_completion_inside_the_hubs_running_loop() -> None:
    from jupyter_gpushare.discovery import _run_to_completion

    assert _run_to_completion(_answer) == 42  # asyncio.run alone would raise here


def test_the_policy_package_alone_discovers_nothing_and_says_so_at_the_source_line(
    tmp_path: Path,
) -> None:
    import jupyter_gpushare.policy as policies

    path = tmp_path / "kube.yaml"
    path.write_text(POLICY)
    seen: list[DiscoverySpec] = []

    def fake(spec: DiscoverySpec) -> tuple[()]:
        seen.append(spec)
        raise DiscoveryError("no cluster here")

    with pytest.raises(PolicyError) as err:
        policies.load_policy(path)  # no discover: the policy package imports no discovery
    assert f"{path}:2:" in str(err.value) and "no discovery was given" in str(err.value)
    with pytest.raises(PolicyError) as err:
        policies.load_policy(path, fake)
    assert seen and seen[0].source == "kubernetes" and "no cluster here" in str(err.value)
