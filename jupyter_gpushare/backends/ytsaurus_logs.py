"""The log of a YTsaurus job, for the YTsaurus backend: every attempt's operation (recorded
in its Cypress node) in order, and the stderr of its jobs (``get_job_stderr``), kept once
the operation finished.

A mixin of :class:`~.ytsaurus.YTsaurusBackend`, whose settings, client and caches it uses.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from . import ytsaurus_spec as ys
from .base import RunStatus


class YTsaurusLogs:
    """Every attempt's stderr, in order (mixed into the YTsaurus backend)."""

    log: logging.Logger | logging.LoggerAdapter[Any]
    _finished: OrderedDict[str, RunStatus]
    _stderr: OrderedDict[str, bytes]

    if TYPE_CHECKING:

        @property
        def client(self) -> Any: ...

        @property
        def settings(self) -> ys.YtSettings: ...

        def _cache(self, cache: OrderedDict[str, Any], key: str, value: Any) -> None: ...

        def _recorded_operation(self, paths: ys.AttemptPaths) -> str | None: ...

    def _operations(self, job_id: str) -> list[str]:
        """The operation of every attempt of ``job_id``, in attempt order."""
        base = ys.job_dir(self.settings, job_id)
        try:
            names = [str(n) for n in self.client.list(base)]
        except Exception:  # noqa: BLE001 - no attempt yet
            return []
        attempts = sorted(
            int(n.split("-", 1)[1])
            for n in names
            if n.startswith("attempt-") and n.split("-", 1)[1].isdigit()
        )
        out = []
        for n in attempts:
            op_id = self._recorded_operation(ys.attempt_paths(self.settings, job_id, n))
            if op_id:
                out.append(op_id)
        return out

    def _op_stderr(self, op_id: str) -> bytes:
        cached = self._stderr.get(op_id)
        if cached is not None:
            return cached
        data = b""
        try:
            found = self.client.list_jobs(op_id)
            jobs = found.get("jobs") if isinstance(found, dict) else found
            for job in jobs or []:
                stderr = self.client.get_job_stderr(op_id, str(job["id"]))
                data += stderr.read() if hasattr(stderr, "read") else bytes(stderr)
        except Exception as exc:  # noqa: BLE001 - a job without stderr (yet)
            self.log.debug("YTsaurus: no stderr of %s: %s", op_id, exc)
            return data
        if op_id in self._finished:  # it no longer changes
            self._cache(self._stderr, op_id, data)
        return data

    def _log(self, job_id: str) -> bytes:
        return b"".join(self._op_stderr(op_id) for op_id in self._operations(job_id))

    def log_size(self, job_id: str) -> int:
        return len(self._log(job_id))

    def read_log(self, job_id: str, offset: int = 0, max_bytes: int = 65536) -> tuple[bytes, int]:
        data = self._log(job_id)[max(0, offset) : max(0, offset) + max_bytes]
        return data, max(0, offset) + len(data)
