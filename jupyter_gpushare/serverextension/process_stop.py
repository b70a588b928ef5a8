"""Stopping a process of the server that went over its GPU memory limit, and telling the
terminal it ran in: the watchdog's actions on processes that are not kernels.

Every function here blocks or sleeps on psutil, so the service runs the blocking ones in an
executor and awaits the async one.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from typing import Any


def where_is(pid: int, terminals: dict[str, Any]) -> tuple[str, str | None]:
    """The process's command line and the name of the terminal it runs in, if any."""
    import psutil  # here, not at import: the server's start-up does not pay for it

    try:
        proc = psutil.Process(pid)
        cmd = " ".join(proc.cmdline())[:200]
        ancestors = {p.pid for p in proc.parents()}
    except psutil.Error:
        return "", None
    for name, term in terminals.items():
        shell = getattr(getattr(term, "ptyproc", None), "pid", None)
        if shell is not None and (shell == pid or shell in ancestors):
            return cmd, name
    return cmd, None


async def stop_process(pid: int, grace_s: float) -> str:
    """SIGTERM, then SIGKILL if it still runs after ``grace_s``.

    Returns ``gone`` (not there), ``terminated``, ``killed`` or ``failed: <why>``.
    """
    import psutil

    try:
        proc = psutil.Process(pid)
        proc.send_signal(signal.SIGTERM)
    except psutil.NoSuchProcess:
        return "gone"
    except psutil.Error as exc:
        return f"failed: {exc}"
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if not _alive(proc):
            return "terminated"
        await asyncio.sleep(0.1)
    try:
        proc.kill()
    except psutil.NoSuchProcess:
        return "terminated"
    except psutil.Error as exc:
        return f"failed: {exc}"
    for _ in range(50):
        if not _alive(proc):
            break
        await asyncio.sleep(0.1)
    return "killed"


def write_to_terminal(term: Any, text: str) -> bool:
    """Write the message into a terminal: every attached view, and the buffer that a view
    connecting later replays. False when there is no such terminal."""
    if term is None:
        return False
    line = f"\r\n\x1b[1;31m[gpushare] {text}\x1b[0m\r\n"
    buf = getattr(term, "read_buffer", None)
    if buf is not None:
        buf.append(line)
    for client in list(getattr(term, "clients", []) or []):
        with contextlib.suppress(Exception):
            client.on_pty_read(line)
    return True


def pid_alive(pid: int) -> bool:
    """Whether the process runs (a zombie, killed but not yet reaped, does not)."""
    import psutil

    try:
        return _alive(psutil.Process(pid))
    except psutil.Error:
        return False


def _alive(proc: Any) -> bool:
    import psutil

    try:
        return bool(proc.is_running()) and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
