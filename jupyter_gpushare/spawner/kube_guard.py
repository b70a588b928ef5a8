"""What a ``kubespawner_override`` may not touch: whatever the grant's GPU enforcement sets.

Pure functions (no KubeSpawner import): :func:`override_problems` lists, for one override
(a site's ``profile_list`` entry, one of its option choices, or a policy profile), each key
that is not a KubeSpawner trait and each value that would give the pod GPUs, GPU
visibility or GPU placement other than the grant's (see :mod:`.enforcement`). The
spawner refuses to start with those problems, naming the profile and the key; nothing is
dropped silently.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from jupyter_gpushare.spawner.enforcement import HOSTNAME_LABEL, LABEL_PREFIX

__all__ = ["Enforced", "gpu_conflicts", "override_problems"]

GPU_RESOURCE_PREFIXES = (
    "nvidia.com/gpu",  # gpu, gpumem, gpucores, gpu.shared, gpumem-percentage
    "nvidia.com/mig-",
    "metax-tech.com/",
    "amd.com/gpu",
    "gpu.intel.com/",
)
"""Device plugins' GPU resource names: a pod gets GPUs only through the grant."""

GPU_ENV_PREFIXES = ("GPUSHARE_", "CUDA_MPS_")
GPU_ENV_NAMES = frozenset(
    {
        "CUDA_VISIBLE_DEVICES",
        "NVIDIA_VISIBLE_DEVICES",
        "HIP_VISIBLE_DEVICES",
        "ROCR_VISIBLE_DEVICES",
        "XLA_PYTHON_CLIENT_MEM_FRACTION",
        "XLA_PYTHON_CLIENT_PREALLOCATE",
        "TF_FORCE_GPU_ALLOW_GROWTH",
    }
)
"""Environment the enforcement sets (:func:`.enforcement.grant_env`, ``framework_env``)."""

GPU_LABELS = frozenset({"kai.scheduler/queue", "priorityClassName"})
GPU_ANNOTATIONS = frozenset({"gpu-fraction", "gpu-memory"})
GPU_ANNOTATION_PREFIXES = (f"{LABEL_PREFIX}/", "nvidia.com/", "metax-tech.com/", "hami.io/")

SCHEDULING_BACKENDS = {
    "hami": "hami-scheduler",
    "hami-metax": "hami-scheduler",
    "kai": "kai-scheduler",
}
"""Backends that set the pod's scheduler (and, KAI, its priority class)."""


@dataclass(frozen=True)
class Enforced:
    """How this spawner enforces grants: its ``gpu_backend`` and ``pin_to_grant``."""

    backend: str
    pin: bool = True

    @property
    def sets_scheduler(self) -> bool:
        return self.backend in SCHEDULING_BACKENDS

    @property
    def sets_priority_class(self) -> bool:
        return self.backend == "kai"


def _gpu_resource(name: object) -> bool:
    return isinstance(name, str) and name.startswith(GPU_RESOURCE_PREFIXES)


def _gpu_env(name: object) -> bool:
    return isinstance(name, str) and (name in GPU_ENV_NAMES or name.startswith(GPU_ENV_PREFIXES))


def _gpu_label(name: object) -> bool:
    return isinstance(name, str) and (name in GPU_LABELS or name.startswith(f"{LABEL_PREFIX}/"))


def _gpu_annotation(name: object) -> bool:
    return isinstance(name, str) and (
        name in GPU_ANNOTATIONS or name.startswith(GPU_ANNOTATION_PREFIXES)
    )


def _keys(value: object, test: Callable[[object], bool], path: str, why: str) -> list[str]:
    if not isinstance(value, Mapping):
        return []
    return [f"{path}.{k} ({why})" for k in value if test(k)]


def _container(value: object, path: str) -> list[str]:
    """GPU resources and GPU environment in a container spec (camelCase, as Kubernetes)."""
    if not isinstance(value, Mapping):
        return []
    out: list[str] = []
    resources = value.get("resources")
    if isinstance(resources, Mapping):
        for part in ("limits", "requests"):
            out += _keys(
                resources.get(part),
                _gpu_resource,
                f"{path}.resources.{part}",
                "a GPU resource: the grant sets the pod's GPUs",
            )
    for i, item in enumerate(value.get("env") or ()):
        if isinstance(item, Mapping) and _gpu_env(item.get("name")):
            out.append(f"{path}.env[{i}] {item.get('name')} (GPU environment: the grant sets it)")
    return out


def _pod(value: object, path: str, enforced: Enforced) -> list[str]:
    if not isinstance(value, Mapping):
        return []
    out: list[str] = []
    if enforced.sets_scheduler and "schedulerName" in value:
        out.append(f"{path}.schedulerName (the {enforced.backend} backend sets the scheduler)")
    if enforced.sets_priority_class and "priorityClassName" in value:
        out.append(f"{path}.priorityClassName (the kai backend sets the priority class)")
    if enforced.pin and "nodeName" in value:
        out.append(f"{path}.nodeName (pin_to_grant puts the pod on the grant's node)")
    if enforced.pin:
        out += _keys(
            value.get("nodeSelector"),
            lambda k: k == HOSTNAME_LABEL,
            f"{path}.nodeSelector",
            "pin_to_grant puts the pod on the grant's node",
        )
    for key in ("containers", "initContainers"):
        for i, c in enumerate(value.get(key) or ()):
            out += _container(c, f"{path}.{key}[{i}]")
    return out


def gpu_conflicts(trait: str, value: Any, enforced: Enforced) -> list[str]:
    """Where ``trait: value`` would set what the grant's enforcement sets (empty: none)."""
    res = "a GPU resource: the grant sets the pod's GPUs"
    if trait in ("extra_resource_limits", "extra_resource_guarantees"):
        return _keys(value, _gpu_resource, trait, res)
    if trait == "environment":
        return _keys(value, _gpu_env, trait, "GPU environment: the grant sets it")
    if trait == "env_keep":
        return [
            f"env_keep {v} (GPU environment: the grant sets it)"
            for v in (value or ())
            if _gpu_env(v)
        ]
    if trait == "extra_labels":
        return _keys(value, _gpu_label, trait, "the grant's label")
    if trait == "extra_annotations":
        return _keys(value, _gpu_annotation, trait, "the grant's GPU annotation")
    if trait == "node_selector" and enforced.pin:
        return _keys(
            value,
            lambda k: k == HOSTNAME_LABEL,
            trait,
            "pin_to_grant puts the pod on the grant's node",
        )
    if trait == "scheduler_name" and enforced.sets_scheduler:
        return [
            f"scheduler_name (the {enforced.backend} backend sets "
            f"{SCHEDULING_BACKENDS[enforced.backend]})"
        ]
    if trait == "priority_class_name" and enforced.sets_priority_class:
        return ["priority_class_name (the kai backend sets a non-preemptible class)"]
    if trait == "extra_pod_config":
        return _pod(value, trait, enforced)
    if trait == "extra_container_config":
        return _container(value, trait)
    if trait in ("extra_containers", "init_containers"):
        return [p for i, c in enumerate(value or ()) for p in _container(c, f"{trait}[{i}]")]
    return []


def _unknown(key: str, traits: Collection[str]) -> str:
    near = difflib.get_close_matches(key, list(traits), n=1)
    hint = f" (did you mean {near[0]!r}?)" if near else ""
    return f"{key} is not a KubeSpawner trait{hint}"


def override_problems(
    owner: str,
    override: Mapping[str, Any] | Iterable[tuple[str, Any]],
    traits: Collection[str],
    enforced: Enforced,
) -> list[str]:
    """One message per bad key of ``override``, each naming ``owner`` and the key.

    A callable value is resolved only when a server starts; the spawner checks its result
    then (:meth:`KubeGPUShareSpawner._apply_overrides`)."""
    items = override.items() if isinstance(override, Mapping) else override
    out: list[str] = []
    for key, value in items:
        if key not in traits:
            out.append(f"{owner}: kubespawner_override.{_unknown(key, traits)}")
            continue
        if callable(value):
            continue
        for where in gpu_conflicts(key, value, enforced):
            out.append(
                f"{owner}: kubespawner_override.{where} conflicts with the grant's GPU "
                "enforcement; remove it (the grant always sets this)"
            )
    return out
