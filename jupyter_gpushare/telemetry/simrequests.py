"""What a kernel asks the simulated GPUs to show for it: one small file per process.

A notebook calls :func:`jupyter_gpushare.simgpu.use_gpu_memory` (or ``use_gpu_compute``);
that writes ``<pid>.json`` (``{"memory_mib", "compute_pct", "gpu", "started"}``) into
:func:`requests_dir`. The server's :class:`~.simulated.SimulatedSampler` reads, at each
sample, the files of *its own* kernels only (by pid), so the status bar, the panel, the
watchdog and the limit see that kernel "use" that much of a simulated GPU. Where there is no
simulated sampler (a real GPU) nothing reads them.

Bounded and per kernel: one file per process, at most :data:`MAX_FILE_BYTES`; memory is
clamped to the card's memory, compute to 0..100 % of the card; a file is read only if it is a
regular file (no link followed) owned by the server's own user and written by that very
process (``started`` equals the process's start time, so a reused pid is not fooled). A
kernel that dies or restarts leaves the server's kernel list: the sampler deletes its file
(a restarted kernel starts at zero, as a real one frees its GPU memory), and the kernel
deletes its own file when it exits.

Pure of Jupyter: the folder is ``$GPUSHARE_SIMGPU_DIR``, else ``gpushare-simgpu`` in
Jupyter's runtime folder, which the kernel inherits from the server that started it.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ENV_DIR = "GPUSHARE_SIMGPU_DIR"
FOLDER_NAME = "gpushare-simgpu"
MAX_FILE_BYTES = 4096


@dataclass(frozen=True)
class SimRequest:
    """What one process asks to show on a simulated GPU."""

    pid: int
    memory_mib: float = 0.0
    compute_pct: float = 0.0
    gpu: int = 0  # index among the server's simulated GPUs
    started: float | None = None  # the process's start time (epoch s), against pid reuse

    def to_json(self) -> str:
        return json.dumps({"memory_mib": self.memory_mib, "compute_pct": self.compute_pct,
                           "gpu": self.gpu, "started": self.started})


def requests_dir() -> Path:
    """``$GPUSHARE_SIMGPU_DIR``, else ``<jupyter runtime dir>/gpushare-simgpu``."""
    explicit = os.environ.get(ENV_DIR)
    if explicit:
        return Path(explicit)
    from jupyter_core.paths import jupyter_runtime_dir

    return Path(jupyter_runtime_dir()) / FOLDER_NAME


def process_started(pid: int) -> float | None:
    """The start time of process ``pid`` (epoch seconds), None if it is gone."""
    import psutil

    try:
        return float(psutil.Process(pid).create_time())
    except psutil.Error:
        return None


def write_request(req: SimRequest, folder: Path | None = None) -> Path:
    """Write ``req`` as ``<pid>.json`` atomically (mode 0600, folder 0700)."""
    folder = folder or requests_dir()
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, tmp = tempfile.mkstemp(prefix=f".{req.pid}-", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "w") as out:
            out.write(req.to_json())
        path = folder / f"{req.pid}.json"
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def remove_request(pid: int, folder: Path | None = None) -> None:
    with contextlib.suppress(OSError):
        os.unlink((folder or requests_dir()) / f"{pid}.json")


def _number(value: Any, lo: float, hi: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        return 0.0
    return float(min(hi, max(lo, value)))


def _read_bounded(path: Path) -> bytes | None:
    """The file's bytes if it is a regular file of this user, within the bound."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            return None
        data = f.read(MAX_FILE_BYTES + 1)
    return data if len(data) <= MAX_FILE_BYTES else None


def read_request(pid: int, memory_total_mib: float, gpus: int,
                 folder: Path | None = None) -> SimRequest | None:
    """Process ``pid``'s request, bounded (None: none, unreadable, or not this process's)."""
    data = _read_bounded((folder or requests_dir()) / f"{pid}.json")
    if data is None:
        return None
    try:
        doc = json.loads(data)
    except ValueError:
        return None
    if not isinstance(doc, dict):
        return None
    started = doc.get("started")
    now_started = process_started(pid)
    if now_started is None or not isinstance(started, (int, float)) or \
            abs(float(started) - now_started) > 1.0:
        return None  # written by an earlier process of the same pid
    gpu = doc.get("gpu")
    return SimRequest(
        pid=pid,
        memory_mib=_number(doc.get("memory_mib"), 0.0, memory_total_mib),
        compute_pct=_number(doc.get("compute_pct"), 0.0, 100.0),
        gpu=gpu if isinstance(gpu, int) and not isinstance(gpu, bool) and 0 <= gpu < gpus else 0,
        started=float(started),
    )
