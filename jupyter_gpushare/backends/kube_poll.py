"""Polling a Kubernetes batch job's attempt: its Job, Kueue's Workload and its pods read as
a :class:`~.base.RunStatus` (queued in Kueue, waiting for its pod, running, ended,
preempted on the cluster; the mapping is in :mod:`.kube`'s docstring), each live answer
reused for ``poll_min_interval_s``.

:class:`KubePoller` is held by :class:`~.kube.KubeJobsBackend` (``backend.poller``); it is
handed the way to the API client and the settings it uses, and owns the answers it reuses and
the waits of pods it has seen.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from .base import RunHandle, RunStatus
from .kube_client import KubeClient, KubeError
from .kube_objects import CONTAINER, attempt_selector, object_name
from .kube_status import condition, disrupted, terminated_state, timestamp
from .kube_waiting import WaitTracker, needs_events, pod_wait, terminal


class KubePoller:
    """An attempt's state from the API server, each live answer reused for a while."""

    def __init__(
        self,
        api: Callable[[], KubeClient],
        *,
        namespace: str,
        poll_min_interval_s: float,
        image_pull_timeout_s: float,
        log: logging.Logger | logging.LoggerAdapter[Any],
    ) -> None:
        self.get_api = api  # the API client (made at its first use)
        self.namespace = namespace
        self.poll_min_interval_s = poll_min_interval_s
        self.image_pull_timeout_s = image_pull_timeout_s
        self.log = log
        self._polled: dict[tuple[str, int], tuple[float, RunStatus]] = {}
        self._waits = WaitTracker()
        self._lock = threading.Lock()

    @property
    def api(self) -> KubeClient:
        return self.get_api()

    def ns_name(self, handle: RunHandle) -> tuple[str, str]:
        return (
            str(handle.ref.get("namespace") or self.namespace),
            str(handle.ref.get("name") or object_name(handle.job_id, handle.attempt)),
        )

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

    def fresh(self, handle: RunHandle) -> None:
        """The next poll asks the API server again (after a stop)."""
        with self._lock:
            self._polled.pop((handle.job_id, handle.attempt), None)
            self._waits.clear((handle.job_id, handle.attempt))

    def forget(self, job_id: str) -> None:
        """Nothing kept of the job's attempts."""
        with self._lock:
            for key in [k for k in self._polled if k[0] == job_id]:
                del self._polled[key]
            self._waits.forget(job_id)

    def _poll_now(self, handle: RunHandle) -> RunStatus:
        ns, name = self.ns_name(handle)
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
            return RunStatus(
                alive=False,
                finished=True,
                exit_code=None,
                preempted=True,
                terminated=True,
                started_at=started_at,
                error={"summary": f"preempted on the cluster: {evicted}"},
                reason=f"preempted on the cluster: {evicted}",
            )
        if (job.get("spec") or {}).get("suspend"):
            return RunStatus(alive=True, queued=True, reason=self._pending_reason(ns, uid))
        return self._started(handle, ns, name, pods or [], started_at)

    def _started(
        self,
        handle: RunHandle,
        ns: str,
        name: str,
        pods: list[dict[str, Any]],
        started_at: float | None,
    ) -> RunStatus:
        """A Job Kueue let run: alive, or ``queued`` while its pod waits (saying why), or
        failed where waiting cannot help (:func:`.kube_waiting.terminal`)."""
        key = (handle.job_id, handle.attempt)
        pods.sort(key=lambda p: str((p.get("metadata") or {}).get("creationTimestamp") or ""))
        if not pods:
            return RunStatus(
                alive=True, queued=True, reason="waiting: the Job's pod is being created"
            )
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
        return RunStatus(
            alive=False,
            finished=True,
            exit_code=None,
            started_at=started_at,
            error={"summary": failed},
            reason=wait.code,
        )

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
            cond = next(
                (
                    c
                    for c in (wl.get("status") or {}).get("conditions") or []
                    if c.get("type") == "QuotaReserved"
                ),
                None,
            )
            if cond and cond.get("status") != "True":
                return f"waiting for Kueue: {cond.get('message') or cond.get('reason')}"
        return "waiting for Kueue to admit the Job"

    def _ended(
        self,
        handle: RunHandle,
        ns: str,
        complete: dict[str, Any] | None,
        failed: dict[str, Any] | None,
        started_at: float | None,
        status: Mapping[str, Any],
    ) -> RunStatus:
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
            (term or {}).get("finishedAt")
        )
        output = message.get("output_path") or handle.ref.get("output_path")
        common = dict(
            alive=False,
            finished=True,
            started_at=started_at,
            ended_at=ended_at,
            output_path=output,
            terminated=bool(message.get("terminated")),
        )
        if complete:
            return RunStatus(exit_code=0, error=None, **common)  # type: ignore[arg-type]
        assert failed is not None
        reason = str(failed.get("reason") or "")
        code = term.get("exitCode") if term else message.get("exit_code")
        error = message.get("error")
        taken = next((r for r in map(disrupted, pods) if r), None)
        if taken:
            return RunStatus(
                exit_code=None,
                preempted=True,
                reason=taken,
                error={"summary": f"preempted on the cluster: {taken}"},
                **{**common, "terminated": True},  # type: ignore[arg-type]
            )
        if reason == "DeadlineExceeded":
            summary = (
                "stopped: over its maximum runtime (activeDeadlineSeconds "
                f"{failed.get('message') or ''})"
            ).replace(" )", ")")
            return RunStatus(
                exit_code=code if isinstance(code, int) and code else 1,
                error={"summary": summary},
                reason=reason,
                **common,  # type: ignore[arg-type]
            )
        if term and term.get("reason") == "OOMKilled" and not error:
            error = {
                "summary": "out of memory: the job went over its pod's memory limit "
                "and was killed (OOMKilled)"
            }
        if not error:
            if term is None:
                summary = (
                    f"the job's pod ended without a result ({reason or 'Failed'}: "
                    f"{failed.get('message') or 'the pod is gone'})"
                )
            else:
                summary = f"failed (exit code {code}; {term.get('reason') or reason})"
            error = {"summary": summary}
        return RunStatus(
            exit_code=int(code) if isinstance(code, int) else None,
            error=error,
            reason=reason,
            **common,  # type: ignore[arg-type]
        )
