"""An in-memory stand-in for the Kubernetes API, its Job controller and Kueue.

It is NOT a real API server (none can run on these machines): it implements the backend's
small :class:`~jupyter_gpushare.backends.kube_client.KubeClient` interface and follows the
documented semantics of what the backend relies on:

* a Job is created suspended; its Kueue Workload (label ``kueue.x-k8s.io/job-uid``) waits
  with ``QuotaReserved=False`` until :meth:`FakeKube.admit` (Kueue admits: the Job is
  unsuspended and its controller starts one pod);
* with ``backoffLimit: 0`` one failed pod fails the Job (``Failed``, reason
  ``BackoffLimitExceeded``); ``activeDeadlineSeconds`` passing fails it with
  ``DeadlineExceeded`` and its pods are deleted; success sets ``Complete``;
* deleting a pod (:meth:`delete_pod`) is SIGTERM, then the pod is gone; a deleted running
  pod counts as a failure of the Job;
* Kueue preempting a workload (:meth:`evict`) sets ``Evicted``/``Preempted`` on the
  Workload, suspends the Job again and deletes its pods;
* deleting a Job deletes its pods, its Workload and the ConfigMaps it owns (GC);
* an admitted pod may wait before it runs, as the scheduler and the kubelet report it
  (re-evaluated at each pod listing, until the cause is gone): no node fits
  (:attr:`unschedulable`: ``PodScheduled=False``, ``Unschedulable``), its claim attached to
  another node (:attr:`attached_elsewhere`: ``ContainerCreating`` and a Warning event
  ``FailedAttachVolume`` "Multi-Attach error ..."), its image not pullable
  (:attr:`unpullable`: ``ErrImagePull`` with the registry's message and a Warning event
  ``Failed`` saying it, then ``ImagePullBackOff``, alternating with each pull), a
  configuration the container cannot be created from (:attr:`config_errors`:
  ``CreateContainerConfigError``);
* :meth:`FakeKube.run` is a kubelet that runs the admitted pod's container for real, as a
  local process: its ConfigMap's files laid out as a configMap volume, the user's
  PersistentVolumeClaim as a local folder that must be mounted where the pod mounts it.
"""

from __future__ import annotations

import base64
import copy
import itertools
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, ClassVar

from jupyter_gpushare.backends.kube import KubeJobsBackend
from jupyter_gpushare.backends.kube_client import AlreadyExists, KubeClient, NotFound

NOW = "2026-12-01T10:00:00Z"
LATER = "2026-12-01T10:05:00Z"


def _matches(obj: dict[str, Any], selector: str) -> bool:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    for term in filter(None, selector.split(",")):
        key, _, value = term.partition("=")
        if labels.get(key) != value:
            return False
    return True


def _cond(kind: str, status: str = "True", reason: str = "", message: str = "") -> dict:
    return {"type": kind, "status": status, "reason": reason, "message": message,
            "lastTransitionTime": NOW}


class FakeKube(KubeClient):
    """See the module docstring; ``calls`` records every call, in order."""

    def __init__(self) -> None:
        self.jobs: dict[tuple[str, str], dict[str, Any]] = {}
        self.configmaps: dict[tuple[str, str], dict[str, Any]] = {}
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.workloads: dict[tuple[str, str], dict[str, Any]] = {}
        self.logs: dict[str, str] = {}
        self.events: list[dict[str, Any]] = []
        self.calls: list[tuple[Any, ...]] = []
        self.unschedulable = ""  # why no node can take a pod ('': the scheduler places it)
        self.attached_elsewhere: dict[str, str] = {}  # claimName -> the pod that holds it
        self.unpullable: dict[str, str] = {}  # image -> the registry's error message
        self.config_errors: dict[str, str] = {}  # Job name -> the kubelet's message
        self._ticks = itertools.count(1)
        self._uids = itertools.count(1)
        self.lock = threading.RLock()

    # -- the interface ----------------------------------------------------------------------

    def create_job(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            name = body["metadata"]["name"]
            self.calls.append(("create_job", namespace, name))
            if (namespace, name) in self.jobs:
                raise AlreadyExists(409, f"jobs.batch {name!r} already exists")
            job = copy.deepcopy(body)
            uid = f"uid-{next(self._uids)}"
            job["metadata"].update(uid=uid, creationTimestamp=NOW, namespace=namespace)
            job["status"] = {}
            self.jobs[namespace, name] = job
            self.workloads[namespace, f"job-{name}"] = {
                "metadata": {"name": f"job-{name}", "labels": {"kueue.x-k8s.io/job-uid": uid}},
                "status": {"conditions": [_cond(
                    "QuotaReserved", "False", "Pending",
                    "couldn't assign flavors to pod set main: insufficient unused quota")]},
            }
            return copy.deepcopy(job)

    def get_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        with self.lock:
            self.calls.append(("get_job", namespace, name))
            job = self.jobs.get((namespace, name))
            return copy.deepcopy(job) if job else None

    def delete_job(self, namespace: str, name: str, *, propagation: str = "Foreground",
                   grace_s: int | None = None) -> None:
        with self.lock:
            self.calls.append(("delete_job", namespace, name, propagation, grace_s))
            job = self.jobs.pop((namespace, name), None)
            if job is None:
                return
            uid = job["metadata"]["uid"]
            for key, pod in list(self.pods.items()):
                if pod["metadata"]["labels"].get("job-name") == name:
                    del self.pods[key]
            for key, wl in list(self.workloads.items()):
                if wl["metadata"]["labels"].get("kueue.x-k8s.io/job-uid") == uid:
                    del self.workloads[key]
            for key, cm in list(self.configmaps.items()):
                owners = cm["metadata"].get("ownerReferences") or []
                if any(o.get("uid") == uid for o in owners):
                    del self.configmaps[key]

    def list_jobs(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        with self.lock:
            return [copy.deepcopy(j) for (ns, _), j in self.jobs.items()
                    if ns == namespace and _matches(j, selector)]

    def create_configmap(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            name = body["metadata"]["name"]
            self.calls.append(("create_configmap", namespace, name))
            if (namespace, name) in self.configmaps:
                raise AlreadyExists(409, f"configmaps {name!r} already exists")
            self.configmaps[namespace, name] = copy.deepcopy(body)
            return copy.deepcopy(body)

    def delete_configmap(self, namespace: str, name: str) -> None:
        with self.lock:
            self.calls.append(("delete_configmap", namespace, name))
            self.configmaps.pop((namespace, name), None)

    def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        with self.lock:
            for (ns, _), pod in self.pods.items():
                if ns == namespace and pod["status"]["phase"] == "Pending":
                    self._kubelet(namespace, pod)
            return [copy.deepcopy(p) for (ns, _), p in self.pods.items()
                    if ns == namespace and _matches(p, selector)]

    def list_events(self, namespace: str, field_selector: str) -> list[dict[str, Any]]:
        with self.lock:
            self.calls.append(("list_events", namespace, field_selector))
            want = dict(t.partition("=")[::2] for t in field_selector.split(",") if t)
            out = []
            for event in self.events:
                obj = event["involvedObject"]
                if event["metadata"]["namespace"] == namespace and all(
                        obj.get(k.removeprefix("involvedObject.")) == v for k, v in want.items()):
                    out.append(copy.deepcopy(event))
            return out

    def delete_pod(self, namespace: str, name: str, grace_s: int) -> None:
        """SIGTERM, the grace period, the pod is gone; the Job counts a failure."""
        with self.lock:
            self.calls.append(("delete_pod", namespace, name, grace_s))
            pod = self.pods.pop((namespace, name), None)
            if pod is None:
                return
            if pod["status"]["phase"] == "Running":
                self._job_failed(namespace, pod["metadata"]["labels"]["job-name"],
                                 "BackoffLimitExceeded", "Job has reached the specified "
                                 "backoff limit")

    def read_pod_log(self, namespace: str, name: str, container: str) -> str:
        with self.lock:
            if (namespace, name) not in self.pods:
                raise NotFound(404, f"pods {name!r} not found")
            return self.logs.get(name, "")

    def list_workloads(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        with self.lock:
            return [copy.deepcopy(w) for (ns, _), w in self.workloads.items()
                    if ns == namespace and _matches(w, selector)]

    # -- what Kueue, the Job controller and the kubelet do ----------------------------------

    def _job(self, name: str, namespace: str = "jupyterhub") -> dict[str, Any]:
        return self.jobs[namespace, name]

    def _workload(self, job: dict[str, Any]) -> dict[str, Any]:
        uid = job["metadata"]["uid"]
        return next(w for w in self.workloads.values()
                    if w["metadata"]["labels"]["kueue.x-k8s.io/job-uid"] == uid)

    def admit(self, name: str, namespace: str = "jupyterhub", log: str = "") -> str:
        """Kueue admits the Job; its controller starts a pod (returns the pod's name)."""
        with self.lock:
            job = self._job(name, namespace)
            wl = self._workload(job)
            wl["status"]["conditions"] = [_cond("QuotaReserved", reason="QuotaReserved"),
                                          _cond("Admitted", reason="Admitted")]
            job["spec"]["suspend"] = False
            job["status"] = {"startTime": NOW, "active": 1}
            pod_name = f"{name}-{len(self.pods) + 1:05d}"
            template = job["spec"]["template"]
            labels = {**template["metadata"]["labels"], "job-name": name}
            pod = self.pods[namespace, pod_name] = {
                "metadata": {"name": pod_name, "labels": labels, "creationTimestamp": NOW},
                "spec": copy.deepcopy(template["spec"]),
                "status": {"phase": "Pending", "conditions": [], "containerStatuses": [
                    {"name": "notebook", "image": template["spec"]["containers"][0]["image"],
                     "ready": False, "started": False,
                     "state": {"waiting": {"reason": "ContainerCreating"}}}]},
            }
            self._kubelet(namespace, pod)
            self.logs[pod_name] = log
            return pod_name

    def _event(self, namespace: str, pod: dict[str, Any], kind: str, reason: str,
               message: str) -> None:
        tick = next(self._ticks)  # each event newer than the last
        stamp = f"2026-12-01T10:{tick // 60 % 60:02d}:{tick % 60:02d}Z"
        self.events.append({
            "metadata": {"name": f"{pod['metadata']['name']}.{len(self.events)}",
                         "namespace": namespace},
            "involvedObject": {"kind": "Pod", "name": pod["metadata"]["name"],
                               "namespace": namespace},
            "type": kind, "reason": reason, "message": message, "count": 1,
            "firstTimestamp": stamp, "lastTimestamp": stamp})

    def _kubelet(self, namespace: str, pod: dict[str, Any]) -> None:
        """One step of the scheduler and the kubelet for a Pending pod."""
        status = pod["status"]
        cs = status["containerStatuses"][0]
        if self.unschedulable:
            status["conditions"] = [_cond("PodScheduled", "False", "Unschedulable",
                                          self.unschedulable)]
            return
        status["conditions"] = [_cond("PodScheduled")]
        claims = [v["persistentVolumeClaim"]["claimName"] for v in pod["spec"]["volumes"]
                  if "persistentVolumeClaim" in v]
        held = next((c for c in claims if c in self.attached_elsewhere), None)
        if held is not None:
            cs["state"] = {"waiting": {"reason": "ContainerCreating"}}
            self._event(namespace, pod, "Warning", "FailedAttachVolume",
                        f'Multi-Attach error for volume "pvc-{held}" Volume is already used '
                        f"by pod(s) {self.attached_elsewhere[held]}")
            return
        image = cs["image"]
        if image in self.unpullable:
            was = (cs["state"].get("waiting") or {}).get("reason")
            if was == "ErrImagePull":  # the kubelet backs off, then pulls again
                cs["state"] = {"waiting": {"reason": "ImagePullBackOff",
                                           "message": f'Back-off pulling image "{image}"'}}
            else:
                cs["state"] = {"waiting": {"reason": "ErrImagePull",
                                           "message": self.unpullable[image]}}
                self._event(namespace, pod, "Normal", "Pulling", f'Pulling image "{image}"')
                self._event(namespace, pod, "Warning", "Failed", f'Failed to pull image '
                            f'"{image}": {self.unpullable[image]}')
            return
        name = pod["metadata"]["labels"]["job-name"]
        if name in self.config_errors:
            cs["state"] = {"waiting": {"reason": "CreateContainerConfigError",
                                       "message": self.config_errors[name]}}
            return
        status["phase"] = "Running"
        status["conditions"] = [_cond("PodScheduled"), _cond("Ready")]
        cs.update(ready=True, started=True, state={"running": {"startedAt": NOW}})

    def finish(self, name: str, exit_code: int, message: dict[str, Any] | None = None,
               reason: str = "", namespace: str = "jupyterhub") -> None:
        """The pod's container ends with ``exit_code`` and termination ``message``."""
        with self.lock:
            job = self._job(name, namespace)
            for pod in self.pods.values():
                if pod["metadata"]["labels"]["job-name"] != name:
                    continue
                pod["status"]["phase"] = "Succeeded" if exit_code == 0 else "Failed"
                pod["status"]["containerStatuses"][0]["state"] = {"terminated": {
                    "exitCode": exit_code, "reason": reason or ("Completed" if exit_code == 0
                                                                else "Error"),
                    "message": json.dumps(message) if message is not None else "",
                    "finishedAt": LATER}}
            if exit_code == 0:
                job["status"] = {"startTime": NOW, "completionTime": LATER, "succeeded": 1,
                                 "conditions": [_cond("SuccessCriteriaMet"),
                                                _cond("Complete")]}
            else:
                self._job_failed(namespace, name, "BackoffLimitExceeded",
                                 "Job has reached the specified backoff limit")

    def _job_failed(self, namespace: str, name: str, reason: str, message: str) -> None:
        job = self.jobs.get((namespace, name))
        if job is None:
            return
        job["status"] = {"startTime": job["status"].get("startTime"), "failed": 1,
                         "conditions": [_cond("FailureTarget", reason=reason, message=message),
                                        _cond("Failed", reason=reason, message=message)]}

    def pass_deadline(self, name: str, namespace: str = "jupyterhub") -> None:
        """``activeDeadlineSeconds`` passed: the pods are deleted, the Job fails."""
        with self.lock:
            for key, pod in list(self.pods.items()):
                if pod["metadata"]["labels"]["job-name"] == name:
                    del self.pods[key]
            self._job_failed(namespace, name, "DeadlineExceeded",
                             "Job was active longer than specified deadline")

    def evict(self, name: str, namespace: str = "jupyterhub") -> None:
        """Kueue preempts the workload to reclaim its ClusterQueue's quota in the cohort."""
        with self.lock:
            job = self._job(name, namespace)
            wl = self._workload(job)
            msg = "Preempted to accommodate a workload (UID: w-9) due to reclamation within " \
                  "the cohort"
            wl["status"]["conditions"] = [
                _cond("QuotaReserved", "False", "Pending", "evicted"),
                _cond("Evicted", reason="Preempted", message=msg),
                _cond("Preempted", reason="InCohortReclamation", message=msg)]
            job["spec"]["suspend"] = True
            job["status"] = {"conditions": [_cond("Suspended", reason="JobSuspended")]}
            for key, pod in list(self.pods.items()):
                if pod["metadata"]["labels"]["job-name"] == name:
                    del self.pods[key]

    # -- a kubelet that runs the container -----------------------------------------------

    def run(self, name: str, claims: dict[str, Path], scratch: Path,
            namespace: str = "jupyterhub", timeout: float = 240) -> dict[str, Any]:
        """Admit the Job and run its pod's container for real: the ConfigMap volume laid
        out under ``scratch``, each PersistentVolumeClaim of the pod at the local folder
        ``claims[claimName]``, which must be its ``mountPath`` (no bind mounts here: the
        test configures the home mount path as the claim's folder). The container's
        termination message ends the pod, as the kubelet reports it. Returns the message."""
        self.admit(name, namespace)
        with self.lock:
            spec = copy.deepcopy(self._job(name, namespace)["spec"]["template"]["spec"])
        container = spec["containers"][0]
        volumes = {v["name"]: v for v in spec["volumes"]}
        command = [sys.executable, *container["command"][1:]]
        for mount in container["volumeMounts"]:
            volume = volumes[mount["name"]]
            if "configMap" in volume:
                with self.lock:
                    cm = copy.deepcopy(self.configmaps[namespace, volume["configMap"]["name"]])
                where = scratch / f"{name}-{mount['name']}"
                where.mkdir(parents=True, exist_ok=True)
                for key, value in (cm.get("data") or {}).items():
                    (where / key).write_text(value)
                for key, value in (cm.get("binaryData") or {}).items():
                    (where / key).write_bytes(base64.b64decode(value))
                command = [str(where) if a == mount["mountPath"] else a for a in command]
            elif "persistentVolumeClaim" in volume:
                claim = volume["persistentVolumeClaim"]["claimName"]
                folder = claims[claim]  # a KeyError: the pod mounts someone else's volume
                assert os.path.realpath(mount["mountPath"]) == os.path.realpath(folder), (
                    f"claim {claim} is mounted at {mount['mountPath']}, not at {folder}")
        env = {e["name"]: e["value"] for e in container.get("env") or [] if "value" in e}
        term = scratch / f"{name}-termination-log"
        env.update(PATH=os.environ["PATH"], GPUSHARE_TERMINATION_LOG=str(term))
        os.makedirs(container["workingDir"], exist_ok=True)
        proc = subprocess.run(command, env=env, cwd=container["workingDir"],
                              capture_output=True, text=True, timeout=timeout)
        message = json.loads(term.read_text()) if term.exists() else None
        with self.lock:
            for (_, pod_name), pod in self.pods.items():
                if pod["metadata"]["labels"]["job-name"] == name:
                    self.logs[pod_name] = proc.stdout + proc.stderr
        self.finish(name, proc.returncode, message, namespace=namespace)
        return message or {"exit_code": proc.returncode, "log": proc.stdout + proc.stderr}


class FakeClusterBackend(KubeJobsBackend):
    """The Kubernetes backend of a real broker, talking to the FakeKube that a test puts in
    ``FakeClusterBackend.clusters["fake"]`` (the broker builds its backend from the class,
    so the stand-in is handed over through the class). A subclass may set ``overrides``:
    backend attributes to set after it is built."""

    clusters: ClassVar[dict[str, FakeKube]] = {}
    overrides: ClassVar[dict[str, Any]] = {}

    @classmethod
    def create(cls, settings: Any) -> KubeJobsBackend:
        backend = super().create(settings)
        backend.client = cls.clusters["fake"]
        backend.poll_min_interval_s = 0.05
        for name, value in cls.overrides.items():
            setattr(backend, name, value)
        return backend


JOBS_POLICY = Path(__file__).resolve().parent / "data" / "jobs_policy.yaml"


async def start_broker_on(
    fake: FakeKube,
    tmp_path: Path,
    backend_class: type[FakeClusterBackend] = FakeClusterBackend,
    teams: dict[str, list[str]] | None = None,
    config: Any = None,
) -> Any:
    """A real in-process broker (tests/brokerkit.py) whose batch jobs run as Kubernetes Jobs
    on ``fake``, polled every 0.05 s, users' files under ``tmp_path/home/<user>``."""
    from brokerkit import start_broker, static_tokens
    from traitlets.config import Config

    from jupyter_gpushare.policy import load_policy

    FakeClusterBackend.clusters["fake"] = fake
    config = config if config is not None else Config()
    config.JobManager.backend_class = backend_class
    config.JobManager.user_root_template = str(tmp_path / "home" / "{username}")
    config.JobManager.poll_interval_s = 0.05
    return await start_broker(load_policy(str(JOBS_POLICY)), f"sqlite:///{tmp_path}/jobs.sqlite",
                              static_tokens(teams or {"alice": ["vision"]}), config=config)
