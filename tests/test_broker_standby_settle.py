"""The next warm standby waits until the broker that took over has settled
(``broker/ops/supervisor.py``, ``STANDBY_SETTLE_S``).

A standby's imports cost about a second of CPU. Started the moment the new broker served, they
shared the two cores of a soak with that broker's first requests: admissions of 80-280 ms in
the second after a takeover, against 5-40 ms otherwise. Checked with the real supervisor and
brokers: after a kill -9 the standby serves, and the next standby is started no sooner than
``STANDBY_SETTLE_S`` later (less the time this test needs to see the broker serve).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from realhub import free_port
from test_broker_handoff import (
    broker_pid,
    serving_with_standby,
    start_supervisor,
    stop_supervisor,
)
from test_broker_lifecycle import alive, health, wait_for
from test_broker_supervisor import children

from jupyter_gpushare.broker.ops.supervisor import STANDBY_SETTLE_S

SEEN_LATE_S = 0.5  # how much later than the supervisor this test may see the broker serve


def test_the_next_standby_starts_only_once_the_new_broker_has_settled(tmp_path: Path) -> None:
    port = free_port()
    sup = start_supervisor(tmp_path, port)
    try:
        first, standby = serving_with_standby(tmp_path, port, sup)
        os.kill(first, signal.SIGKILL)
        wait_for(lambda: not alive(first), 10, "the killed broker gone")
        wait_for(lambda: broker_pid(tmp_path) == standby and health(port), 30,
                 "the standby serving")
        serving = time.monotonic()
        wait_for(lambda: len(children(sup.pid) - {standby}) == 1, 60, "the next standby")
        waited = time.monotonic() - serving
        assert waited >= STANDBY_SETTLE_S - SEEN_LATE_S, (
            f"the next standby started {waited:.2f}s after the takeover served")
        assert waited < STANDBY_SETTLE_S + 30  # and it does come
    finally:
        stop_supervisor(sup)
