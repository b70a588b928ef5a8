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
"""

from __future__ import annotations

import json
import os
import posixpath
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from traitlets import Bool, CaselessStrEnum, Dict, Float, Integer, List, Unicode

from ..spawner import enforcement
from .base import Capabilities, ConfigurableJobBackend, RunHandle, RunSpec, RunStatus
from .kube_client import AlreadyExists, AsyncKubeClient, KubeClient, KubeError, NotFound
from .kube_objects import (
    ATTEMPT_LABEL,
    CONFIGMAP_LIMIT_BYTES,
    CONTAINER,
    JobTemplate,
    Storage,
    attempt_selector,
    configmap_manifest,
    gpu_backend_for,
    job_manifest,
    job_selector,
    object_name,
    pod_paths,
)
from .kube_status import condition, disrupted, terminated_state, timestamp
from .kube_waiting import WaitTracker, needs_events, pod_wait, terminal


class KubeJobsBackend(ConfigurableJobBackend):
    """Batch jobs as Kubernetes Jobs admitted by Kueue (see the module docstring)."""

    name = "kubernetes"

    namespace = Unicode("jupyterhub", config=True,
                        help="Namespace of the Jobs (the LocalQueues of the Kueue export).")
    image = Unicode("quay.io/jupyter/pytorch-notebook:cuda12-latest", config=True,
                    help="Image of the job's container: it needs jupyter-gpushare and "
                    "papermill (as the single-user image does).")
    image_pull_policy = CaselessStrEnum(["IfNotPresent", "Always", "Never"], "IfNotPresent",
                                        config=True, help="imagePullPolicy of the container.")
    python = Unicode("python3", config=True, help="The image's Python.")
    gpu_backend = CaselessStrEnum(
        list(enforcement.KUBE_BACKENDS), "whole", config=True,
        help="How a grant is enforced in the pod, as c.KubeGPUShareSpawner.gpu_backend: "
        "whole | mig | hami | hami-metax | kai | timeslice.")
    pool_gpu_backends = Dict(
        config=True, help="Enforcement of single pools, e.g. {'slices': 'mig'} (the default "
        "is gpu_backend).")
    pin_to_grant = Bool(True, config=True,
                        help="Put the pod on the grant's node (and, with HAMi, its GPUs).")
    kai_queue_template = Unicode("{team}", config=True,
                                 help="KAI queue (kai.scheduler/queue); {team}, {pool} expand.")
    kai_priority_class = Unicode(
        "build", config=True, help="KAI priority class of job pods (KAI's 'build' is "
        "non-preemptible; the broker and Kueue decide on preemption).")
    mig_profile = Unicode("", config=True,
                          help="MIG profile when the GPU models of a MIG pool do not name it.")
    storage_type = CaselessStrEnum(
        ["dynamic", "static", "none"], "dynamic", config=True,
        help="The user's storage as z2jh's singleuser.storage.type: 'dynamic' (a PVC per "
        "user), 'static' (one PVC, a subPath per user) or 'none' (output is lost).")
    pvc_name_template = Unicode(
        "claim-{username}{servername}", config=True,
        help="z2jh singleuser.storage.dynamic.pvcNameTemplate ({username}: KubeSpawner's "
        "slug of the user name; {servername} is empty: the user's default server's PVC).")
    volume_name_template = Unicode(
        "volume-{username}{servername}", config=True,
        help="z2jh singleuser.storage.dynamic.volumeNameTemplate.")
    static_pvc_name = Unicode("", config=True, help="z2jh singleuser.storage.static.pvcName.")
    storage_sub_path = Unicode(
        "", config=True, help="subPath of the home mount, e.g. 'home/{username}' (z2jh "
        "singleuser.storage.static.subPath).")
    home_mount_path = Unicode("/home/jovyan", config=True,
                              help="z2jh singleuser.storage.homeMountPath.")
    slug_scheme = CaselessStrEnum(["safe", "escape"], "safe", config=True,
                                  help="KubeSpawner's slug_scheme, for {username}.")
    run_as_uid = Integer(1000, allow_none=True, config=True, help="runAsUser (jovyan).")
    run_as_gid = Integer(100, allow_none=True, config=True, help="runAsGroup.")
    fs_gid = Integer(100, allow_none=True, config=True, help="fsGroup of the volumes.")
    service_account = Unicode("", config=True,
                              help="serviceAccountName of job pods ('': none mounted).")
    ttl_seconds_after_finished = Integer(
        7 * 24 * 3600, allow_none=True, config=True,
        help="ttlSecondsAfterFinished: a finished Job (and its pod's log) is removed after "
        "this long.")
    extra_env = Dict(config=True, help="Variables added to every job's container.")
    extra_labels = Dict(config=True, help="Labels added to every Job and pod.")
    node_selector = Dict(config=True, help="nodeSelector added to every job pod.")
    tolerations: List[dict[str, Any]] = List(Dict(), config=True,
                                             help="Tolerations of job pods (dicts).")
    pool_label = Unicode("gpushare.jupyter.org/pool", config=True,
                         help="Node label of the pool: the pod selects it (and Kueue's "
                         "ResourceFlavor by it); '' to leave it out.")
    memory_limit_factor = Float(1.0, config=True,
                                help="Memory limit = the grant's memory request x this.")
    request_timeout_s = Float(30.0, config=True, help="Timeout of one API call.")
    poll_min_interval_s = Float(
        2.0, config=True,
        help="A running attempt's state (and a job's log) is asked of the API server at most "
        "this often; the broker's loop polls faster and gets the last answer meanwhile.")
    log_cache_bytes = Integer(
        4 * 1024 * 1024, config=True,
        help="Log bytes kept per attempt once its pod ended (its log stays readable after "
        "the pod is removed, while the broker runs).")
    log_cache_attempts = Integer(256, config=True, help="Attempts whose ended log is kept.")
    image_pull_timeout_s = Float(
        600.0, config=True,
        help="An admitted job pod whose image cannot be pulled (ErrImagePull, "
        "ImagePullBackOff) for this long fails its attempt with the reason; its Job is "
        "deleted and the grant released. Until then the job waits, saying why.")

    def __init__(self, client: KubeClient | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.client: KubeClient | None = client
        self.user_root: Callable[[str], str] | None = None
        self.gpu_memory: Callable[[], Mapping[str, int]] | None = None
        self._logs: OrderedDict[tuple[str, int], bytes] = OrderedDict()
        self._polled: dict[tuple[str, int], tuple[float, RunStatus]] = {}
        self._log_reads: OrderedDict[str, tuple[float, list[tuple[int, bytes]]]] = OrderedDict()
        self._waits = WaitTracker()
        self._lock = threading.Lock()

    @classmethod
    def create(cls, settings: Any) -> KubeJobsBackend:
        backend = cls(parent=settings)
        backend.user_root = getattr(settings, "user_root", None)
        broker = getattr(settings, "broker", None)
        if broker is not None:
            backend.gpu_memory = lambda: {g.uuid: g.memory_mib for n in broker.policy.nodes
                                          for g in n.gpus}
        return backend

    @property
    def api(self) -> KubeClient:
        if self.client is None:
            self.client = AsyncKubeClient(timeout_s=self.request_timeout_s)
        return self.client

    def template(self) -> JobTemplate:
        return JobTemplate(
            namespace=self.namespace, image=self.image, image_pull_policy=self.image_pull_policy,
            python=self.python, gpu_backend=self.gpu_backend,
            pool_gpu_backends={str(k): str(v) for k, v in self.pool_gpu_backends.items()},
            storage=Storage(
                type=self.storage_type, pvc_name_template=self.pvc_name_template,
                volume_name_template=self.volume_name_template,
                static_pvc_name=self.static_pvc_name, sub_path=self.storage_sub_path,
                home_mount_path=self.home_mount_path, slug_scheme=self.slug_scheme),
            pin_to_grant=self.pin_to_grant, kai_queue_template=self.kai_queue_template,
            kai_priority_class=self.kai_priority_class, mig_profile=self.mig_profile,
            run_as_uid=self.run_as_uid, run_as_gid=self.run_as_gid, fs_gid=self.fs_gid,
            service_account=self.service_account,
            ttl_seconds_after_finished=self.ttl_seconds_after_finished,
            extra_env={str(k): str(v) for k, v in self.extra_env.items()},
            extra_labels={str(k): str(v) for k, v in self.extra_labels.items()},
            node_selector={str(k): str(v) for k, v in self.node_selector.items()},
            tolerations=tuple(dict(t) for t in self.tolerations),
            pool_label=self.pool_label, memory_limit_factor=self.memory_limit_factor,
        )

    def capabilities(self) -> Capabilities:
        isolation = {"whole": "hard (whole GPUs)", "mig": "hard (MIG)",
                     "hami": "hard (HAMi)", "hami-metax": "hard (HAMi, MetaX sGPU)",
                     "kai": "framework caps", "timeslice": "none"}[self.gpu_backend]
        return Capabilities(
            name=self.name,
            enforces=(f"{self.gpu_backend} GPU resources (as the kube spawner's pods)",
                      "Kueue admission (LocalQueue of the team, WorkloadPriorityClass)",
                      "activeDeadlineSeconds (maximum runtime)", "GPUSHARE_* grant variables"),
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
                return (f"this grant is {grant.units:g} of a GPU, but jobs in pool "
                        f"{grant.pool} get whole GPUs (c.KubeJobsBackend.gpu_backend = "
                        "'whole'); use a whole-GPU profile, or a sharing backend (hami, mig, "
                        "kai, timeslice) for the pool")
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
            configmap["metadata"]["ownerReferences"] = [{
                "apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": uid,
                "blockOwnerDeletion": False}]
        try:
            self.api.create_configmap(ns, configmap)
        except AlreadyExists:
            pass
        except Exception:
            self.api.delete_job(ns, name, propagation="Background", grace_s=0)
            raise
        return RunHandle(self.name, spec.job_id, spec.attempt, {
            "namespace": ns, "name": name, "uid": uid,
            "grace_s": int(job["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]),
            "output_path": pod_paths(spec, rel, template).output,
        })

    # -- poll -------------------------------------------------------------------------------

    def _ns_name(self, handle: RunHandle) -> tuple[str, str]:
        return (str(handle.ref.get("namespace") or self.namespace),
                str(handle.ref.get("name") or object_name(handle.job_id, handle.attempt)))

    def poll(self, handle: RunHandle) -> RunStatus:
        """The attempt's state (see the module docstring); a live one is asked of the API
        server at most every ``poll_min_interval_s``."""
        key = (handle.job_id, handle.attempt)
        now = time.monotonic()
        with self._lock:
            cached = self._polled.get(key)
        if cached is not None and now - cached[0] < self.poll_min_interval_s:
            return cached[1]
        status = self._poll_now(handle)
        with self._lock:
            if status.alive:
                self._polled[key] = (now, status)
            else:
                self._polled.pop(key, None)
                self._waits.clear(key)
        return status

    def _fresh(self, handle: RunHandle) -> None:
        """The next poll and log read ask the API server again (after a stop)."""
        with self._lock:
            self._polled.pop((handle.job_id, handle.attempt), None)
            self._log_reads.pop(handle.job_id, None)
            self._waits.clear((handle.job_id, handle.attempt))

    def _poll_now(self, handle: RunHandle) -> RunStatus:
        ns, name = self._ns_name(handle)
        job = self.api.get_job(ns, name)
        if job is None:
            return RunStatus(alive=False, started=bool(handle.ref))
        uid = str((job.get("metadata") or {}).get("uid") or "")
        if handle.ref.get("uid") and uid and uid != handle.ref["uid"]:
            return RunStatus(alive=False, reason="its Job was replaced by another of that name")
        status = job.get("status") or {}
        started_at = timestamp(status.get("startTime"))
        complete = condition(job, "Complete")
        failed = condition(job, "Failed")
        if complete or failed:
            return self._ended(handle, ns, complete, failed, started_at, status)
        evicted = self._evicted(ns, uid)
        pods = None
        if evicted is None:
            pods = self.api.list_pods(ns, attempt_selector(handle.job_id, handle.attempt))
            evicted = next((r for r in map(disrupted, pods) if r), None)
        if evicted is not None:
            # Kueue (or the cluster) took the GPUs back: the broker requeues the job; the
            # Job goes, so Kueue does not start it again outside the broker's grant
            self.api.delete_job(ns, name, propagation="Background")
            return RunStatus(alive=False, finished=True, exit_code=None, preempted=True,
                             terminated=True, started_at=started_at,
                             error={"summary": f"preempted on the cluster: {evicted}"},
                             reason=f"preempted on the cluster: {evicted}")
        if (job.get("spec") or {}).get("suspend"):
            return RunStatus(alive=True, queued=True, reason=self._pending_reason(ns, uid))
        return self._started(handle, ns, name, pods or [], started_at)

    def _started(self, handle: RunHandle, ns: str, name: str, pods: list[dict[str, Any]],
                 started_at: float | None) -> RunStatus:
        """A Job Kueue let run: alive, or ``queued`` while its pod waits (saying why), or
        failed where waiting cannot help (:func:`.kube_waiting.terminal`)."""
        key = (handle.job_id, handle.attempt)
        pods.sort(key=lambda p: str((p.get("metadata") or {}).get("creationTimestamp") or ""))
        if not pods:
            return RunStatus(alive=True, queued=True,
                             reason="waiting: the Job's pod is being created")
        pod = pods[-1]
        events = None
        if needs_events(pod, CONTAINER):
            selector = f"involvedObject.kind=Pod,involvedObject.name={pod['metadata']['name']}"
            try:
                events = self.api.list_events(ns, selector)
            except KubeError as exc:  # e.g. no RBAC for events: the pod's state still says
                self.log.debug("no events of %s: %s", pod["metadata"]["name"], exc)
        wait = pod_wait(pod, CONTAINER, events)
        if wait is None:
            with self._lock:
                self._waits.clear(key)
            return RunStatus(alive=True, started_at=started_at)
        with self._lock:
            wait, waited = self._waits.see(key, wait, time.monotonic())
        failed = terminal(wait, waited, self.image_pull_timeout_s)
        if failed is None:
            return RunStatus(alive=True, queued=True, reason=wait.text)
        self.log.warning("gpushare job %s attempt %s: %s", handle.job_id, handle.attempt, failed)
        self.api.delete_job(ns, name, propagation="Background", grace_s=0)
        self.api.delete_configmap(ns, name)
        return RunStatus(alive=False, finished=True, exit_code=None, started_at=started_at,
                         error={"summary": failed}, reason=wait.code)

    def _workloads(self, ns: str, uid: str) -> list[dict[str, Any]]:
        if not uid:
            return []
        return self.api.list_workloads(ns, f"kueue.x-k8s.io/job-uid={uid}")

    def _evicted(self, ns: str, uid: str) -> str | None:
        for wl in self._workloads(ns, uid):
            for kind in ("Preempted", "Evicted"):
                cond = condition(wl, kind)
                if cond is not None:
                    return f"{cond.get('reason') or kind}: {cond.get('message') or ''}".strip()
        return None

    def _pending_reason(self, ns: str, uid: str) -> str:
        for wl in self._workloads(ns, uid):
            cond = next((c for c in (wl.get("status") or {}).get("conditions") or []
                         if c.get("type") == "QuotaReserved"), None)
            if cond and cond.get("status") != "True":
                return f"waiting for Kueue: {cond.get('message') or cond.get('reason')}"
        return "waiting for Kueue to admit the Job"

    def _ended(self, handle: RunHandle, ns: str, complete: dict[str, Any] | None,
               failed: dict[str, Any] | None, started_at: float | None,
               status: Mapping[str, Any]) -> RunStatus:
        pods = self.api.list_pods(ns, attempt_selector(handle.job_id, handle.attempt))
        pods.sort(key=lambda p: str((p.get("metadata") or {}).get("creationTimestamp") or ""))
        term = next((t for t in map(terminated_state, reversed(pods)) if t), None)
        message: dict[str, Any] = {}
        if term and term.get("message"):
            try:
                message = dict(json.loads(term["message"]))
            except (ValueError, TypeError):
                message = {}
        ended_at = timestamp(status.get("completionTime")) or timestamp(
            (term or {}).get("finishedAt"))
        output = message.get("output_path") or handle.ref.get("output_path")
        common = dict(alive=False, finished=True, started_at=started_at, ended_at=ended_at,
                      output_path=output, terminated=bool(message.get("terminated")))
        if complete:
            return RunStatus(exit_code=0, error=None, **common)  # type: ignore[arg-type]
        assert failed is not None
        reason = str(failed.get("reason") or "")
        code = term.get("exitCode") if term else message.get("exit_code")
        error = message.get("error")
        taken = next((r for r in map(disrupted, pods) if r), None)
        if taken:
            return RunStatus(exit_code=None, preempted=True, reason=taken,
                             error={"summary": f"preempted on the cluster: {taken}"},
                             **{**common, "terminated": True})  # type: ignore[arg-type]
        if reason == "DeadlineExceeded":
            summary = ("stopped: over its maximum runtime (activeDeadlineSeconds "
                       f"{failed.get('message') or ''})").replace(" )", ")")
            return RunStatus(exit_code=code if isinstance(code, int) and code else 1,
                             error={"summary": summary}, reason=reason,
                             **common)  # type: ignore[arg-type]
        if term and term.get("reason") == "OOMKilled" and not error:
            error = {"summary": "out of memory: the job went over its pod's memory limit "
                     "and was killed (OOMKilled)"}
        if not error:
            if term is None:
                summary = f"the job's pod ended without a result ({reason or 'Failed'}: " \
                          f"{failed.get('message') or 'the pod is gone'})"
            else:
                summary = f"failed (exit code {code}; {term.get('reason') or reason})"
            error = {"summary": summary}
        return RunStatus(exit_code=int(code) if isinstance(code, int) else None, error=error,
                         reason=reason, **common)  # type: ignore[arg-type]

    # -- stop -------------------------------------------------------------------------------

    def signal(self, handle: RunHandle) -> None:
        """Delete the attempt's pods with the grant's grace period: the kubelet sends
        SIGTERM (the runner saves its notebook and checkpoint), SIGKILL after it. A Job
        still waiting in Kueue, or whose pod has not started (Pending), has nothing to
        save: it is deleted."""
        ns, name = self._ns_name(handle)
        self._fresh(handle)
        self._keep_logs(handle)
        pods = self.api.list_pods(ns, attempt_selector(handle.job_id, handle.attempt))
        live = [p for p in pods if (p.get("status") or {}).get("phase") not in
                ("Succeeded", "Failed")]
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
        ns, name = self._ns_name(handle)
        self._fresh(handle)
        self._keep_logs(handle)
        for pod in self.api.list_pods(ns, attempt_selector(handle.job_id, handle.attempt)):
            self.api.delete_pod(ns, str(pod["metadata"]["name"]), 0)
        self.api.delete_job(ns, name, propagation="Foreground", grace_s=0)
        self.api.delete_configmap(ns, name)

    # -- logs and output ----------------------------------------------------------------------

    def _attempt_logs(self, job_id: str) -> list[tuple[int, bytes]]:
        """Every attempt's log, oldest first (read at most every ``poll_min_interval_s``)."""
        now = time.monotonic()
        with self._lock:
            cached = self._log_reads.get(job_id)
        if cached is not None and now - cached[0] < self.poll_min_interval_s:
            return cached[1]
        logs = self._read_logs(job_id)
        with self._lock:
            self._log_reads[job_id] = (now, logs)
            self._log_reads.move_to_end(job_id)
            while len(self._log_reads) > max(1, self.log_cache_attempts):
                self._log_reads.popitem(last=False)
        return logs

    def _read_logs(self, job_id: str) -> list[tuple[int, bytes]]:
        """Every attempt's log, oldest first: from the pods that exist, else the cache."""
        pods = self.api.list_pods(self.namespace, job_selector(job_id))
        found: dict[int, bytes] = {}
        for pod in sorted(pods, key=lambda p: str(p["metadata"].get("creationTimestamp"))):
            attempt = int((pod["metadata"].get("labels") or {}).get(ATTEMPT_LABEL) or 0)
            with self._lock:
                cached = self._logs.get((job_id, attempt))
            phase = (pod.get("status") or {}).get("phase")
            if cached is not None and phase in ("Succeeded", "Failed"):
                found[attempt] = found.get(attempt, b"") + cached
                continue
            try:
                text = self.api.read_pod_log(self.namespace, str(pod["metadata"]["name"]),
                                             CONTAINER).encode()
            except NotFound:
                continue
            except Exception as exc:  # noqa: BLE001 - a pod still starting has no log yet
                self.log.debug("no log of %s yet: %s", pod["metadata"]["name"], exc)
                continue
            text = text[: self.log_cache_bytes]
            self._remember(job_id, attempt, text)
            found[attempt] = found.get(attempt, b"") + text
        with self._lock:
            for (jid, attempt), data in self._logs.items():
                if jid == job_id and attempt not in found:
                    found[attempt] = data
        return sorted(found.items())

    def _remember(self, job_id: str, attempt: int, data: bytes) -> None:
        with self._lock:
            self._logs[(job_id, attempt)] = data
            self._logs.move_to_end((job_id, attempt))
            while len(self._logs) > max(1, self.log_cache_attempts):
                self._logs.popitem(last=False)

    def _keep_logs(self, handle: RunHandle) -> None:
        """Read the attempt's log before its pod is deleted."""
        try:
            self._read_logs(handle.job_id)
        except Exception as exc:  # noqa: BLE001 - the stop matters more than the log
            self.log.warning("gpushare: could not keep the log of %s: %s", handle.job_id, exc)

    def read_log(self, job_id: str, offset: int = 0, max_bytes: int = 65536) -> tuple[bytes, int]:
        data = b"".join(d for _, d in self._attempt_logs(job_id))
        start = max(0, offset)
        chunk = data[start:start + max_bytes]
        return chunk, start + len(chunk)

    def log_size(self, job_id: str) -> int:
        return sum(len(d) for _, d in self._attempt_logs(job_id))

    def fetch_output(self, handle: RunHandle) -> bytes | None:
        """None: the executed notebook is in the user's volume (``output_path``), which
        the broker does not mount; the user's server, which mounts it, serves it
        (``Capabilities.output_in_user_files_only``)."""
        return None

    def checkpoint_dir(self, job_id: str) -> str:
        return posixpath.join(self.home_mount_path, ".gpushare", "jobs", job_id, "checkpoint")

    def forget(self, job_id: str) -> None:
        for job in self.api.list_jobs(self.namespace, job_selector(job_id)):
            self.api.delete_job(self.namespace, str(job["metadata"]["name"]),
                                propagation="Background")
        with self._lock:
            for key in [k for k in self._logs if k[0] == job_id]:
                del self._logs[key]
            for key in [k for k in self._polled if k[0] == job_id]:
                del self._polled[key]
            self._waits.forget(job_id)
            self._log_reads.pop(job_id, None)

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
