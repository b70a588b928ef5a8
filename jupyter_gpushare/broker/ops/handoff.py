"""The broker's listening sockets, kept open by its supervisor across restarts.

A broker the supervisor (:mod:`.supervisor`) starts gets a Unix socket to it in
``$GPUSHARE_READY_FD``. The first broker binds its port itself (it knows its address; the
supervisor does not) and, once it listens, sends one byte on that socket with the listening
sockets attached (``SCM_RIGHTS``). The supervisor keeps them and hands them to every later
broker (and to the warm standby) in ``$GPUSHARE_LISTEN_FDS``, which serves on them instead of
binding.

So while a killed broker is replaced, the port stays open: a client's connection waits in
the kernel's accept queue for the next broker (a few tens of milliseconds) instead of being
refused and tried again after a back-off. A broker without a supervisor (tests, a broker
run by hand) binds its port as before, and a ready channel that is a plain pipe (an older
supervisor) gets the byte alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import socket
import time
from collections.abc import Callable

from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets

LISTEN_FDS_ENV = "GPUSHARE_LISTEN_FDS"
READY_FD_ENV = "GPUSHARE_READY_FD"
MAX_SOCKETS = 8  # IPv4 and IPv6 of one address: two; more is not a listening set of ours


def inherited_sockets() -> list[socket.socket]:
    """The listening sockets the supervisor handed down (``$GPUSHARE_LISTEN_FDS``), else [].

    Each must be a listening TCP socket: anything else in the variable is an error, not
    something to serve on."""
    raw = os.environ.pop(LISTEN_FDS_ENV, "")
    if not raw:
        return []
    sockets = []
    for part in raw.split(",")[:MAX_SOCKETS]:
        if not part.isdigit():
            raise ValueError(f"${LISTEN_FDS_ENV}: {part!r} is not a file descriptor")
        try:
            sock = socket.socket(fileno=int(part))
        except OSError as exc:
            raise ValueError(f"${LISTEN_FDS_ENV}: fd {part} is not open ({exc})") from None
        if sock.type != socket.SOCK_STREAM or not sock.getsockopt(
            socket.SOL_SOCKET, socket.SO_ACCEPTCONN
        ):
            sock.detach()
            raise ValueError(f"${LISTEN_FDS_ENV}: fd {part} is not a listening socket")
        sock.setblocking(False)
        sockets.append(sock)
    return sockets


async def listen(
    server: HTTPServer, port: int, ip: str, port_wait_s: float, stop_stale: Callable[[], None]
) -> list[socket.socket]:
    """Serve on the sockets the supervisor keeps, else on ``port``; while another process
    holds it, ``stop_stale`` once (a broker named in the pid file whose hub is gone) and
    wait up to ``port_wait_s``. The sockets served on."""
    deadline = time.monotonic() + port_wait_s
    took_over = False
    while True:
        try:
            sockets = inherited_sockets() or bind_sockets(port, ip)
            server.add_sockets(sockets)
            return sockets
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE or time.monotonic() > deadline:
                raise
        if not took_over:
            took_over = True
            stop_stale()
        await asyncio.sleep(0.2)


def tell_supervisor_ready(sockets: list[socket.socket]) -> None:
    """One byte on the supervisor's ready channel (``$GPUSHARE_READY_FD``): this broker serves,
    so the supervisor replaces it at once should it die; ``sockets`` ride along for the
    supervisor to keep (on a pipe, the byte alone)."""
    fd = os.environ.pop(READY_FD_ENV, "")
    if not fd.isdigit():
        return
    try:
        channel = socket.socket(fileno=int(fd))
    except OSError:  # not a socket: a pipe
        with contextlib.suppress(OSError):
            os.write(int(fd), b"r")
        with contextlib.suppress(OSError):
            os.close(int(fd))
        return
    with channel, contextlib.suppress(OSError):
        socket.send_fds(channel, [b"r"], [s.fileno() for s in sockets][:MAX_SOCKETS])


def read_ready(channel: socket.socket) -> tuple[bytes, list[int]] | None:
    """What a broker said on its ready channel: (the byte, or b"" when it closed the channel
    without a word, the file descriptors it sent), or None while it has said nothing yet."""
    try:
        data, fds, _flags, _addr = socket.recv_fds(channel, 1, MAX_SOCKETS)
    except BlockingIOError:
        return None
    except OSError:
        return b"", []
    return data, list(fds)
