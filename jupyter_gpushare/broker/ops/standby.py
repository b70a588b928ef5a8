"""What a warm standby does before it is needed (:mod:`.supervisor` starts it).

The standby has imported everything. It also builds the service ahead from the policy file
as it is (:meth:`BrokerApp.prepare_standby`), again every ``REFRESH_S`` while it waits (the
discovered nodes stay that fresh), so that taking over after a broker died loads only the
state. What it built is used only while the policy file is the one it read (same device,
inode, size and modification time); otherwise the start builds again, as any start does.
"""

from __future__ import annotations

import os
import select
import time
from collections.abc import Callable
from typing import IO

REFRESH_S = 30.0  # how stale a service built ahead (and its discovered nodes) may be

FileStamp = tuple[int, int, int, int]


def file_stamp(path: str) -> FileStamp | None:
    """What tells one version of a file from another (None: it cannot be read)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def wait_for_go(stream: IO[bytes], refresh: Callable[[], None]) -> bool:
    """Until the supervisor writes a byte on ``stream`` (True: take over) or closes it
    (False: leave); ``refresh`` every ``REFRESH_S`` meanwhile."""
    while True:
        ready, _, _ = select.select([stream], [], [], REFRESH_S)
        if ready:
            return bool(os.read(stream.fileno(), 1))
        refresh()


class StartClock:
    """How long each step of a broker's start took (the ``listening`` log line says it: what
    a takeover after a crash costs, step by step)."""

    def __init__(self) -> None:
        self.began = self._last = time.monotonic()
        self.steps: list[tuple[str, float]] = []

    def mark(self, step: str) -> None:
        now = time.monotonic()
        self.steps.append((step, now - self._last))
        self._last = now

    def text(self) -> str:
        parts = ", ".join(f"{step} {1000 * took:.0f} ms" for step, took in self.steps)
        return f"ready {1000 * (self._last - self.began):.0f} ms after the start: {parts}"
