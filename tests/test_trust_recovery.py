"""Issue 23, finding 19: a broker killed under load serves again at once and no client sees
a 5xx; nothing is lost or admitted twice.

* the supervisor replaces a broker that served (it said so on its ready pipe) without
  delay, and only a broker that dies before serving after a growing delay;
* ``BrokerClient`` sends again, within its retry window, what is safe to send again (a
  refused connection, reads, DELETE, bodies with an idempotency key) and nothing else;
* one kill -9 during 10 concurrent spawn-like clients (``benchmarks/broker_kill.py``, small):
  0 client errors, no grant lost or duplicated.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from brokerkit import free_port
from tornado import web
from tornado.httpserver import HTTPServer

from jupyter_gpushare.broker.client import BrokerClient, BrokerError
from jupyter_gpushare.broker.ops.supervisor import (
    MAX_RESTART_DELAY_S,
    RESTART_DELAY_S,
    Supervisor,
    restart_delay,
)

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


# -- the supervisor -------------------------------------------------------------------------


def test_a_broker_that_served_is_replaced_without_delay() -> None:
    assert restart_delay(True, 0.0) == 0.0
    assert restart_delay(True, MAX_RESTART_DELAY_S) == 0.0  # however often it was killed
    delays = [0.0]
    for _ in range(8):  # a crash loop at start backs off, up to the cap
        delays.append(restart_delay(False, delays[-1]))
    assert delays[1] == RESTART_DELAY_S and delays[2] == 2 * RESTART_DELAY_S
    assert delays[-1] == MAX_RESTART_DELAY_S


def test_the_ready_pipe_tells_a_served_broker_from_a_crash_at_start() -> None:
    sup = Supervisor([], hub_pid=1, standby=False)
    sup.command = [sys.executable, "-c",
                   "import os; os.write(int(os.environ['GPUSHARE_READY_FD']), b'r')"]
    served = sup._spawn()
    sup.command = [sys.executable, "-c", "raise SystemExit(3)"]
    crashed = sup._spawn()
    assert served.wait(30) == 0 and crashed.wait(30) == 3
    assert sup.served(served) and sup.served(served)  # remembered once read
    assert not sup.served(crashed)


# -- the client's retries -------------------------------------------------------------------


class Flaky(web.RequestHandler):
    """Answers 503 to the first ``fail`` calls of each path, then 200 (and counts them)."""

    def initialize(self, seen: dict[str, int], fail: int) -> None:
        self.seen, self.fail = seen, fail

    def _answer(self) -> None:
        key = f"{self.request.method} {self.request.path}"
        self.seen[key] = self.seen.get(key, 0) + 1
        if self.seen[key] <= self.fail:
            self.set_status(503)
            self.finish({"reason": "restarting"})
        else:
            self.finish({"status": "ok"})

    def get(self, _: str) -> None:
        self._answer()

    def post(self, _: str) -> None:
        self._answer()


@pytest.fixture
async def flaky() -> Any:
    seen: dict[str, int] = {}
    port = free_port()
    server = HTTPServer(web.Application([(r"/api(/.*)", Flaky, {"seen": seen, "fail": 2})]))
    server.listen(port, "127.0.0.1")
    yield f"http://127.0.0.1:{port}/api", seen
    server.stop()


async def test_503_is_retried_for_what_is_safe_to_send_again(flaky: Any) -> None:
    url, seen = flaky
    client = BrokerClient(url, "t", retry_window_s=5, retry_delay_s=0.01)
    assert (await client.call("GET", "/grants"))[0] == 200
    assert seen["GET /api/grants"] == 3 and client.retries == 2
    status, _ = await client.call("POST", "/requests", {"idempotency_key": "k1"})
    assert status == 200 and seen["POST /api/requests"] == 3
    with pytest.raises(BrokerError) as err:  # no key: the first answer stands
        await client.call("POST", "/jobs", {"notebook": "x.ipynb"})
    assert err.value.status == 503 and seen["POST /api/jobs"] == 1


async def test_a_refused_connection_is_retried_within_the_window_only() -> None:
    url = f"http://127.0.0.1:{free_port()}/api"
    client = BrokerClient(url, "t", retry_window_s=0.6, retry_delay_s=0.05)
    t0 = time.monotonic()
    with pytest.raises(BrokerError) as err:
        await client.call("POST", "/jobs", {"notebook": "x.ipynb"})  # nothing was sent
    took = time.monotonic() - t0
    assert err.value.status == 503 and err.value.unsent and client.retries >= 3
    assert 0.3 <= took <= 3.0, took
    off = BrokerClient(url, "t", retry_window_s=0)
    with pytest.raises(BrokerError):
        await off.call("GET", "/health")
    assert off.retries == 0


class Cutter:
    """A raw HTTP server that reads each request and closes the first ``cuts`` connections
    without an answer (a broker killed mid-call), then answers 200; when each came."""

    def __init__(self, cuts: int) -> None:
        self.cuts = cuts
        self.arrivals: list[float] = []
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/api"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                self.arrivals.append(time.monotonic())
                if len(self.arrivals) > self.cuts:
                    body = b'{"status": "ok"}'
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                 b"Content-Length: %d\r\nConnection: close\r\n\r\n%s"
                                 % (len(body), body))


async def test_a_call_cut_without_an_answer_is_sent_again_at_once_then_with_backoff() -> None:
    # the supervisor keeps the listening socket, so a call cut by a kill -9 is best sent again
    # at once (it waits in the accept queue for the next broker); only the first cut of a
    # call: a second one waits retry_delay_s as before
    once = Cutter(cuts=1)
    client = BrokerClient(once.url, "t", retry_window_s=10, retry_delay_s=1.0)
    assert (await client.call("POST", "/requests", {"idempotency_key": "k"}))[0] == 200
    assert len(once.arrivals) == 2 and once.arrivals[1] - once.arrivals[0] < 0.5
    twice = Cutter(cuts=2)
    client = BrokerClient(twice.url, "t", retry_window_s=10, retry_delay_s=1.0)
    assert (await client.call("GET", "/grants"))[0] == 200
    gaps = [b - a for a, b in zip(twice.arrivals, twice.arrivals[1:], strict=False)]
    assert len(twice.arrivals) == 3 and gaps[0] < 0.5 and gaps[1] >= 1.0, gaps
    for cutter in (once, twice):
        cutter.sock.close()


# -- kill -9 under load -----------------------------------------------------------------------


def test_kill_9_during_10_concurrent_spawns(tmp_path: Path) -> None:
    args = argparse.Namespace(kills=1, spawners=10, readers=2, interval=2.0, retry_window=10.0,
                              tmp=str(tmp_path))
    code = (f"import sys, json, argparse; sys.path.insert(0, {str(BENCH)!r})\n"
            "import asyncio, broker_kill\n"
            f"out = asyncio.run(broker_kill.run(argparse.Namespace(**{vars(args)!r})))\n"
            "print(json.dumps(out))\n")
    # a process of its own: it is the supervisor's parent (the hub, for the supervisor)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["statuses"].get("granted", 0) >= 10, out
    assert out["errors_5xx"] == [] and out["errors_other"] == [], out
    assert out["lost"] == 0 and out["duplicated"] == 0, out
    (took,) = out["times"]
    # the target is 3 s (median of 5 kills, benchmarks/broker_kill.py: 0.16 s here); one kill
    # on a shared 2-core machine gets some room
    assert took <= 5.0, f"serving again {took:.2f} s after the kill"
    # the broker said it served (ready pipe): replaced without the crash-loop delay
    assert "restart 1 in 0.0s" in (tmp_path / "supervisor.log").read_text()


def test_the_kill_benchmark_splits_admissions_by_kill_window() -> None:
    sys.path.insert(0, str(BENCH))
    import broker_kill

    windows = [(10.0, 10.2), (20.0, 20.1)]
    admissions = [(9.9, 9.95), (9.95, 10.05), (10.1, 10.3), (10.25, 10.26), (19.0, 21.0)]
    during, calm = broker_kill.split_by_kills(admissions, windows)
    assert during == pytest.approx([100.0, 200.0, 2000.0])  # each overlaps a window
    assert calm == pytest.approx([50.0, 10.0])  # before the first kill; after serving again
    assert broker_kill.percentile([5.0, 1.0, 3.0, 2.0, 4.0], 50) == 3.0
    assert broker_kill.percentile(list(map(float, range(1, 101))), 99) == 99.0
    assert broker_kill.percentile([7.0], 99) == 7.0
