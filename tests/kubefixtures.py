"""Kubernetes objects for tests, checked against the published schema (no API server here)."""

from __future__ import annotations

import kubernetes_validate


def kube_node(name: str, pool: str | None, gpus: int, unschedulable: bool = False) -> dict:
    labels = {"kubernetes.io/hostname": name}
    if gpus:
        labels |= {
            "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
            "nvidia.com/gpu.memory": "81559",
            "nvidia.com/gpu.count": str(gpus),
        }
    if pool:
        labels["gpushare.jupyter.org/pool"] = pool
    allocatable = {"cpu": "96", "memory": "1056561448Ki", "pods": "110"}
    if gpus:
        allocatable["nvidia.com/gpu"] = str(gpus)
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "spec": {"unschedulable": unschedulable},
        "status": {"allocatable": allocatable, "capacity": dict(allocatable)},
    }
    kubernetes_validate.validate(node, "1.30.0", strict=True)
    return node
