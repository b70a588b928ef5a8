"""The log of a YTsaurus job, for the YTsaurus backend: every attempt's operation (recorded
in its Cypress node) in order, and the stderr of its jobs (``get_job_stderr``), kept once
the operation finished.

:class:`YTsaurusLogs` is held by :class:`~.ytsaurus.YTsaurusBackend` (``backend.logs``); it
is handed the ways to the client, the settings, an attempt's recorded operation and whether an
operation finished, and keeps the stderr of finished operations.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from . import ytsaurus_spec as ys


class YTsaurusLogs:
    """Every attempt's stderr, in order."""

    def __init__(
        self,
        client: Callable[[], Any],
        settings: Callable[[], ys.YtSettings],
        recorded_operation: Callable[[ys.AttemptPaths], str | None],
        finished: Callable[[str], bool],
        keep: Callable[[OrderedDict[str, Any], str, Any], None],
        log: logging.Logger | logging.LoggerAdapter[Any],
    ) -> None:
        self.get_client = client  # the yt.wrapper client (made at its first use)
        self.get_settings = settings
        self.recorded_operation = recorded_operation  # an attempt's operation id, if recorded
        self.finished = finished  # whether an operation finished (its stderr no longer changes)
        self.keep = keep  # into a bounded cache
        self.log = log
        self._stderr: OrderedDict[str, bytes] = OrderedDict()  # finished op id -> its stderr

    @property
    def client(self) -> Any:
        return self.get_client()

    @property
    def settings(self) -> ys.YtSettings:
        return self.get_settings()

    def operations(self, job_id: str) -> list[str]:
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
            op_id = self.recorded_operation(ys.attempt_paths(self.settings, job_id, n))
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
        if self.finished(op_id):  # it no longer changes
            self.keep(self._stderr, op_id, data)
        return data

    def _log(self, job_id: str) -> bytes:
        return b"".join(self._op_stderr(op_id) for op_id in self.operations(job_id))

    def forget(self, op_id: str) -> None:
        """The operation's stderr is no longer kept."""
        self._stderr.pop(op_id, None)

    def log_size(self, job_id: str) -> int:
        return len(self._log(job_id))

    def read_log(self, job_id: str, offset: int = 0, max_bytes: int = 65536) -> tuple[bytes, int]:
        data = self._log(job_id)[max(0, offset) : max(0, offset) + max_bytes]
        return data, max(0, offset) + len(data)
