"""Free TCP ports for the processes the tests and benchmarks start, unique across the run.

``bind(("127.0.0.1", 0))`` answers a port from the kernel's ephemeral range and forgets it as
soon as the probing socket closes. Under ``pytest -n`` two workers can be handed the same port
before either process binds it, and any outgoing connection may take it meanwhile: CI once
saw a soak's proxy API port answered by another test's MariaDB.

So a port here is:

- drawn from *below* the ephemeral range (``net.ipv4.ip_local_port_range``), where the kernel
  never hands out ports on its own (outgoing connections, ``bind(0)`` in JupyterHub or Slurm);
- claimed with a marker file created with ``O_EXCL`` in a directory shared by every worker of
  this user, so no other caller gets it for ``CLAIM_S`` seconds, long enough to cover a process
  that is killed and started again on the same port;
- free when drawn (a probing bind succeeds).

Importable without pytest: the soak and the benchmarks use it too.
"""

from __future__ import annotations

import contextlib
import os
import random
import socket
import tempfile
import time
from pathlib import Path

CLAIM_S = 4 * 3600.0
LOWEST = 15000
FALLBACK_EPHEMERAL_LOW = 32768
TRIES = 500


def ephemeral_low() -> int:
    """The lowest port the kernel may pick on its own."""
    try:
        text = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text()
        return int(text.split()[0])
    except (OSError, ValueError, IndexError):
        return FALLBACK_EPHEMERAL_LOW


def claims_dir() -> Path:
    path = Path(tempfile.gettempdir()) / f"gpushare-test-ports-{os.getuid()}"
    path.mkdir(mode=0o700, exist_ok=True)
    return path


def _claim(directory: Path, port: int, now: float) -> bool:
    """Create the port's marker; a marker older than ``CLAIM_S`` is taken over."""
    marker = directory / str(port)
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        with contextlib.suppress(OSError):
            if now - marker.stat().st_mtime > CLAIM_S:
                marker.unlink()
                return _claim(directory, port, now)
        return False
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)
    return True


def _bindable(host: str, port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def port_range() -> tuple[int, int]:
    """The ports drawn from (both ends included): from ``LOWEST`` to just below the ephemeral
    range, at least a thousand."""
    high = ephemeral_low() - 1
    return min(LOWEST, high - 1000), high


def free_port(host: str = "127.0.0.1") -> int:
    """A port below the ephemeral range that no other caller of this run holds, free now."""
    directory = claims_dir()
    low, high = port_range()
    draw = random.SystemRandom()
    for _ in range(TRIES):
        port = draw.randint(low, high)
        if _claim(directory, port, time.time()) and _bindable(host, port):
            return port
    raise RuntimeError(f"no free port in {low}-{high} after {TRIES} tries "
                       f"(claims in {directory})")
