"""The logs of a Kubernetes batch job's attempts: read from their pods (at most every
``poll_min_interval_s``), kept in a bounded cache once a pod ended or before it is deleted,
so a job's log stays readable while the broker runs.

:class:`KubeLogs` is held by :class:`~.kube.KubeJobsBackend` (``backend.logs``); it is handed
the way to the API client and the settings it uses, and owns the logs it keeps.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from .base import RunHandle
from .kube_client import KubeClient, NotFound
from .kube_objects import ATTEMPT_LABEL, CONTAINER, job_selector


class KubeLogs:
    """Every attempt's log, from the pods or the cache."""

    def __init__(
        self,
        api: Callable[[], KubeClient],
        *,
        namespace: str,
        poll_min_interval_s: float,
        log_cache_bytes: int,
        log_cache_attempts: int,
        log: logging.Logger | logging.LoggerAdapter[Any],
    ) -> None:
        self.get_api = api  # the API client (made at its first use)
        self.namespace = namespace
        self.poll_min_interval_s = poll_min_interval_s
        self.log_cache_bytes = log_cache_bytes
        self.log_cache_attempts = log_cache_attempts
        self.log = log
        self._logs: OrderedDict[tuple[str, int], bytes] = OrderedDict()  # ended or kept
        self._log_reads: OrderedDict[str, tuple[float, list[tuple[int, bytes]]]] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def api(self) -> KubeClient:
        return self.get_api()

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
                text = self.api.read_pod_log(
                    self.namespace, str(pod["metadata"]["name"]), CONTAINER
                ).encode()
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

    def fresh(self, job_id: str) -> None:
        """The next log read asks the API server again (after a stop)."""
        with self._lock:
            self._log_reads.pop(job_id, None)

    def forget(self, job_id: str) -> None:
        """Nothing kept of the job's logs."""
        with self._lock:
            for key in [k for k in self._logs if k[0] == job_id]:
                del self._logs[key]
            self._log_reads.pop(job_id, None)

    def keep(self, handle: RunHandle) -> None:
        """Read the attempt's log before its pod is deleted."""
        try:
            self._read_logs(handle.job_id)
        except Exception as exc:  # noqa: BLE001 - the stop matters more than the log
            self.log.warning("gpushare: could not keep the log of %s: %s", handle.job_id, exc)

    def read_log(self, job_id: str, offset: int = 0, max_bytes: int = 65536) -> tuple[bytes, int]:
        data = b"".join(d for _, d in self._attempt_logs(job_id))
        start = max(0, offset)
        chunk = data[start : start + max_bytes]
        return chunk, start + len(chunk)

    def log_size(self, job_id: str) -> int:
        return sum(len(d) for _, d in self._attempt_logs(job_id))
