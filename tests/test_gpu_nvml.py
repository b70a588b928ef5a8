"""Real-GPU tests: NVML sampler, attribution and the watchdog on an NVIDIA GPU.

Device memory is allocated through the CUDA driver library (libcuda) with ctypes; no
deep-learning framework. Skipped, with the reason, where NVML finds no GPU.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from typing import Any

import pytest
import pytest_asyncio
from pytest_jupyter.jupyter_server import *  # noqa: F403 (fixtures)
from telemetry_fakes import EXT_CONFIG, grant_env, wait_until

from jupyter_gpushare.telemetry.attribution import (
    MODE_PROCESSES,
    KernelInfo,
    attribute,
    collect_process_tree,
)
from jupyter_gpushare.telemetry.nvml import NVMLSampler, probe_nvml
from jupyter_gpushare.telemetry.watchdog import LimitWatchdog

HAS_GPU, WHY = probe_nvml()
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not HAS_GPU, reason=f"no NVIDIA GPU: {WHY}"),
]


def alloc_code(mib: int) -> str:
    """Python that allocates ``mib`` MiB on CUDA device 0 through libcuda and keeps it."""
    return f"""
import ctypes
_cu = ctypes.CDLL("libcuda.so.1")
def _ck(r, what):
    if r != 0:
        raise RuntimeError(what + " failed: CUresult " + str(r))
_ck(_cu.cuInit(0), "cuInit")
_dev = ctypes.c_int()
_ck(_cu.cuDeviceGet(ctypes.byref(_dev), 0), "cuDeviceGet")
_ctx = ctypes.c_void_p()
_ck(_cu.cuDevicePrimaryCtxRetain(ctypes.byref(_ctx), _dev), "cuDevicePrimaryCtxRetain")
_ck(_cu.cuCtxSetCurrent(_ctx), "cuCtxSetCurrent")
_ptr = ctypes.c_uint64()
_ck(_cu.cuMemAlloc_v2(ctypes.byref(_ptr), ctypes.c_size_t({mib} << 20)), "cuMemAlloc")
print("allocated", flush=True)
"""


def first_sample(s: NVMLSampler, pred: Any = lambda x: True, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        x = s.latest()
        if x is not None and pred(x):
            return x
        time.sleep(0.05)
    raise AssertionError("no matching NVML sample")


def test_nvml_sampler_reads_the_gpu_in_its_thread() -> None:
    s = NVMLSampler(interval_s=0.2)
    s.start()
    try:
        assert s.wait_ready(60) and s.setup_error is None
        sample = first_sample(s)
    finally:
        s.stop()
    assert sample.simulated is False and sample.source == "nvml" and sample.gpus
    for g in sample.gpus:
        assert g.uuid.startswith("GPU-") and g.name
        assert g.memory_total_mib > 0 and 0 <= g.memory_used_mib <= g.memory_total_mib
        assert g.mig_mode or g.utilization_pct is not None
        assert g.temperature_c is None or 0 < g.temperature_c < 120
    assert s.describe()["driver_version"]


def test_attribution_finds_our_cuda_process() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", alloc_code(512) + "import time; time.sleep(120)"],
        stdout=subprocess.PIPE, text=True,
    )
    s = NVMLSampler(interval_s=0.2)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "allocated"
        s.start()
        sample = first_sample(
            s, lambda x: any(p.pid == child.pid for p in x.processes) or x.processes, 60
        )
        k = KernelInfo("k-gpu", child.pid, "gpu.ipynb")
        tree = collect_process_tree(os.getpid(), [k])
        att = attribute(sample, [], tree, [k])
        if att.mode == MODE_PROCESSES:
            (ku,) = att.kernels
            assert ku.memory_mib >= 512, att.to_dict()
            wd = LimitWatchdog(256, grace_samples=1)
            (v,) = wd.check(att, time.time())
            assert v.kernel_id == "k-gpu"
            assert v.message.startswith("GPU memory limit 0.2 GiB exceeded: kernel of gpu.ipynb")
        else:  # a container hiding host pids: device totals, said so
            assert att.note and "process ids" in att.note
            assert max(g.own_memory_mib for g in att.gpus) >= 512
    finally:
        s.stop()
        child.kill()
        child.wait()


# -- the watchdog in a real server on a real GPU -------------------------------------


@pytest_asyncio.fixture
async def jp_asyncio_loop():
    yield asyncio.get_running_loop()


def _gpu0_uuid() -> str:
    import pynvml

    pynvml.nvmlInit()
    try:
        u = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(0))
        return u.decode() if isinstance(u, bytes) else str(u)
    finally:
        pynvml.nvmlShutdown()


@pytest.fixture
def jp_server_config(monkeypatch: Any) -> dict[str, Any]:
    grant_env(monkeypatch, None, GPUSHARE_GPU_UUIDS=_gpu0_uuid(), GPUSHARE_SIMULATED="0",
              GPUSHARE_MEMORY_LIMIT_MIB="1024", GPUSHARE_ENFORCEMENT="env")
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    return {**EXT_CONFIG, "GPUShareServerApp": {
        "sampler": "nvml", "sample_interval_s": 0.2, "watchdog_action": "restart",
        "watchdog_cooldown_s": 600}}


async def test_watchdog_restarts_a_real_kernel_over_its_gpu_limit(
    jp_serverapp: Any, jp_fetch: Any
) -> None:
    body = {"path": "gpu.ipynb", "name": "gpu.ipynb", "type": "notebook",
            "kernel": {"name": "python3"}}
    kid = json.loads(
        (await jp_fetch("api", "sessions", method="POST", body=json.dumps(body))).body
    )["kernel"]["id"]
    km = jp_serverapp.kernel_manager
    old_pid = km.get_kernel(kid).provisioner.process.pid
    svc = jp_serverapp.web_app.settings["gpushare_service"]
    await svc.start()
    client = km.get_kernel(kid).client()
    client.start_channels()
    try:
        await client.wait_for_ready(timeout=60)
        client.execute(alloc_code(2048))
        ev = await wait_until(lambda: svc.events and svc.events[-1], 120, "watchdog event")
    finally:
        client.stop_channels()
    m = json.loads((await jp_fetch("gpushare", "api", "metrics")).body)
    assert m["simulated"] is False and m["source"] == "nvml"
    if m["attribution"]["mode"] != MODE_PROCESSES:
        pytest.skip(f"cannot attribute per process here: {m['attribution']['note']}")
    assert ev["message"].startswith(
        "GPU memory limit 1.0 GiB exceeded: kernel of gpu.ipynb used "
    ) and ev["message"].endswith("; the kernel was restarted")
    assert ev["used_mib"] > 2048 and ev["kernel_id"] == kid
    await wait_until(lambda: km.get_kernel(kid).provisioner.process.pid != old_pid, 60,
                     "kernel restarted")
