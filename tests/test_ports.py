"""The tests' port picker (``tests/ports.py``): no two callers of one run get the same port, and
no port comes from the range the kernel hands out on its own."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import ports
import pytest


@pytest.fixture
def own_claims(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(ports.tempfile, "gettempdir", lambda: str(tmp_path))
    return ports.claims_dir()


def test_ports_are_below_the_ephemeral_range_and_free(own_claims: Path) -> None:
    low = ports.ephemeral_low()
    for _ in range(50):
        port = ports.free_port()
        assert port < low
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # free when drawn


def test_a_claimed_port_is_never_handed_out_again(own_claims: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # a range of 40 ports drawn 40 times: every port exactly once, then none is left; below
    # the range the suite draws from (at the top of it, another worker's server held one of
    # the 40 now and then: "no free port" before the 40th draw)
    high = ports.LOWEST - 1
    monkeypatch.setattr(ports, "port_range", lambda: (high - 39, high))
    got = [ports.free_port() for _ in range(40)]
    assert len(set(got)) == 40 and set(got) == set(range(high - 39, high + 1))
    with pytest.raises(RuntimeError, match="no free port"):
        ports.free_port()


def test_another_process_does_not_get_a_port_this_one_claimed(own_claims: Path,
                                                              monkeypatch: pytest.MonkeyPatch
                                                              ) -> None:
    high = ports.LOWEST - 1  # (below what the suite draws from: as above)
    monkeypatch.setattr(ports, "port_range", lambda: (high - 19, high))
    mine = {ports.free_port() for _ in range(10)}
    code = ("import sys, tempfile; sys.path.insert(0, sys.argv[1]); import ports; "
            f"tempfile.gettempdir = lambda: {str(own_claims.parent)!r}; "
            f"ports.port_range = lambda: ({high - 19}, {high}); "
            "print(sorted(ports.free_port() for _ in range(10)))")
    out = subprocess.run([sys.executable, "-c", code, str(Path(ports.__file__).parent)],
                         check=True, capture_output=True, text=True).stdout
    theirs = set(eval(out))  # noqa: S307 (a list of ints printed by the child above)
    assert not mine & theirs and len(theirs) == 10


def test_a_claim_older_than_its_hold_is_taken_over(own_claims: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    high = ports.ephemeral_low() - 1
    monkeypatch.setattr(ports, "port_range", lambda: (high, high))
    assert ports.free_port() == high
    with pytest.raises(RuntimeError):
        ports.free_port()
    old = time.time() - ports.CLAIM_S - 5
    os.utime(own_claims / str(high), (old, old))
    assert ports.free_port() == high
