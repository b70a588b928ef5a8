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
from typing import IO, Any

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


class WarmStandby:
    """The standby's part of ``BrokerApp`` (a mixin: ``build``, ``engine``, ``carry`` and
    ``policy_file`` are the app's)."""

    # the policy file's stamp when a warm standby built the service ahead
    _built_from: FileStamp | None = None
    policy_file: str
    engine: Any
    carry: Any

    def build(self) -> Any:  # pragma: no cover - the app's
        raise NotImplementedError

    def prepare_standby(self) -> None:
        """What a warm standby does before it is needed, and again every ``REFRESH_S`` while
        it waits: build the service from the policy file as it is now, read the database's
        schema version (nothing written) and what the serving broker carries over
        (:mod:`.carry`), so that taking over loads only the state. A file changed since is
        read again at the start, as always."""
        if getattr(self, "engine", None) is not None:
            self.engine.dispose()
        stamp = file_stamp(self.policy_file) if self.policy_file else None
        try:
            self.build()
            schema_at_head(self.engine)
            if self.carry is not None:
                self.carry.read()
        except (Exception, SystemExit):  # noqa: BLE001 - the start reports it, not the standby
            self._built_from = None
            return
        self._built_from = stamp

    def _built_ahead(self) -> bool:
        """Whether a standby built the service from the policy file as it still is."""
        built, self._built_from = self._built_from, None
        return built is not None and built == file_stamp(self.policy_file)


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
