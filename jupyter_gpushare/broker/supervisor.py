"""The broker's supervisor: the process JupyterHub manages, which keeps the broker running.

``python -m jupyter_gpushare.broker.supervisor <broker arguments>`` (what ``hubsetup`` puts in
the service's ``command``) starts the broker (``python -m jupyter_gpushare.broker ...``) in a
session of its own and

* **restarts it at once** when it dies (a crash, ``kill -9``): it serves again within about
  a second of start-up time, not at the hub's next 30 s service check;
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
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence

RESTART_DELAY_S = 0.1
MAX_RESTART_DELAY_S = 5.0
STABLE_AFTER_S = 10.0
POLL_S = 0.1


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

    def __init__(self, broker_args: Sequence[str], hub_pid: int | None = None) -> None:
        self.command = [sys.executable, "-m", "jupyter_gpushare.broker", *broker_args]
        self.hub_pid = os.getppid() if hub_pid is None else hub_pid
        self.child: subprocess.Popen[bytes] | None = None
        self.stopping: int | None = None  # the signal that asked us to stop
        self.restarts = 0

    def _on_signal(self, signum: int, _frame: object) -> None:
        self.stopping = signum

    def _spawn(self) -> subprocess.Popen[bytes]:
        env = dict(os.environ, GPUSHARE_HUB_PID=str(self.hub_pid),
                   GPUSHARE_SUPERVISOR_PID=str(os.getpid()))
        # its own session: the hub's signals to us (and a kill of our group) do not reach it
        return subprocess.Popen(self.command, env=env, start_new_session=True)

    def run(self) -> int:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._on_signal)
        delay = RESTART_DELAY_S
        while True:
            started = time.monotonic()
            self.child = self._spawn()
            while self.child.poll() is None and self.stopping is None and alive(self.hub_pid):
                time.sleep(POLL_S)
            if self.stopping is not None:  # the hub stops its services: hand over and go
                if self.child.poll() is None:
                    self.child.send_signal(signal.SIGUSR1)
                print(f"gpushare supervisor: signal {self.stopping}; the broker (pid "
                      f"{self.child.pid}) serves until the hub (pid {self.hub_pid}) is gone",
                      file=sys.stderr, flush=True)
                return 0
            if not alive(self.hub_pid):  # the hub died under us: so does the broker
                self._stop_child()
                return 0
            code = self.child.returncode
            ran = time.monotonic() - started
            delay = RESTART_DELAY_S if ran > STABLE_AFTER_S else min(delay * 2,
                                                                     MAX_RESTART_DELAY_S)
            self.restarts += 1
            print(f"gpushare supervisor: the broker exited with {code} after {ran:.1f}s; "
                  f"restart {self.restarts} in {delay:.1f}s", file=sys.stderr, flush=True)
            time.sleep(delay)

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


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m jupyter_gpushare.broker.supervisor [broker arguments]``."""
    return Supervisor(list(sys.argv[1:] if argv is None else argv)).run()


if __name__ == "__main__":
    sys.exit(main())
