"""The broker's life next to its hub: the pid file, taking the port over from a stale broker,
lingering through the hub's shutdown, and when to stop.

The supervisor (:mod:`.supervisor`) starts the broker with ``$GPUSHARE_HUB_PID`` and
``$GPUSHARE_SUPERVISOR_PID``; :class:`Lifetime` reads them (telling the supervisor it serves,
and the sockets it listens on: :mod:`.handoff`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import time
from dataclasses import dataclass, field
from typing import Any

from .supervisor import alive


def watched_pid(name: str) -> int:
    """The pid in environment variable ``name`` (0 when unset or not a number)."""
    try:
        return int(os.environ.get(name) or 0)
    except ValueError:
        return 0


@dataclass
class Lifetime:
    """The pid file of a broker on ``port`` and the reasons it stops."""

    pid_file: str  # "" for none
    port: int
    linger_max_s: float
    log: logging.Logger | logging.LoggerAdapter[Any]
    linger_until: float | None = field(default=None)

    def read_pid_file(self) -> dict[str, Any]:
        if not self.pid_file:
            return {}
        try:
            with open(self.pid_file) as f:
                data = json.load(f)
            return data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}

    def stop_stale_broker(self) -> None:
        """SIGTERM the broker named in the pid file if it holds our port and its hub is gone
        (never a reused pid: its command line must be a broker's)."""
        old = self.read_pid_file()
        pid, hub_pid = int(old.get("pid") or 0), int(old.get("hub_pid") or 0)
        if pid in (0, os.getpid()) or not alive(pid) or old.get("port") != self.port:
            return
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"jupyter_gpushare.broker" not in f.read():
                    return  # the pid was reused by something else: leave it alone
        except OSError:
            return
        if not hub_pid or alive(hub_pid):
            return  # a broker without a hub, or one whose hub runs: not ours to stop
        self.log.warning("gpushare: port %d is held by broker pid %d whose hub (pid %d) is "
                         "gone; stopping it", self.port, pid, hub_pid)
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)

    def write_pid_file(self) -> None:
        if not self.pid_file:
            return
        data = {"pid": os.getpid(), "port": self.port, "hub_pid": watched_pid("GPUSHARE_HUB_PID")}
        try:
            with open(self.pid_file + ".tmp", "w") as f:
                json.dump(data, f)
            os.replace(self.pid_file + ".tmp", self.pid_file)
        except OSError as exc:
            self.log.warning("gpushare: cannot write pid file %s: %s", self.pid_file, exc)

    def remove_pid_file(self) -> None:
        if self.pid_file and self.read_pid_file().get("pid") == os.getpid():
            with contextlib.suppress(OSError):
                os.remove(self.pid_file)

    def linger(self) -> None:
        """Serve until the hub is gone (at most ``linger_max_s``), not until the supervisor
        is: the hub is shutting down and will stop the servers, which release their grants."""
        if self.linger_until is None:
            self.linger_until = time.monotonic() + self.linger_max_s
            self.log.info("gpushare broker: the hub is shutting down; serving the servers' "
                          "releases until it is gone (at most %.0fs)", self.linger_max_s)

    def why_stop(self) -> str | None:
        """Why the broker should stop now (its hub or supervisor is gone), else ``None``."""
        hub = watched_pid("GPUSHARE_HUB_PID")
        supervisor = watched_pid("GPUSHARE_SUPERVISOR_PID")
        if hub and not alive(hub):
            return f"the hub (pid {hub}) is gone"
        if self.linger_until is not None:
            if time.monotonic() > self.linger_until:
                return f"lingered {self.linger_max_s:.0f}s after the hub's shutdown began"
            return None
        if supervisor and not alive(supervisor):
            return f"the supervisor (pid {supervisor}) is gone"
        return None

    async def watch(self, stop: asyncio.Event, interval_s: float) -> None:
        """Every ``interval_s`` until ``stop`` is set: set it when there is a reason to stop."""
        while not stop.is_set():
            why = self.why_stop()
            if why is not None:
                self.log.warning("gpushare broker: stopping: %s", why)
                stop.set()
                return
            await asyncio.sleep(interval_s)
