"""The broker's supervisor: the process JupyterHub manages, which keeps the broker running.

``python -m jupyter_gpushare.broker.ops.supervisor <broker arguments>`` (what ``hubsetup`` puts in
the service's ``command``) starts the broker (``python -m jupyter_gpushare.broker ...``) in a
session of its own and

* **restarts it at once** when it dies (a crash, ``kill -9``): a warm standby (a second
  process with the broker's modules already imported, waiting on its stdin) takes over, so
  it serves again after loading its state, not at the hub's next 30 s service check. A
  broker that served (it said so on its ready pipe, ``GPUSHARE_READY_FD``, once it listened)
  is replaced without delay however often it is killed; only a broker that dies before it
  ever served (a crash loop at start: a bad config, a database that is down) is restarted
  after a growing delay. The next standby is started ``STANDBY_SETTLE_S`` after the new
  broker serves, so its imports (about a second of CPU) compete neither with the new
  broker's start nor with its first requests (a soak on 2 cores measured admissions of
  80-280 ms in the second after a takeover while they did; a broker killed again within
  that window is started cold);
* **lets it outlive the hub's shutdown**: JupyterHub stops its managed services *before* the
  single-user servers, so a broker stopped with them would refuse every release of that
  shutdown. When the hub stops the supervisor (SIGINT/SIGTERM), the supervisor tells the
  broker to *linger* (SIGUSR1) and exits at once; the hub then stops the servers, whose
  spawners release their grants at a broker that still answers, at the moment they stop
  (nothing is charged for the time the hub is down). The broker stops when the hub's
  process is gone (or after ``BrokerApp.linger_max_s``);
* **never outlives a dead hub**: after ``kill -9`` of the hub the broker sees the hub's pid
  gone within ``BrokerApp.watch_interval_s`` and exits, freeing its port for the next hub's
  broker (which also waits for the port and stops a stale broker named in the pid file).

The broker learns the pids to watch from ``GPUSHARE_HUB_PID`` and ``GPUSHARE_SUPERVISOR_PID``:
it stops when the hub is gone, and when its supervisor is gone unless it lingers.

**Outside the hub** (``--external`` before the broker's arguments; what
:mod:`.external` runs): the broker is not the hub's child and does not follow it. It serves
through hub restarts and kills (spawns, releases and admissions go on; only what needs the
hub's API waits for it), is restarted at once when it dies, and stops when the supervisor is
asked to stop (SIGINT/SIGTERM: the broker stops cleanly, no lingering).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence

from .handoff import LISTEN_FDS_ENV, READY_FD_ENV, read_ready

RESTART_DELAY_S = 0.1  # first delay after a broker that died before it served
MAX_RESTART_DELAY_S = 5.0
STABLE_AFTER_S = 10.0  # a broker that ran this long counts as having served
POLL_S = 0.05  # how often the hub's life and the ready channel are looked at
STANDBY_SETTLE_S = 2.0  # the next standby starts this long after the new broker serves


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists (and is not a zombie of ours)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie still answers kill(0): look at its state where /proc tells
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


class Supervisor:
    """Run the broker, restart it when it dies, hand over on shutdown (module docstring)."""

    def __init__(
        self,
        broker_args: Sequence[str],
        hub_pid: int | None = None,
        standby: bool = True,
        external: bool = False,
    ) -> None:
        self.command = [sys.executable, "-m", "jupyter_gpushare.broker", *broker_args]
        self.external = external  # outside the hub: no hub to watch or to linger for
        self.hub_pid = 0 if external else os.getppid() if hub_pid is None else hub_pid
        self.standby_enabled = standby
        self.child: subprocess.Popen[bytes] | None = None
        self.standby: subprocess.Popen[bytes] | None = None
        self.stopping: int | None = None  # the signal that asked us to stop
        self.restarts = 0
        self._ready: dict[int, socket.socket] = {}  # child pid -> our end of its ready channel
        self.listen_fds: list[int] = []  # the broker's listening sockets, kept (.handoff)
        self._wake_r, self._wake_w = -1, -1  # a signal's wake-up (signal.set_wakeup_fd)
        self._served: set[int] = set()  # child pids that said they serve
        self._started = 0.0  # when the running broker was started (monotonic)
        self._served_at: float | None = None  # when it was first seen serving

    def _on_signal(self, signum: int, _frame: object) -> None:
        self.stopping = signum

    def _spawn(self, standby: bool = False) -> subprocess.Popen[bytes]:
        env = dict(
            os.environ,
            GPUSHARE_HUB_PID=str(self.hub_pid or ""),
            GPUSHARE_SUPERVISOR_PID=str(os.getpid()),
        )
        if standby:
            env["GPUSHARE_STANDBY"] = "1"
        if self.listen_fds:  # it serves on the sockets we keep (.handoff)
            env[LISTEN_FDS_ENV] = ",".join(map(str, self.listen_fds))
        # the broker sends one byte once it listens (and its sockets, if it bound them)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        ours.setblocking(False)
        env[READY_FD_ENV] = str(theirs.fileno())
        try:
            # its own session: the hub's signals to us (and a kill of our group) do not
            # reach it
            child = subprocess.Popen(
                self.command,
                env=env,
                start_new_session=True,
                stdin=subprocess.PIPE if standby else subprocess.DEVNULL,
                pass_fds=(theirs.fileno(), *self.listen_fds),
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self._ready[child.pid] = ours
        return child

    def served(self, child: subprocess.Popen[bytes]) -> bool:
        """Whether ``child`` said on its ready pipe that it listens (alive or not since)."""
        if child.pid in self._served:
            return True
        channel = self._ready.get(child.pid)
        if channel is None:
            return False
        heard = read_ready(channel)
        if heard is None:
            return False
        said, fds = heard
        self._keep_listening(fds)
        self._forget(child)
        if said:
            self._served.add(child.pid)
        return bool(said)

    def _keep_listening(self, fds: list[int]) -> None:
        """Keep the first broker's listening sockets for the next ones (close any others)."""
        if self.listen_fds:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
        else:
            self.listen_fds = fds

    def _forget(self, child: subprocess.Popen[bytes]) -> None:
        channel = self._ready.pop(child.pid, None)
        if channel is not None:
            channel.close()

    def _wait(self, child: subprocess.Popen[bytes], pidfd: int) -> None:
        """Up to POLL_S, and less when ``child`` exits, says it serves, or a signal comes."""
        watch = [fd for fd in (pidfd, self._wake_r) if fd >= 0]
        channel = self._ready.get(child.pid)
        if channel is not None:
            watch.append(channel.fileno())
        if not watch:
            time.sleep(POLL_S)
            return
        select.select(watch, [], [], POLL_S)
        if self._wake_r >= 0:
            with contextlib.suppress(OSError):
                os.read(self._wake_r, 64)

    def _next_broker(self) -> subprocess.Popen[bytes]:
        """The warm standby, told to start (it has imported everything), else a new one
        (the next standby comes once it serves: :meth:`_standby_when_served`)."""
        child, self.standby = self.standby, None
        if child is not None and child.poll() is None and child.stdin is not None:
            try:
                child.stdin.write(b"g")
                child.stdin.close()
            except OSError:
                self._forget(child)
                child = None
        else:
            if child is not None:
                self._forget(child)
            child = None
        if child is None:
            child = self._spawn()
        return child

    def _standby_when_served(self) -> None:
        """Start the next standby ``STANDBY_SETTLE_S`` after the running broker serves (not
        before: the two would share the CPU while it starts and serves its first requests)."""
        if not self.standby_enabled or self.standby is not None or self.child is None:
            return
        now = time.monotonic()
        if self._served_at is None and (
            self.served(self.child) or now - self._started > STABLE_AFTER_S
        ):
            self._served_at = now
        if self._served_at is not None and now - self._served_at >= STANDBY_SETTLE_S:
            self.standby = self._spawn(standby=True)

    def _drop_standby(self) -> None:
        standby, self.standby = self.standby, None
        if standby is not None and standby.stdin is not None:
            with contextlib.suppress(OSError):
                standby.stdin.close()  # end of file: it exits
            with contextlib.suppress(subprocess.TimeoutExpired):
                standby.wait(5)
            self._forget(standby)

    def _wake_on_signals(self) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._on_signal)
        self._wake_r, self._wake_w = os.pipe()
        for fd in (self._wake_r, self._wake_w):
            os.set_blocking(fd, False)
        signal.set_wakeup_fd(self._wake_w)

    def run(self) -> int:
        self._wake_on_signals()
        delay = 0.0
        while True:
            started = self._started = time.monotonic()
            self._served_at = None
            self.child = self._next_broker()
            pidfd = pid_fd(self.child.pid)
            try:
                while self.child.poll() is None and self.stopping is None and self.hub_alive():
                    self._standby_when_served()
                    self._wait(self.child, pidfd)
            finally:
                if pidfd >= 0:
                    os.close(pidfd)
            if self.stopping is not None and self.external:  # asked to stop: so does it
                print(
                    f"gpushare supervisor: signal {self.stopping}; stopping the broker "
                    f"(pid {self.child.pid})",
                    file=sys.stderr,
                    flush=True,
                )
                self._drop_standby()
                self._stop_child(timeout=30.0)
                return 0
            if self.stopping is not None:  # the hub stops its services: hand over and go
                if self.child.poll() is None:
                    self.child.send_signal(signal.SIGUSR1)
                print(
                    f"gpushare supervisor: signal {self.stopping}; the broker (pid "
                    f"{self.child.pid}) serves until the hub (pid {self.hub_pid}) is gone",
                    file=sys.stderr,
                    flush=True,
                )
                self._drop_standby()
                return 0
            if not self.hub_alive():  # the hub died under us: so does the broker
                self._drop_standby()
                self._stop_child()
                return 0
            code = self.child.returncode
            ran = time.monotonic() - started
            delay = restart_delay(self.served(self.child) or ran > STABLE_AFTER_S, delay)
            self._forget(self.child)
            self._served.discard(self.child.pid)
            self.restarts += 1
            print(
                f"gpushare supervisor: the broker exited with {code} after {ran:.1f}s; "
                f"restart {self.restarts} in {delay:.1f}s",
                file=sys.stderr,
                flush=True,
            )
            time.sleep(delay)

    def hub_alive(self) -> bool:
        """Whether the hub this supervisor follows runs (outside the hub: always)."""
        return self.external or alive(self.hub_pid)

    def _stop_child(self, timeout: float = 10.0) -> None:
        child = self.child
        if child is None or child.poll() is not None:
            return
        child.terminate()
        try:
            child.wait(timeout)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait(5)


def pid_fd(pid: int) -> int:
    """A file descriptor that turns readable when process ``pid`` exits (Linux 5.3+), else -1
    (then the supervisor notices within POLL_S)."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return -1


def restart_delay(served: bool, last: float) -> float:
    """Seconds to wait before the next broker: none after one that served; after one that
    died before it served, growing from RESTART_DELAY_S (doubling) up to MAX_RESTART_DELAY_S."""
    if served:
        return 0.0
    return min(max(2 * last, RESTART_DELAY_S), MAX_RESTART_DELAY_S)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m jupyter_gpushare.broker.ops.supervisor [--external] [broker arguments]``.

    ``--external``: the broker runs outside the hub (module docstring). The
    environment's ``GPUSHARE_SUPERVISOR_STANDBY=0`` turns the warm standby off (one
    idle process with the broker's modules imported, which makes a restart about a
    second faster).
    """
    args = list(sys.argv[1:] if argv is None else argv)
    external = bool(args) and args[0] == "--external"
    standby = os.environ.get("GPUSHARE_SUPERVISOR_STANDBY", "1") not in ("0", "false", "no")
    return Supervisor(args[1:] if external else args, standby=standby, external=external).run()


if __name__ == "__main__":
    sys.exit(main())
