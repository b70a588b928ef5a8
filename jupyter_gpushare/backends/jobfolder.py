"""The job folder that the local and the Slurm backends share (a filesystem the broker and
the job both see)::

    <jobs_dir>/<job id>/log.txt            every attempt's output, appended
    <jobs_dir>/<job id>/checkpoint/        $GPUSHARE_CHECKPOINT_DIR, kept across attempts
    <jobs_dir>/<job id>/attempt-<n>/       the runner's files: output.ipynb, status.json, ...
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from .base import RunHandle


class JobFolder:
    """Paths, log, output and clean-up of the job folder (a mixin before JobBackend)."""

    jobs_dir: Any  # a path, or the traitlet that holds one

    def job_dir(self, job_id: str) -> Path:
        if not job_id or "/" in job_id or job_id.startswith("."):
            raise ValueError(f"bad job id {job_id!r}")
        return Path(self.jobs_dir) / job_id

    def attempt_dir(self, job_id: str, attempt: int) -> Path:
        return self.job_dir(job_id) / f"attempt-{int(attempt)}"

    def checkpoint_dir(self, job_id: str) -> str:
        return str(self.job_dir(job_id) / "checkpoint")

    def log_size(self, job_id: str) -> int:
        try:
            return (self.job_dir(job_id) / "log.txt").stat().st_size
        except OSError:
            return 0

    def read_log(self, job_id: str, offset: int = 0, max_bytes: int = 65536) -> tuple[bytes, int]:
        try:
            with open(self.job_dir(job_id) / "log.txt", "rb") as f:
                f.seek(max(0, offset))
                data = f.read(max_bytes)
        except OSError:
            return b"", offset
        return data, max(0, offset) + len(data)

    def fetch_output(self, handle: RunHandle) -> bytes | None:
        try:
            return (self.attempt_dir(handle.job_id, handle.attempt) / "output.ipynb").read_bytes()
        except OSError:
            return None

    def forget(self, job_id: str) -> None:
        shutil.rmtree(self.job_dir(job_id), ignore_errors=True)
