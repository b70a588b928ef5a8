"""The listening sockets the supervisor keeps across broker restarts (broker/ops/handoff.py).

Checked with the real supervisor and brokers: while a killed broker is being replaced (its
warm standby held stopped here, so the gap is as long as the test wants) a client's
connection is accepted and its request answered by the next broker, not refused; the
supervisor keeps one set of sockets; a broker stopped by SIGTERM leaves without the
interpreter's teardown (its atexit hooks do not run); a bad ``$GPUSHARE_LISTEN_FDS`` is an
error naming the variable.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from realhub import REPO, free_port
from test_broker_lifecycle import alive, health, wait_for
from test_broker_supervisor import children

from jupyter_gpushare.broker.ops.handoff import LISTEN_FDS_ENV, inherited_sockets

POLICY = REPO / "hub_config" / "gpushare.yaml"
HEALTH = "/services/gpushare/api/v1/health"


def broker_args(tmp_path: Path, port: int) -> list[str]:
    return [
        f"--BrokerApp.policy_file={POLICY}",
        f"--BrokerApp.db_url=sqlite:///{tmp_path}/b.sqlite",
        f"--BrokerApp.port={port}",
        "--BrokerApp.ip=127.0.0.1",
        "--BrokerApp.use_hub=False",
        "--BrokerApp.reconcile_on_start=False",
        "--BrokerApp.reconcile_interval_s=0",
    ]


def broker_pid(tmp_path: Path) -> int:
    try:
        return int(json.loads((tmp_path / "gpushare-broker.pid").read_text())["pid"])
    except (OSError, ValueError, KeyError):
        return 0


def start_supervisor(tmp_path: Path, port: int) -> subprocess.Popen[bytes]:
    """The real supervisor (outside a hub) running the broker on ``port``."""
    return subprocess.Popen(
        [sys.executable, "-m", "jupyter_gpushare.broker.ops.supervisor", "--external",
         *broker_args(tmp_path, port)],
        cwd=tmp_path,
        start_new_session=True,
    )


def serving_with_standby(tmp_path: Path, port: int,
                         sup: subprocess.Popen[bytes]) -> tuple[int, int]:
    """(the serving broker's pid, its warm standby's), once both are there."""
    wait_for(lambda: health(port), 60, "the broker answering")
    first = broker_pid(tmp_path)
    wait_for(lambda: len(children(sup.pid) - {first}) == 1, 60, "a warm standby")
    (standby,) = children(sup.pid) - {first}
    return first, standby


def open_files(pid: int) -> set[str]:
    """What each open descriptor of `pid` points at (`socket:[inode]` for a socket).

    The standby opens and closes files while it builds ahead, so a descriptor listed a
    moment ago may be gone when its link is read: those are skipped, not an error.
    """
    links = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(FileNotFoundError):
            links.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
    return links


def stop_supervisor(sup: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(sup.pid, signal.SIGTERM)
    sup.wait(30)
    for pid in children(sup.pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def get_health(port: int, results: list[object]) -> None:
    """One GET /health on a connection opened now; what came back (or the error)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
            conn.sendall(f"GET {HEALTH} HTTP/1.0\r\nHost: x\r\n\r\n".encode())
            answer = b""
            while chunk := conn.recv(65536):
                answer += chunk
        results.append(answer.split(b"\r\n", 1)[0].decode())
    except OSError as exc:
        results.append(exc)


def test_a_connection_during_a_restart_waits_for_the_next_broker(tmp_path: Path) -> None:
    port = free_port()
    sup = start_supervisor(tmp_path, port)
    try:
        first, standby = serving_with_standby(tmp_path, port, sup)
        # the standby inherited the listening socket the first broker bound (not a bind
        # of its own): the same socket (same inode) in both processes
        shared = open_files(first) & open_files(standby)
        assert any(link.startswith("socket:") for link in shared)
        os.kill(standby, signal.SIGSTOP)  # the gap lasts until we let it go on
        os.kill(first, signal.SIGKILL)
        wait_for(lambda: not alive(first), 10, "the killed broker gone")
        results: list[object] = []
        asker = threading.Thread(target=get_health, args=(port, results))
        asker.start()
        time.sleep(1.0)
        assert results == [], f"answered while no broker ran: {results}"  # waiting, not refused
        os.kill(standby, signal.SIGCONT)
        asker.join(60)
        assert results and results[0] == "HTTP/1.1 200 OK", results
        assert broker_pid(tmp_path) == standby
    finally:
        stop_supervisor(sup)


def test_a_broker_stopped_by_sigterm_skips_the_interpreter_teardown(tmp_path: Path) -> None:
    # a sitecustomize whose atexit hook writes a file: a broker that stops cleanly leaves
    # with os._exit after closing everything, so the hook never runs (the teardown of every
    # module took ~0.3 s of CPU that kept the next broker waiting)
    site = tmp_path / "site"
    site.mkdir()
    marker = tmp_path / "atexit-ran"
    (site / "sitecustomize.py").write_text(
        f"import atexit\natexit.register(lambda: open({str(marker)!r}, 'w').close())\n"
    )
    port = free_port()
    env = dict(os.environ, PYTHONPATH=f"{site}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    broker = subprocess.Popen(
        [sys.executable, "-m", "jupyter_gpushare.broker", *broker_args(tmp_path, port)],
        cwd=tmp_path,
        env=env,
    )
    try:
        wait_for(lambda: health(port), 60, "the broker answering")
        broker.send_signal(signal.SIGTERM)
        assert broker.wait(30) == 0
        assert not marker.exists()
        assert not (tmp_path / "gpushare-broker.pid").exists()  # it did stop cleanly
    finally:
        broker.kill()
    # the same hook runs for a plain interpreter exit (the check can fail)
    subprocess.run([sys.executable, "-c", "pass"], env=env, check=True)
    assert marker.exists()


def test_listen_fds_that_are_not_listening_sockets_are_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    a, b = socket.socketpair()
    with a, b:
        monkeypatch.setenv(LISTEN_FDS_ENV, str(a.fileno()))
        with pytest.raises(ValueError, match=LISTEN_FDS_ENV):
            inherited_sockets()
        monkeypatch.setenv(LISTEN_FDS_ENV, "3;rm")
        with pytest.raises(ValueError, match=LISTEN_FDS_ENV):
            inherited_sockets()
        monkeypatch.setenv(LISTEN_FDS_ENV, "999999")  # inherited by mistake: not open here
        with pytest.raises(ValueError, match=f"{LISTEN_FDS_ENV}: fd 999999 is not open"):
            inherited_sockets()
        a.send(b"x")  # the refused fd was not closed under us
    listener = socket.create_server(("127.0.0.1", 0))
    with listener:
        monkeypatch.setenv(LISTEN_FDS_ENV, str(os.dup(listener.fileno())))
        (got,) = inherited_sockets()
        with got:
            assert got.getsockname() == listener.getsockname() and not got.getblocking()
        assert LISTEN_FDS_ENV not in os.environ  # read once
