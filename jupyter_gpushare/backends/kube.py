"""The Kubernetes batch backend: each attempt of a job is a ``batch/v1`` Job, queued by Kueue.

``c.JobManager.backend_class = "jupyter_gpushare.backends.kube.KubeJobsBackend"`` and the
``c.KubeJobsBackend.*`` settings below. The broker still admits and places every job (one
policy, one ledger); Kueue, given the same policy by ``jupyter-gpushare export kueue``,
admits the suspended Job through the team's LocalQueue, so work submitted to the cluster
outside Jupyter obeys the same shares.

How the states map (:meth:`KubeJobsBackend.poll`):

* Job suspended, its Workload not admitted: alive, ``queued`` (the Workload's reason);
* Job running (Kueue admitted it, pods active): alive;
* Kueue admitted it, but its pod has not started (no node takes it, a volume attached
  elsewhere, an image that cannot be pulled: :mod:`.kube_waiting`): alive, ``queued``, the
  reason in plain words; an image not pulled for ``image_pull_timeout_s`` or a container
  configuration error ends the attempt as failed (its Job deleted);
* Job ``Complete``: finished, exit code 0 (the runner's termination message gives the rest);
* Job ``Failed``: finished with the pod's exit code and the runner's error; reason
  ``DeadlineExceeded`` (``activeDeadlineSeconds`` = the maximum runtime) or
  ``BackoffLimitExceeded`` (the pod failed; ``OOMKilled`` is said so);
* Workload ``Evicted``/``Preempted`` by Kueue, or the pod evicted or preempted by the
  kubelet or scheduler: finished, ``preempted`` (the broker requeues the job as after its
  own preemption); the Job is then deleted, so Kueue does not start it again outside the
  broker's grant;
* Job gone (killed, or removed by its TTL): not alive, no result.

:meth:`~KubeJobsBackend.signal` deletes the attempt's pods with the grant's grace period
(the kubelet sends SIGTERM, the runner saves the notebook and the checkpoint; SIGKILL after
the grace period); :meth:`~KubeJobsBackend.kill` deletes the Job with
``propagationPolicy: Foreground`` and grace 0.

This module holds the settings, the submit and the stop; the backend holds its parts, built
next to it: polling an attempt (:mod:`.kube_poll`, ``backend.poller``) and reading its logs
(:mod:`.kube_logs`, ``backend.logs``).
"""

from __future__ import annotations

import json
import os
import posixpath
from collections.abc import Callable, Mapping
from typing import Any

from traitlets import Bool, CaselessStrEnum, Dict, Float, Integer, List, Unicode, observe

from ..spawner import enforcement
from .base import Capabilities, ConfigurableJobBackend, RunHandle, RunSpec, RunStatus
from .kube_client import AlreadyExists, AsyncKubeClient, KubeClient
from .kube_logs import KubeLogs
from .kube_objects import (
    CONFIGMAP_LIMIT_BYTES,
    CONTAINER,
    JobTemplate,
    Storage,
    attempt_selector,
    configmap_manifest,
    gpu_backend_for,
    job_manifest,
    job_selector,
    pod_paths,
)
from .kube_poll import KubePoller
from .kube_waiting import pod_wait


class KubeJobsBackend(ConfigurableJobBackend):
    """Batch jobs as Kubernetes Jobs admitted by Kueue (see the module docstring)."""

    name = "kubernetes"

    namespace = Unicode(
        "jupyterhub",
        config=True,
        help="Namespace of the Jobs (the LocalQueues of the Kueue export).",
    )
    image = Unicode(
        "quay.io/jupyter/pytorch-notebook:cuda12-latest",
        config=True,
        help="Image of the job's container: it needs jupyter-gpushare and "
        "papermill (as the single-user image does).",
    )
    image_pull_policy = CaselessStrEnum(
        ["IfNotPresent", "Always", "Never"],
        "IfNotPresent",
        config=True,
        help="imagePullPolicy of the container.",
    )
    python = Unicode("python3", config=True, help="The image's Python.")
    gpu_backend = CaselessStrEnum(
        list(enforcement.KUBE_BACKENDS),
        "whole",
        config=True,
        help="How a grant is enforced in the pod, as c.KubeGPUShareSpawner.gpu_backend: "
        "whole | mig | hami | hami-metax | kai | timeslice.",
    )
    pool_gpu_backends = Dict(
        config=True,
        help="Enforcement of single pools, e.g. {'slices': 'mig'} (the default is gpu_backend).",
    )
    pin_to_grant = Bool(
        True, config=True, help="Put the pod on the grant's node (and, with HAMi, its GPUs)."
    )
    kai_queue_template = Unicode(
        "{team}", config=True, help="KAI queue (kai.scheduler/queue); {team}, {pool} expand."
    )
    kai_priority_class = Unicode(
        "build",
        config=True,
        help="KAI priority class of job pods (KAI's 'build' is "
        "non-preemptible; the broker and Kueue decide on preemption).",
    )
    mig_profile = Unicode(
        "", config=True, help="MIG profile when the GPU models of a MIG pool do not name it."
    )
    storage_type = CaselessStrEnum(
        ["dynamic", "static", "none"],
        "dynamic",
        config=True,
        help="The user's storage as z2jh's singleuser.storage.type: 'dynamic' (a PVC per "
        "user), 'static' (one PVC, a subPath per user) or 'none' (output is lost).",
    )
    pvc_name_template = Unicode(
        "claim-{username}{servername}",
        config=True,
        help="z2jh singleuser.storage.dynamic.pvcNameTemplate ({username}: KubeSpawner's "
        "slug of the user name; {servername} is empty: the user's default server's PVC).",
    )
    volume_name_template = Unicode(
        "volume-{username}{servername}",
        config=True,
        help="z2jh singleuser.storage.dynamic.volumeNameTemplate.",
    )
    static_pvc_name = Unicode("", config=True, help="z2jh singleuser.storage.static.pvcName.")
    storage_sub_path = Unicode(
        "",
        config=True,
        help="subPath of the home mount, e.g. 'home/{username}' (z2jh "
        "singleuser.storage.static.subPath).",
    )
    home_mount_path = Unicode(
        "/home/jovyan", config=True, help="z2jh singleuser.storage.homeMountPath."
    )
    slug_scheme = CaselessStrEnum(
        ["safe", "escape"], "safe", config=True, help="KubeSpawner's slug_scheme, for {username}."
    )
    run_as_uid = Integer(1000, allow_none=True, config=True, help="runAsUser (jovyan).")
    run_as_gid = Integer(100, allow_none=True, config=True, help="runAsGroup.")
    fs_gid = Integer(100, allow_none=True, config=True, help="fsGroup of the volumes.")
    service_account = Unicode(
        "", config=True, help="serviceAccountName of job pods ('': none mounted)."
    )
    ttl_seconds_after_finished = Integer(
        7 * 24 * 3600,
        allow_none=True,
        config=True,
        help="ttlSecondsAfterFinished: a finished Job (and its pod's log) is removed after "
        "this long.",
    )
    extra_env = Dict(config=True, help="Variables added to every job's container.")
    extra_labels = Dict(config=True, help="Labels added to every Job and pod.")
    node_selector = Dict(config=True, help="nodeSelector added to every job pod.")
    tolerations: List[dict[str, Any]] = List(
        Dict(), config=True, help="Tolerations of job pods (dicts)."
    )
    pool_label = Unicode(
        "gpushare.jupyter.org/pool",
        config=True,
        help="Node label of the pool: the pod selects it (and Kueue's "
        "ResourceFlavor by it); '' to leave it out.",
    )
    memory_limit_factor = Float(
        1.0, config=True, help="Memory limit = the grant's memory request x this."
    )
    request_timeout_s = Float(30.0, config=True, help="Timeout of one API call.")
    poll_min_interval_s = Float(
        2.0,
        config=True,
        help="A running attempt's state (and a job's log) is asked of the API server at most "
        "this often; the broker's loop polls faster and gets the last answer meanwhile.",
    )
    log_cache_bytes = Integer(
        4 * 1024 * 1024,
        config=True,
        help="Log bytes kept per attempt once its pod ended (its log stays readable after "
        "the pod is removed, while the broker runs).",
    )
    log_cache_attempts = Integer(256, config=True, help="Attempts whose ended log is kept.")
    image_pull_timeout_s = Float(
        600.0,
        config=True,
        help="An admitted job pod whose image cannot be pulled (ErrImagePull, "
        "ImagePullBackOff) for this long fails its attempt with the reason; its Job is "
        "deleted and the grant released. Until then the job waits, saying why.",
    )

    def __init__(self, client: KubeClient | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.client: KubeClient | None = client
        self.user_root: Callable[[str], str] | None = None
        self.gpu_memory: Callable[[], Mapping[str, int]] | None = None
        self.poller = KubePoller(
            lambda: self.api,
            namespace=self.namespace,
            poll_min_interval_s=self.poll_min_interval_s,
            image_pull_timeout_s=self.image_pull_timeout_s,
            log=self.log,
        )
        self.logs = KubeLogs(
            lambda: self.api,
            namespace=self.namespace,
            poll_min_interval_s=self.poll_min_interval_s,
            log_cache_bytes=self.log_cache_bytes,
            log_cache_attempts=self.log_cache_attempts,
            log=self.log,
        )

    @observe(
        "namespace",
        "poll_min_interval_s",
        "image_pull_timeout_s",
        "log_cache_bytes",
        "log_cache_attempts",
    )
    def _hand_setting_to_parts(self, change: Any) -> None:
        """A setting changed once the parts were built: the parts that hold it get it."""
        for part in (getattr(self, "poller", None), getattr(self, "logs", None)):
            if part is not None and hasattr(part, change["name"]):
                setattr(part, change["name"], change["new"])

    @classmethod
    def create(cls, settings: Any) -> KubeJobsBackend:
        backend = cls(parent=settings)
        backend.user_root = getattr(settings, "user_root", None)
        broker = getattr(settings, "broker", None)
        if broker is not None:
            backend.gpu_memory = lambda: {
                g.uuid: g.memory_mib for n in broker.policy.nodes for g in n.gpus
            }
        return backend

    @property
    def api(self) -> KubeClient:
        if self.client is None:
            self.client = AsyncKubeClient(timeout_s=self.request_timeout_s)
        return self.client

    def template(self) -> JobTemplate:
        return JobTemplate(
            namespace=self.namespace,
            image=self.image,
            image_pull_policy=self.image_pull_policy,
            python=self.python,
            gpu_backend=self.gpu_backend,
            pool_gpu_backends={str(k): str(v) for k, v in self.pool_gpu_backends.items()},
            storage=Storage(
                type=self.storage_type,
                pvc_name_template=self.pvc_name_template,
                volume_name_template=self.volume_name_template,
                static_pvc_name=self.static_pvc_name,
                sub_path=self.storage_sub_path,
                home_mount_path=self.home_mount_path,
                slug_scheme=self.slug_scheme,
            ),
            pin_to_grant=self.pin_to_grant,
            kai_queue_template=self.kai_queue_template,
            kai_priority_class=self.kai_priority_class,
            mig_profile=self.mig_profile,
            run_as_uid=self.run_as_uid,
            run_as_gid=self.run_as_gid,
            fs_gid=self.fs_gid,
            service_account=self.service_account,
            ttl_seconds_after_finished=self.ttl_seconds_after_finished,
            extra_env={str(k): str(v) for k, v in self.extra_env.items()},
            extra_labels={str(k): str(v) for k, v in self.extra_labels.items()},
            node_selector={str(k): str(v) for k, v in self.node_selector.items()},
            tolerations=tuple(dict(t) for t in self.tolerations),
            pool_label=self.pool_label,
            memory_limit_factor=self.memory_limit_factor,
        )

    def capabilities(self) -> Capabilities:
        isolation = {
            "whole": "hard (whole GPUs)",
            "mig": "hard (MIG)",
            "hami": "hard (HAMi)",
            "hami-metax": "hard (HAMi, MetaX sGPU)",
            "kai": "framework caps",
            "timeslice": "none",
        }[self.gpu_backend]
        return Capabilities(
            name=self.name,
            enforces=(
                f"{self.gpu_backend} GPU resources (as the kube spawner's pods)",
                "Kueue admission (LocalQueue of the team, WorkloadPriorityClass)",
                "activeDeadlineSeconds (maximum runtime)",
                "GPUSHARE_* grant variables",
            ),
            memory_isolation=isolation,
            runs_as_user=False,
            survives_broker_restart=True,
            own_process_group=True,
            notes=f"namespace {self.namespace}; the executed notebook is written into the "
            "user's volume, which the broker does not mount: the user's server serves it "
            "(GET /gpushare/api/jobs/<id>/output) and JupyterLab opens it from the user's files",
            output_in_user_files_only=self.storage_type != "none",
            user_files_mount=self.home_mount_path,
        )

    # -- submit -----------------------------------------------------------------------------

    def output_relpath(self, spec: RunSpec) -> str:
        """The output notebook relative to the user's files."""
        if self.user_root is not None:
            rel = os.path.relpath(spec.output_path, self.user_root(spec.user))
        else:
            rel = os.path.basename(spec.output_path)
        return rel.replace(os.sep, "/")

    def refusal(self, spec: RunSpec) -> str | None:
        """A grant the pods could not hold as granted: a fraction with the ``whole``
        backend (it would take a whole GPU the broker counts as partly free), or one the
        Job cannot be built for (a MIG grant naming no profile, output outside the user's
        files, static storage without its PVC, a snapshot too big for a ConfigMap)."""
        from ..broker.client import GrantInfo

        template = self.template()
        grant = GrantInfo.from_json(spec.grant)
        try:
            backend = gpu_backend_for(grant.pool, template)
            if backend == "whole" and len(grant.gpus) == 1 and grant.units < 1:
                return (
                    f"this grant is {grant.units:g} of a GPU, but jobs in pool "
                    f"{grant.pool} get whole GPUs (c.KubeJobsBackend.gpu_backend = "
                    "'whole'); use a whole-GPU profile, or a sharing backend (hami, mig, "
                    "kai, timeslice) for the pool"
                )
            job_manifest(spec, self.output_relpath(spec), template)
            if len(json.dumps(spec.notebook)) > CONFIGMAP_LIMIT_BYTES:  # compress big ones
                configmap_manifest(spec, self.output_relpath(spec), template)
        except ValueError as exc:
            return str(exc)
        return None

    def submit(self, spec: RunSpec) -> RunHandle:
        template = self.template()
        rel = self.output_relpath(spec)
        gpu_memory = self.gpu_memory() if self.gpu_memory is not None else None
        warnings: list[str] = []
        job = job_manifest(spec, rel, template, gpu_memory, warnings)
        for warning in warnings:
            self.log.warning("gpushare job %s: %s", spec.job_id, warning)
        configmap = configmap_manifest(spec, rel, template)  # refuses a too big snapshot
        name = job["metadata"]["name"]
        ns = template.namespace
        try:
            created = self.api.create_job(ns, job)
        except AlreadyExists:  # a second submit of this attempt: the first one's Job
            created = self.api.get_job(ns, name) or job
        uid = str((created.get("metadata") or {}).get("uid") or "")
        if uid:  # the ConfigMap goes with its Job (garbage collection)
            configmap["metadata"]["ownerReferences"] = [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": name,
                    "uid": uid,
                    "blockOwnerDeletion": False,
                }
            ]
        try:
            self.api.create_configmap(ns, configmap)
        except AlreadyExists:
            pass
        except Exception:
            self.api.delete_job(ns, name, propagation="Background", grace_s=0)
            raise
        return RunHandle(
            self.name,
            spec.job_id,
            spec.attempt,
            {
                "namespace": ns,
                "name": name,
                "uid": uid,
                "grace_s": int(job["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]),
                "output_path": pod_paths(spec, rel, template).output,
            },
        )

    # -- stop -------------------------------------------------------------------------------

    def signal(self, handle: RunHandle) -> None:
        """Delete the attempt's pods with the grant's grace period: the kubelet sends
        SIGTERM (the runner saves its notebook and checkpoint), SIGKILL after it. A Job
        still waiting in Kueue, or whose pod has not started (Pending), has nothing to
        save: it is deleted."""
        ns, name = self.poller.ns_name(handle)
        self.poller.fresh(handle)
        self.logs.fresh(handle.job_id)
        self.logs.keep(handle)
        pods = self.api.list_pods(ns, attempt_selector(handle.job_id, handle.attempt))
        live = [
            p for p in pods if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
        ]
        if not live:
            job = self.api.get_job(ns, name)
            if job is not None and (job.get("spec") or {}).get("suspend"):
                self.api.delete_job(ns, name, propagation="Foreground", grace_s=0)
            return
        if all(pod_wait(p, CONTAINER) is not None for p in live):  # nothing ran yet
            self.api.delete_job(ns, name, propagation="Foreground", grace_s=0)
            return
        grace = int(handle.ref.get("grace_s") or 30)
        for pod in live:
            self.api.delete_pod(ns, str(pod["metadata"]["name"]), grace)

    def kill(self, handle: RunHandle) -> None:
        """Delete the Job now: its pods with grace 0 (SIGKILL), then the Job in the
        foreground (the ConfigMap goes with it)."""
        ns, name = self.poller.ns_name(handle)
        self.poller.fresh(handle)
        self.logs.fresh(handle.job_id)
        self.logs.keep(handle)
        for pod in self.api.list_pods(ns, attempt_selector(handle.job_id, handle.attempt)):
            self.api.delete_pod(ns, str(pod["metadata"]["name"]), 0)
        self.api.delete_job(ns, name, propagation="Foreground", grace_s=0)
        self.api.delete_configmap(ns, name)

    # -- state and logs: the parts' ----------------------------------------------------------

    def poll(self, handle: RunHandle) -> RunStatus:
        """The attempt's state (see the module docstring), asked of the API server at most
        every ``poll_min_interval_s``."""
        return self.poller.poll(handle)

    def read_log(self, job_id: str, offset: int = 0, max_bytes: int = 65536) -> tuple[bytes, int]:
        return self.logs.read_log(job_id, offset, max_bytes)

    def log_size(self, job_id: str) -> int:
        return self.logs.log_size(job_id)

    # -- output -------------------------------------------------------------------------------
    def fetch_output(self, handle: RunHandle) -> bytes | None:
        """None: the executed notebook is in the user's volume (``output_path``), which
        the broker does not mount; the user's server, which mounts it, serves it
        (``Capabilities.output_in_user_files_only``)."""
        return None

    def checkpoint_dir(self, job_id: str) -> str:
        return posixpath.join(self.home_mount_path, ".gpushare", "jobs", job_id, "checkpoint")

    def forget(self, job_id: str) -> None:
        for job in self.api.list_jobs(self.namespace, job_selector(job_id)):
            self.api.delete_job(
                self.namespace, str(job["metadata"]["name"]), propagation="Background"
            )
        self.poller.forget(job_id)
        self.logs.forget(job_id)

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
