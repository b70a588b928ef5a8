"""The admission prober: a thread of the harness that runs :mod:`.probe_child` in a process of
its own and records each probe it prints (how long admission took, during which fault)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from .drivers import Faults
from .history import History
from .stack import Stack

CHILD = Path(__file__).with_name("probe_child.py")


class Prober(threading.Thread):
    """Every ``interval_s`` a 1/8 debug GPU asked for the way the spawner does (in the child
    process), recorded here with the faults around it."""

    def __init__(
        self,
        stack: Stack,
        history: History,
        faults: Faults,
        user: str,
        stop: threading.Event,
        interval_s: float = 1.0,
    ) -> None:
        super().__init__(daemon=True, name="prober")
        self.stack, self.h, self.faults, self.user = stack, history, faults, user
        self.stopping, self.interval_s = stop, interval_s

    def run(self) -> None:
        child = subprocess.Popen(
            [sys.executable, str(CHILD), self.stack.broker_url, self.stack.tokens()["spawner"],
             self.user, str(self.interval_s)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        threading.Thread(target=self._stop_child_when_done, args=(child,), daemon=True).start()
        assert child.stdout is not None
        for line in child.stdout:
            self.record(json.loads(line))
        if child.wait() != 0 and not self.stopping.is_set():  # the summary would just thin out
            print(f"soak: the admission prober exited with {child.returncode}; no more probes",
                  file=sys.stderr, flush=True)

    def _stop_child_when_done(self, child: subprocess.Popen[str]) -> None:
        self.stopping.wait()
        if child.stdin is not None:
            child.stdin.close()  # it leaves after the probe in flight

    def record(self, probe: dict[str, Any]) -> None:
        t0, ms, status = float(probe["t"]), float(probe["ms"]), int(probe["status"])
        t1 = t0 + ms / 1000
        self.h.record("admission", t=t0, ms=ms, status=status,
                      in_fault=self.faults.any_at(t0) or self.faults.any_at(t1),
                      fault=self.faults.kind_at(t0) or self.faults.kind_at(t1))
        self.h.record("call", t=t0, client="prober", what="request", method="POST",
                      path="/requests", status=status, ms=ms,
                      # it stands in for the spawner, which lives in the hub
                      counts=not self.faults.hit(t0 - 1, t1 + 1, ("hub",)),
                      body=probe.get("body"))
        if probe.get("release"):
            self.h.record("call", client="prober", what="release", method="DELETE",
                          path="/grants", status=int(probe["release"]["status"]), counts=True,
                          body=probe["release"]["body"])
