"""Attribution: this server's GPUs, processes and kernels (real psutil trees)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from jupyter_gpushare.telemetry.attribution import (
    MODE_DEVICE_TOTALS,
    MODE_PROCESSES,
    KernelInfo,
    ProcessTree,
    attribute,
    collect_process_tree,
)
from jupyter_gpushare.telemetry.model import GPUSample, MIGSample, ProcessSample, Sample
from jupyter_gpushare.telemetry.simulated import SimulatedSampler

U0, U1 = "GPU-sim-n-0", "GPU-sim-n-1"


@pytest.fixture
def kernel_like() -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """A real child process that itself has a child (like a kernel with a worker)."""
    code = (
        "import subprocess, sys, time; "
        "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
        "print(c.pid, flush=True); time.sleep(60)"
    )
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert p.stdout is not None
    grandchild = int(p.stdout.readline())
    yield p, grandchild
    os.kill(grandchild, 9)
    p.kill()
    p.wait()


def test_real_process_tree_marks_kernel_subtree(kernel_like) -> None:
    proc, grandchild = kernel_like
    k = KernelInfo("k-1", proc.pid, "analysis.ipynb")
    tree = collect_process_tree(os.getpid(), [k])
    assert tree.owner[os.getpid()] is None
    assert tree.owner[proc.pid] == "k-1" and tree.owner[grandchild] == "k-1"
    assert 1 not in tree  # init is not ours


def test_processes_are_attributed_to_kernels_on_granted_gpus_only(kernel_like) -> None:
    proc, grandchild = kernel_like
    sim = SimulatedSampler(uuids=[U0, U1], background_load=False)
    sim.set_process_memory(proc.pid, 3000, U0, sm_util_pct=30)
    sim.set_process_memory(grandchild, 1000, U0, sm_util_pct=10)
    sim.set_process_memory(proc.pid, 7000, U1)  # not granted: ignored
    sim.set_process_memory(1, 5000, U0)  # someone else's process on our GPU
    k = KernelInfo("k-1", proc.pid, "analysis.ipynb")
    tree = collect_process_tree(os.getpid(), [k])
    att = attribute(sim.collect(), [U0], tree, [k])
    assert att.mode == MODE_PROCESSES and att.note is None
    (g,) = att.gpus
    assert g.uuid == U0
    assert g.own_memory_mib == 4000  # not the other user's 5000
    assert g.memory_used_mib == 9000  # device total includes them
    assert g.own_util_pct == 40
    (ku,) = att.kernels
    assert ku.memory_mib_by_gpu == {U0: 4000} and ku.kernel.label == "analysis.ipynb"
    assert {p.pid for p, _ in att.processes} == {proc.pid, grandchild}


def test_no_grant_means_all_gpus() -> None:
    s = SimulatedSampler(count=3).collect()
    att = attribute(s, [], ProcessTree(os.getpid(), {}))
    assert [g.uuid for g in att.gpus] == [g.uuid for g in s.gpus]


def test_missing_granted_gpu_is_reported() -> None:
    s = SimulatedSampler(uuids=[U0]).collect()
    att = attribute(s, [U0, "GPU-gone"], ProcessTree(1, {}))
    assert att.missing_uuids == ("GPU-gone",)


def test_hidden_host_pids_fall_back_to_device_totals() -> None:
    sim = SimulatedSampler(uuids=[U0], background_load=False)
    sim.set_process_memory(987654, 6000, U0)
    att = attribute(sim.collect(), [U0], ProcessTree(1, {1: None}), pid_exists=lambda p: False)
    assert att.mode == MODE_DEVICE_TOTALS
    assert att.note is not None and "hides the host's process ids" in att.note
    assert att.gpus[0].own_memory_mib == 6000 and att.kernels == ()
    assert att.to_dict()["mode"] == "device_totals"


def test_mig_uuid_grant_uses_mig_memory_and_processes() -> None:
    mig = MIGSample("MIG-abc", 0, 2000, 10000, "1g.10gb")
    gpu = GPUSample(0, "GPU-phys", "H100", 5000, 80000, None, None, 40, 100,
                    mig_mode=True, mig_devices=(mig, MIGSample("MIG-def", 1, 3000, 10000)))
    s = Sample(ts=1.0, gpus=(gpu,), processes=(
        ProcessSample(10, "MIG-abc", 1500), ProcessSample(11, "MIG-def", 3000)))
    att = attribute(s, ["MIG-abc"], ProcessTree(10, {10: None, 11: None}),
                    pid_exists=lambda p: True)
    (g,) = att.gpus
    assert (g.uuid, g.memory_total_mib, g.memory_used_mib, g.own_memory_mib) == (
        "MIG-abc", 10000, 2000, 1500,
    )
