"""Kubernetes objects for one attempt of a batch job (pure: dicts in, dicts out, no I/O).

Per attempt the Kubernetes backend creates two objects, both named
:func:`object_name` (``gpushare-<job id>-a<attempt>``, a DNS-1123 label):

* a ``v1`` **ConfigMap** holding ``spec.json`` (what the runner needs) and the notebook
  snapshot, gzip-compressed in ``binaryData`` (a ConfigMap holds at most 1 MiB; a bigger
  snapshot is refused before anything is created);
* a ``batch/v1`` **Job**, created ``suspend: true`` so that Kueue admits it: it carries the
  team's LocalQueue (label ``kueue.x-k8s.io/queue-name``) and the WorkloadPriorityClass of
  its priority class (``kueue.x-k8s.io/priority-class``), the names the Kueue export writes
  (:mod:`jupyter_gpushare.backends.kube_names`). ``backoffLimit: 0`` and ``restartPolicy:
  Never`` (the broker, not Kubernetes, decides on another attempt), ``activeDeadlineSeconds``
  = the job's maximum runtime, ``terminationGracePeriodSeconds`` = the grant's grace period.

The pod gets the GPU share exactly as a single-user pod of ``KubeGPUShareSpawner`` does: the
resources, scheduler, labels, annotations and node selector come from the same
:func:`jupyter_gpushare.spawner.enforcement.pod_fragment`, for every backend (whole, MIG,
HAMi, HAMi-MetaX, KAI, time-slicing). It mounts the user's storage as zero-to-jupyterhub's
single-user pod does (by default the PVC ``claim-{username}`` at ``/home/jovyan``), so the
executed notebook lands in the user's files, and runs
``python -m jupyter_gpushare.backends.kube_run`` (papermill, as on the local backend).
"""

from __future__ import annotations

import base64
import gzip
import json
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..broker.client import GrantInfo
from ..spawner import enforcement
from .base import RunSpec
from .kube_names import (
    KUEUE_PRIORITY_LABEL,
    KUEUE_QUEUE_LABEL,
    POOL_LABEL,
    dns_label,
    local_queue_name,
    priority_class_name,
)

__all__ = [
    "CONFIGMAP_LIMIT_BYTES",
    "INPUT_DIR",
    "JobTemplate",
    "Storage",
    "attempt_selector",
    "configmap_manifest",
    "gpu_backend_for",
    "job_manifest",
    "job_selector",
    "object_name",
    "pod_paths",
]

LABEL = "gpushare.jupyter.org"
JOB_ID_LABEL = f"{LABEL}/job-id"
ATTEMPT_LABEL = f"{LABEL}/attempt"
USER_LABEL = "hub.jupyter.org/username"
COMPONENT_LABEL = "app.kubernetes.io/component"
MANAGED_LABEL = "app.kubernetes.io/managed-by"
CONTAINER = "notebook"
INPUT_DIR = "/gpushare/input"
RUNNER = "jupyter_gpushare.backends.kube_run"
CONFIGMAP_LIMIT_BYTES = 1024 * 1024 - 16 * 1024
"""What the ConfigMap's data may hold (Kubernetes refuses more than 1 MiB; some kept free)."""


@dataclass(frozen=True)
class Storage:
    """How the user's files are mounted, as zero-to-jupyterhub mounts them in the user's
    single-user pod (``singleuser.storage``): ``dynamic`` (a PVC per user), ``static`` (one
    shared PVC, a ``sub_path`` per user) or ``none`` (an emptyDir: output is lost)."""

    type: str = "dynamic"
    pvc_name_template: str = "claim-{username}{servername}"
    volume_name_template: str = "volume-{username}{servername}"
    static_pvc_name: str = ""
    sub_path: str = ""
    home_mount_path: str = "/home/jovyan"
    slug_scheme: str = "safe"  # KubeSpawner's slug_scheme: 'safe' (7.x default) or 'escape'

    def username(self, user: str) -> str:
        from kubespawner.slugs import escape_slug, safe_slug

        if self.slug_scheme == "escape":
            return str(escape_slug(user))
        return str(safe_slug(user, max_length=48))

    def expand(self, template: str, user: str) -> str:
        return template.format(
            username=self.username(user), servername="", user_server=self.username(user),
            unescaped_username=user,
        )


@dataclass(frozen=True)
class JobTemplate:
    """What an admin configures about the Jobs (from ``c.KubeJobsBackend.*``)."""

    namespace: str = "jupyterhub"
    image: str = "quay.io/jupyter/pytorch-notebook:cuda12-latest"
    image_pull_policy: str = "IfNotPresent"
    python: str = "python3"
    gpu_backend: str = "whole"
    pool_gpu_backends: Mapping[str, str] = field(default_factory=dict)
    storage: Storage = field(default_factory=Storage)
    pin_to_grant: bool = True
    kai_queue_template: str = "{team}"
    kai_priority_class: str = "build"
    mig_profile: str = ""
    run_as_uid: int | None = 1000
    run_as_gid: int | None = 100
    fs_gid: int | None = 100
    service_account: str = ""
    ttl_seconds_after_finished: int | None = 7 * 24 * 3600
    extra_env: Mapping[str, str] = field(default_factory=dict)
    extra_labels: Mapping[str, str] = field(default_factory=dict)
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()
    pool_label: str = POOL_LABEL
    memory_limit_factor: float = 1.0  # memory limit = request x this (1: limit = request)


def object_name(job_id: str, attempt: int) -> str:
    """The name of an attempt's Job and ConfigMap: unique per job and attempt."""
    return dns_label(f"{job_id}-a{int(attempt)}", prefix="gpushare-")


def job_selector(job_id: str) -> str:
    """Label selector of every object of a job (all its attempts)."""
    return f"{JOB_ID_LABEL}={enforcement.label_value(job_id)}"


def attempt_selector(job_id: str, attempt: int) -> str:
    return f"{job_selector(job_id)},{ATTEMPT_LABEL}={int(attempt)}"


def gpu_backend_for(pool: str, template: JobTemplate) -> str:
    """The enforcement backend of a pool: ``pool_gpu_backends[pool]`` or the default."""
    backend = template.pool_gpu_backends.get(pool, template.gpu_backend)
    if backend not in enforcement.KUBE_BACKENDS:
        raise ValueError(f"pool {pool!r}: unknown GPU backend {backend!r}; expected one of "
                         f"{', '.join(enforcement.KUBE_BACKENDS)}")
    return backend


@dataclass(frozen=True)
class PodPaths:
    """Where an attempt's files are inside the pod (all in the user's storage)."""

    output: str
    cwd: str
    work: str
    checkpoint: str


def pod_paths(spec: RunSpec, output_relpath: str, template: JobTemplate) -> PodPaths:
    """The pod's paths of ``spec``: ``output_relpath`` is the output notebook relative to
    the user's files (it may not leave them)."""
    rel = posixpath.normpath(output_relpath.replace("\\", "/").lstrip("/"))
    if rel in (".", "") or rel.startswith(".."):
        raise ValueError(f"output path {output_relpath!r} is not inside the user's files")
    home = template.storage.home_mount_path.rstrip("/") or "/"
    job = posixpath.join(home, ".gpushare", "jobs", spec.job_id)
    output = posixpath.join(home, rel)
    return PodPaths(
        output=output, cwd=posixpath.dirname(output),
        work=posixpath.join(job, f"attempt-{int(spec.attempt)}"),
        checkpoint=posixpath.join(job, "checkpoint"),
    )


def _labels(spec: RunSpec, grant: GrantInfo, template: JobTemplate) -> dict[str, str]:
    return {
        **{str(k): str(v) for k, v in template.extra_labels.items()},
        COMPONENT_LABEL: "gpushare-job",
        MANAGED_LABEL: "jupyter-gpushare",
        JOB_ID_LABEL: enforcement.label_value(spec.job_id),
        ATTEMPT_LABEL: str(int(spec.attempt)),
        USER_LABEL: enforcement.label_value(template.storage.username(spec.user)),
        f"{LABEL}/team": enforcement.label_value(grant.team),
    }


def _annotations(spec: RunSpec, grant: GrantInfo) -> dict[str, str]:
    return {
        f"{LABEL}/job-id": spec.job_id,
        f"{LABEL}/user": spec.user,
        f"{LABEL}/grant-id": grant.id,
        f"{LABEL}/name": spec.name,
    }


def configmap_manifest(
    spec: RunSpec, output_relpath: str, template: JobTemplate
) -> dict[str, Any]:
    """The ConfigMap with the attempt's ``spec.json`` and gzip-compressed notebook."""
    from .local import _with_cell_ids

    paths = pod_paths(spec, output_relpath, template)
    grant = GrantInfo.from_json(spec.grant)
    run = {
        "job_id": spec.job_id,
        "attempt": spec.attempt,
        "parameters": spec.parameters,
        "output_path": paths.output,
        "cwd": paths.cwd,
        "kernel_name": spec.kernel_name,
        "name": spec.name or posixpath.basename(paths.output) or spec.job_id,
    }
    spec_text = json.dumps(run)
    notebook = gzip.compress(json.dumps(_with_cell_ids(spec.notebook)).encode(), mtime=0)
    size = len(spec_text.encode()) + len(notebook)
    if size > CONFIGMAP_LIMIT_BYTES:
        raise ValueError(
            f"job {spec.job_id}: the notebook snapshot is {size} bytes compressed; a "
            f"Kubernetes ConfigMap holds at most {CONFIGMAP_LIMIT_BYTES} (clear large outputs "
            "and submit again)"
        )
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": object_name(spec.job_id, spec.attempt),
            "namespace": template.namespace,
            "labels": _labels(spec, grant, template),
            "annotations": _annotations(spec, grant),
        },
        "data": {"spec.json": spec_text},
        "binaryData": {"input.ipynb.gz": base64.b64encode(notebook).decode()},
    }


def _storage_volume(spec: RunSpec, template: JobTemplate) -> tuple[dict[str, Any],
                                                                   dict[str, Any]]:
    st = template.storage
    name = dns_label(st.expand(st.volume_name_template, spec.user))
    mount: dict[str, Any] = {"name": name, "mountPath": st.home_mount_path}
    if st.sub_path:
        mount["subPath"] = st.expand(st.sub_path, spec.user)
    if st.type == "dynamic":
        claim = st.expand(st.pvc_name_template, spec.user)
        volume: dict[str, Any] = {"name": name, "persistentVolumeClaim": {"claimName": claim}}
    elif st.type == "static":
        if not st.static_pvc_name:
            raise ValueError("static storage needs static_pvc_name (z2jh "
                             "singleuser.storage.static.pvcName)")
        volume = {"name": name, "persistentVolumeClaim": {"claimName": st.static_pvc_name}}
    elif st.type == "none":
        volume = {"name": name, "emptyDir": {}}
    else:
        raise ValueError(f"storage type {st.type!r}: expected dynamic, static or none")
    return volume, mount


def _quantity_mib(mib: int) -> str:
    return f"{int(mib)}Mi"


def _resources(grant: GrantInfo, frag: enforcement.PodFragment,
               template: JobTemplate) -> dict[str, Any]:
    requests: dict[str, str] = {}
    limits: dict[str, str] = dict(frag.limits)
    cpu_milli = int(grant.raw.get("cpu_milli") or 0)
    memory_mib = int(grant.raw.get("memory_mib") or 0)
    if cpu_milli > 0:
        requests["cpu"] = f"{cpu_milli}m"
    if memory_mib > 0:
        requests["memory"] = _quantity_mib(memory_mib)
        limits["memory"] = _quantity_mib(int(memory_mib * max(1.0, template.memory_limit_factor)))
    out: dict[str, Any] = {}
    if requests:
        out["requests"] = requests
    if limits:
        out["limits"] = limits
    return out


def job_manifest(
    spec: RunSpec, output_relpath: str, template: JobTemplate,
    gpu_total_mib: Mapping[str, int] | None = None,
    warnings: list[str] | None = None,
) -> dict[str, Any]:
    """The suspended ``batch/v1`` Job of one attempt (see the module docstring);
    ``gpu_total_mib``: each GPU's memory by uuid (the policy's), for the memory caps;
    ``warnings`` gets what the enforcement cannot hold (e.g. time-slicing's memory)."""
    grant = GrantInfo.from_json(spec.grant)
    backend = gpu_backend_for(grant.pool, template)
    frag = enforcement.pod_fragment(
        grant,
        backend,
        pin=template.pin_to_grant,
        kai_queue=template.kai_queue_template.format(team=grant.team, pool=grant.pool),
        kai_priority_class=template.kai_priority_class,
        mig_profile=template.mig_profile or None,
        gpu_total_mib=gpu_total_mib,
    )
    if warnings is not None:
        warnings.extend(frag.warnings)
    paths = pod_paths(spec, output_relpath, template)
    name = object_name(spec.job_id, spec.attempt)
    labels = _labels(spec, grant, template)
    priority = str(grant.priority or grant.raw.get("priority") or "")
    job_labels = {**labels, KUEUE_QUEUE_LABEL: local_queue_name(grant.team)}
    if priority:
        job_labels[KUEUE_PRIORITY_LABEL] = priority_class_name(priority)
    env = {
        **{str(k): str(v) for k, v in template.extra_env.items()},
        **frag.env,
        "GPUSHARE_JOB_ID": spec.job_id,
        "GPUSHARE_JOB_ATTEMPT": str(int(spec.attempt)),
        "GPUSHARE_CHECKPOINT_DIR": paths.checkpoint,
        "HOME": template.storage.home_mount_path,
        "PYTHONUNBUFFERED": "1",
    }
    volume, mount = _storage_volume(spec, template)
    node_selector = {**template.node_selector, **frag.node_selector}
    if grant.pool and template.pool_label:
        # the pool's nodes: it is also how Kueue picks the pool's ResourceFlavor
        node_selector[template.pool_label] = enforcement.label_value(grant.pool)
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": template.image,
        "imagePullPolicy": template.image_pull_policy,
        "command": [template.python, "-m", RUNNER, INPUT_DIR, paths.work],
        # the home folder exists; the notebook's own folder is made by the runner (a
        # missing workingDir would be created by the runtime, owned by root)
        "workingDir": template.storage.home_mount_path,
        "env": [{"name": k, "value": v} for k, v in sorted(env.items())],
        "resources": _resources(grant, frag, template),
        "volumeMounts": [mount, {"name": "gpushare-input", "mountPath": INPUT_DIR,
                                 "readOnly": True}],
        "terminationMessagePolicy": "File",
    }
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": max(0, int(grant.grace_period_s)),
        "enableServiceLinks": False,
        "automountServiceAccountToken": bool(template.service_account),
        "containers": [container],
        "volumes": [volume, {"name": "gpushare-input", "configMap": {"name": name}}],
    }
    if node_selector:
        pod_spec["nodeSelector"] = node_selector
    if frag.scheduler_name:
        pod_spec["schedulerName"] = frag.scheduler_name
    if frag.priority_class_name:
        pod_spec["priorityClassName"] = frag.priority_class_name
    if template.service_account:
        pod_spec["serviceAccountName"] = template.service_account
    if template.tolerations:
        pod_spec["tolerations"] = [dict(t) for t in template.tolerations]
    security = {k: v for k, v in (("runAsUser", template.run_as_uid),
                                  ("runAsGroup", template.run_as_gid),
                                  ("fsGroup", template.fs_gid)) if v is not None}
    if security:
        pod_spec["securityContext"] = security
    job_spec: dict[str, Any] = {
        "suspend": True,
        "backoffLimit": 0,
        "activeDeadlineSeconds": max(1, int(spec.max_runtime_s)),
        "template": {
            "metadata": {
                "labels": {**labels, **frag.labels},
                "annotations": {**_annotations(spec, grant), **frag.annotations},
            },
            "spec": pod_spec,
        },
    }
    if template.ttl_seconds_after_finished is not None:
        job_spec["ttlSecondsAfterFinished"] = int(template.ttl_seconds_after_finished)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": template.namespace,
            "labels": job_labels,
            "annotations": _annotations(spec, grant),
        },
        "spec": job_spec,
    }
