"""The job folder that the local and the Slurm backends share (a filesystem the broker and
the job both see)::

    <jobs_dir>/<job id>/log.txt            every attempt's output, appended
    <jobs_dir>/<job id>/checkpoint/        $GPUSHARE_CHECKPOINT_DIR, kept across attempts
    <jobs_dir>/<job id>/attempt-<n>/       the runner's files: output.ipynb, status.json, ...

The job's user may write in its checkpoint and attempt folders, so every file below
``jobs_dir`` is reached through :mod:`~jupyter_gpushare.userfiles` (no link followed, at
each use): a log or output replaced by a link is refused with the reason, never served.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import IO, Any

from ..userfiles import Folder, UnsafeFile, read_at
from .base import RunHandle

LOG = "log.txt"
OUTPUT = "output.ipynb"


class JobFolder:
    """Paths, log, output and clean-up of the job folder (a mixin before JobBackend)."""

    jobs_dir: Any  # a path, or the traitlet that holds one
    sizes_are_cheap = True  # a stat of the job folder's files

    def job_dir(self, job_id: str) -> Path:
        if not job_id or "/" in job_id or job_id.startswith(".") or "\0" in job_id:
            raise ValueError(f"bad job id {job_id!r}")
        return Path(self.jobs_dir) / job_id

    def attempt_dir(self, job_id: str, attempt: int) -> Path:
        return self.job_dir(job_id) / f"attempt-{int(attempt)}"

    def checkpoint_dir(self, job_id: str) -> str:
        return str(self.job_dir(job_id) / "checkpoint")

    def job_folder(self, job_id: str, *rel: str) -> Folder:
        """The job's folder (or ``rel`` in it), opened without following a link."""
        self.job_dir(job_id)  # checks the id
        with Folder.root(str(self.jobs_dir)) as top:
            return top.sub("/".join((job_id, *rel)))

    def open_log(self, job_id: str) -> int:
        """A descriptor of the job's log (refused when it is a link)."""
        with self.job_folder(job_id) as folder:
            return folder.open(LOG)

    def log_size(self, job_id: str) -> int:
        try:
            fd = self.open_log(job_id)
        except OSError:
            return 0
        try:
            return os.fstat(fd).st_size
        finally:
            os.close(fd)

    def read_log(self, job_id: str, offset: int = 0, max_bytes: int = 65536) -> tuple[bytes, int]:
        """Bytes of the log from ``offset``; a log that is a link raises :class:`UnsafeFile`
        (the handler says why); a missing one reads as empty."""
        try:
            fd = self.open_log(job_id)
        except UnsafeFile:
            raise
        except OSError:
            return b"", offset
        try:
            data = read_at(fd, max(0, offset), max_bytes)
        finally:
            os.close(fd)
        return data, max(0, offset) + len(data)

    def open_output(self, handle: RunHandle) -> IO[bytes] | None:
        """The attempt's executed notebook as an open file (read it in chunks); None when
        there is none; :class:`UnsafeFile` when it is a link or not a regular file."""
        try:
            with self.job_folder(handle.job_id, f"attempt-{int(handle.attempt)}") as folder:
                fd = folder.open(OUTPUT)
        except UnsafeFile:
            raise
        except OSError:
            return None
        return os.fdopen(fd, "rb")

    def output_size(self, handle: RunHandle) -> int | None:
        try:
            f = self.open_output(handle)
        except OSError:
            return None
        if f is None:
            return None
        with f:
            return os.fstat(f.fileno()).st_size

    def fetch_output(self, handle: RunHandle) -> bytes | None:
        f = self.open_output(handle)
        if f is None:
            return None
        with f:
            return f.read()

    def trim(self, handle: RunHandle, max_log_bytes: int, max_output_bytes: int) -> None:
        """After a run was stopped over a bound: cut its log to ``max_log_bytes`` and remove
        an executed notebook over ``max_output_bytes`` from the attempt folder."""
        with self.job_folder(handle.job_id) as folder:
            if max_log_bytes > 0:
                fd = folder.open(LOG, os.O_WRONLY)
                try:
                    if os.fstat(fd).st_size > max_log_bytes:
                        os.ftruncate(fd, max_log_bytes)
                        os.pwrite(fd, b"\n--- log cut at JobManager.max_log_bytes ---\n",
                                  max_log_bytes)
                finally:
                    os.close(fd)
            if max_output_bytes > 0:
                with folder.child(f"attempt-{int(handle.attempt)}") as attempt:
                    st = attempt.stat(OUTPUT)
                    if st is not None and st.st_size > max_output_bytes:
                        attempt.unlink(OUTPUT)

    def forget(self, job_id: str) -> None:
        # rmtree works through descriptors here (no link below the job folder is followed)
        shutil.rmtree(self.job_dir(job_id), ignore_errors=True)
