"""What a warm standby does before it is needed (:mod:`.supervisor` starts it).

The standby has imported everything. It also builds the service ahead from the policy file
as it is (:meth:`AheadBuild.prepare`), again every ``REFRESH_S`` while it waits (the
discovered nodes stay that fresh), so that taking over after a broker died loads only the
state. What it built is used only while the policy file is the one it read (same device,
inode, size and modification time); otherwise the start builds again, as any start does.
"""

from __future__ import annotations

import os
import select
import time
from collections.abc import Callable
from typing import IO, Any, Protocol

from ..store.migrate import schema_at_head

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


class StandbyParts(Protocol):
    """What :class:`AheadBuild` uses of the broker app it prepares."""

    policy_file: str
    engine: Any
    carry: Any

    def build(self) -> Any: ...


class AheadBuild:
    """What a warm standby built ahead: held by ``BrokerApp`` (``app.ahead``), prepared by
    the standby (``broker/__main__.py``) and used by the start."""

    def __init__(self) -> None:
        self._from: FileStamp | None = None  # the policy file's stamp when it built

    def prepare(self, app: StandbyParts) -> None:
        """What a warm standby does before it is needed, and again every ``REFRESH_S`` while
        it waits: build the service from the policy file as it is now, read the database's
        schema version (nothing written) and what the serving broker carries over
        (:mod:`.carry`), so that taking over loads only the state. A file changed since is
        read again at the start, as always."""
        if getattr(app, "engine", None) is not None:
            app.engine.dispose()
        stamp = file_stamp(app.policy_file) if app.policy_file else None
        try:
            app.build()
            schema_at_head(app.engine)
            if app.carry is not None:
                app.carry.read()
        except (Exception, SystemExit):  # noqa: BLE001 - the start reports it, not the standby
            self._from = None
            return
        self._from = stamp

    def used(self, policy_file: str) -> bool:
        """Whether a standby built the service from ``policy_file`` as it still is (asked
        once, by the start: what was built ahead is used at most once)."""
        built, self._from = self._from, None
        return built is not None and built == file_stamp(policy_file)


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
