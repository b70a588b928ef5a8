"""The Slurm backend's files in an attempt's folder on the shared filesystem: the job's log
made and handed to the user, the snapshot, spec and batch script written whole, and the
runner's ``status.json`` read back, all through :mod:`~jupyter_gpushare.userfiles` (never
through a link, with a size bound)."""

from __future__ import annotations

import json
import os
from typing import Any

from ..userfiles import Folder, UnsafeFile
from .jobfolder import LOG

STATUS_MAX_BYTES = 4 << 20
"""The most of a runner's ``status.json`` the broker reads (a larger one is refused)."""
ID_MAX_BYTES = 64


def _attempt_name(attempt: int) -> str:
    return f"attempt-{int(attempt)}"


def _hand_over(fd: int, owner: tuple[int, int] | None) -> None:
    """``fchown`` an opened file or folder to ``owner`` when it is not theirs yet."""
    if owner is None:
        return
    st = os.fstat(fd)
    if (st.st_uid, st.st_gid) != owner:
        os.fchown(fd, *owner)


def prepare_log(jdir: Folder, owner: tuple[int, int] | None) -> None:
    """Make the job's log (never through a link) and hand it to the job's user: Slurm
    opens ``--output`` as the user, who cannot create a file in the root-owned job folder."""
    fd = jdir.open(LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        _hand_over(fd, owner)
    finally:
        os.close(fd)


def write_file(folder: Folder, name: str, data: bytes, mode: int = 0o644) -> None:
    """Write ``name`` whole in ``folder`` (never through a link) with ``mode`` whatever the
    umask (the job's user must read its snapshot, spec and batch script)."""
    folder.write_atomic(name, data, mode=mode)
    fd = folder.open(name)
    try:
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def read_status(folder: Folder) -> dict[str, Any] | None:
    """The runner's ``status.json`` in the attempt folder (None while it runs), read
    without following a link and at most :data:`STATUS_MAX_BYTES`; unreadable or not a
    JSON object reads as ``{}`` (the attempt failed); a link raises :class:`UnsafeFile`."""
    if not folder.exists("status.json"):
        return None
    try:
        data = json.loads(folder.read("status.json", STATUS_MAX_BYTES))
    except UnsafeFile:
        raise
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
