"""What a process asks the simulated GPUs to show (``jupyter_gpushare.simgpu``), read by a
real :class:`SimulatedSampler`: only the server's own processes, bounded by the card, never
through a link, a file of another user, a file over its bound or one left by an earlier
process of the same pid. The asking processes are real (``python -c``), as in a kernel.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from jupyter_gpushare import simgpu
from jupyter_gpushare.telemetry.simrequests import MAX_FILE_BYTES
from jupyter_gpushare.telemetry.simulated import SimulatedSampler

CARD_MIB = 8192.0
ASK = """
import sys, time
from jupyter_gpushare.simgpu import use_gpu_compute, use_gpu_memory
use_gpu_memory(sys.argv[1], gpu=int(sys.argv[3]))
use_gpu_compute(float(sys.argv[2]), gpu=int(sys.argv[3]))
print("asked", flush=True)
time.sleep(120)
"""


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("GPUSHARE_SIMGPU_DIR", str(tmp_path / "req"))
    return tmp_path / "req"


@pytest.fixture
def asking(folder: Path) -> Iterator[list[subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for p in procs:
        p.kill()
        p.wait(10)


def ask(procs: list[subprocess.Popen[str]], memory: str, compute: float = 0.0,
        gpu: int = 0) -> int:
    proc = subprocess.Popen([sys.executable, "-c", ASK, memory, str(compute), str(gpu)],
                            stdout=subprocess.PIPE, text=True)
    procs.append(proc)
    assert proc.stdout is not None and proc.stdout.readline() == "asked\n"
    return proc.pid


def sampler(own: list[int], folder: Path) -> SimulatedSampler:
    return SimulatedSampler(uuids=("GPU-a", "GPU-b"), memory_total_mib=CARD_MIB,
                            background_load=False, own_pids=lambda: own,
                            requests_folder=folder)


def shown(sim: SimulatedSampler) -> dict[int, tuple[str, float, float]]:
    return {p.pid: (p.gpu_uuid, p.memory_used_mib, p.sm_util_pct)
            for p in sim.collect().processes if p.memory_used_mib}


def test_own_processes_show_what_they_asked_bounded_by_the_card(
    folder: Path, asking: list[subprocess.Popen[str]]
) -> None:
    a = ask(asking, "6 GiB", 40, gpu=1)
    big = ask(asking, "1 TiB", 100, gpu=0)
    foreign = ask(asking, "1 GiB")
    sim = sampler([a, big], folder)
    assert shown(sim) == {a: ("GPU-b", 6144.0, 40.0), big: ("GPU-a", CARD_MIB, 100.0)}
    sample = sim.collect()
    assert {g.uuid: g.memory_used_mib for g in sample.gpus} == {"GPU-a": CARD_MIB,
                                                                "GPU-b": 6144.0}
    assert foreign not in shown(sim)


def test_a_process_that_left_the_servers_kernels_loses_its_request(
    folder: Path, asking: list[subprocess.Popen[str]]
) -> None:
    a = ask(asking, "2 GiB")
    own = [a]
    sim = sampler(own, folder)
    assert shown(sim) == {a: ("GPU-a", 2048.0, 0.0)}
    own.clear()  # the kernel died or was restarted
    assert shown(sim) == {}
    assert not (folder / f"{a}.json").exists()


def test_a_request_of_an_earlier_process_with_the_same_pid_is_not_believed(
    folder: Path, asking: list[subprocess.Popen[str]]
) -> None:
    a = ask(asking, "2 GiB")
    path = folder / f"{a}.json"
    doc = json.loads(path.read_text())
    path.write_text(json.dumps({**doc, "started": doc["started"] - 3600}))
    assert shown(sampler([a], folder)) == {}


@pytest.mark.parametrize("planted", ["link", "huge", "foreign-owner", "not-json"])
def test_requests_are_read_without_a_link_within_the_bound_and_only_the_users_own(
    folder: Path, asking: list[subprocess.Popen[str]], tmp_path: Path, planted: str
) -> None:
    a = ask(asking, "2 GiB")
    path = folder / f"{a}.json"
    good = path.read_text()
    assert shown(sampler([a], folder)) == {a: ("GPU-a", 2048.0, 0.0)}
    if planted == "link":
        target = tmp_path / "elsewhere.json"
        target.write_text(good)
        path.unlink()
        path.symlink_to(target)
    elif planted == "huge":
        path.write_text(good + " " * MAX_FILE_BYTES)  # its first bytes alone would parse
    elif planted == "foreign-owner":
        if os.geteuid() != 0:
            pytest.skip("chown needs root")
        os.chown(path, 65534, 65534)
    else:
        path.write_text("[1, 2")
    assert shown(sampler([a], folder)) == {}


@pytest.mark.parametrize(("call", "why"), [
    (lambda: simgpu.use_gpu_memory("6 GB?"), "use_gpu_memory: amount '6 GB?': expected"),
    (lambda: simgpu.use_gpu_memory(-1), "not negative"),
    (lambda: simgpu.use_gpu_compute(150), "use_gpu_compute: percent 150: expected a number"),
    (lambda: simgpu.use_gpu_memory("1 GiB", gpu=-1), "gpu -1: expected the index"),
])
def test_bad_input_is_refused_naming_the_argument(folder: Path, call: object,
                                                  why: str) -> None:
    with pytest.raises(ValueError, match=why.replace("?", r"\?")):
        call()  # type: ignore[operator]
    assert not folder.exists() or not list(folder.iterdir())


def test_the_caller_sees_what_it_asked_and_release_clears_it(folder: Path) -> None:
    assert simgpu.use_gpu_memory("1.5 GiB")["memory_mib"] == 1536.0
    assert simgpu.use_gpu_compute(25) == {**simgpu.simulated_use(), "compute_pct": 25.0}
    assert simgpu.simulated_use()["memory_mib"] == 1536.0
    after = simgpu.release_gpu()
    assert (after["memory_mib"], after["compute_pct"]) == (0.0, 0.0)
    assert simgpu.simulated_use()["memory_mib"] == 0.0


def test_a_release_overrides_the_servers_simulated_kernel_memory(
    folder: Path, asking: list[subprocess.Popen[str]]
) -> None:
    """The server's ``simulated_kernel_memory_mib`` gives every kernel 6 GiB; a kernel that
    asks for 0 shows 0, and one that asks for 1 GiB shows 1 GiB, not 7."""
    zero, one = ask(asking, "0"), ask(asking, "1 GiB")
    sim = sampler([zero, one], folder)
    for pid in (zero, one):
        sim.set_process_memory(pid, 6144.0)
    assert shown(sim) == {one: ("GPU-a", 1024.0, 0.0)}
