"""Samplers: ring buffer, background thread, simulated GPUs, NVML fallback."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jupyter_gpushare.telemetry.factory import AutoSampler, make_sampler, underlying
from jupyter_gpushare.telemetry.model import Sample
from jupyter_gpushare.telemetry.nvml import NVMLSampler, NVMLUnavailable, probe_nvml
from jupyter_gpushare.telemetry.sampler import RingBuffer, capacity_for
from jupyter_gpushare.telemetry.simulated import SimulatedSampler

HAS_GPU, GPU_REASON = probe_nvml()


def _s(ts: float) -> Sample:
    return Sample(ts=ts, gpus=())


@given(st.integers(1, 50), st.lists(st.floats(0, 1e6), max_size=200))
def test_ring_buffer_keeps_newest(capacity: int, stamps: list[float]) -> None:
    rb = RingBuffer(capacity)
    for t in stamps:
        rb.append(_s(t))
    assert [s.ts for s in rb.snapshot()] == stamps[-capacity:] if stamps else rb.latest() is None
    assert len(rb) == min(capacity, len(stamps))


def test_ring_buffer_since_and_capacity() -> None:
    rb = RingBuffer(3)
    for t in range(5):
        rb.append(_s(float(t)))
    assert [s.ts for s in rb.snapshot(since=2.0)] == [3.0, 4.0]
    assert capacity_for(900, 1.0) == 900 and capacity_for(900, 0.5) == 1800
    with pytest.raises(ValueError):
        RingBuffer(0)


def test_default_history_is_fifteen_minutes_at_one_hertz() -> None:
    s = SimulatedSampler()
    assert s.interval_s == 1.0 and s.buffer.capacity == 900


def test_simulated_defaults_are_two_h200_sim_and_marked() -> None:
    sample = SimulatedSampler().collect()
    assert sample.simulated and sample.source == "simulated"
    assert [g.name for g in sample.gpus] == ["H200-sim", "H200-sim"]
    assert all(g.memory_total_mib == 143771 for g in sample.gpus)
    for g in sample.gpus:
        assert 0 <= (g.utilization_pct or 0) <= 100
        assert 0 <= g.memory_used_mib <= g.memory_total_mib
    assert sample.to_dict()["simulated"] is True


def test_simulated_inventory_from_grant_uuids_and_process_hook() -> None:
    uuids = ["GPU-sim-node0-3", "GPU-sim-node0-5"]
    sim = SimulatedSampler(uuids=uuids, background_load=False)
    sim.set_process_memory(1234, 5000, "GPU-sim-node0-5", sm_util_pct=40)
    s = sim.collect()
    assert [g.uuid for g in s.gpus] == uuids
    assert s.gpu("GPU-sim-node0-5").memory_used_mib == 5000  # type: ignore[union-attr]
    assert s.gpu("GPU-sim-node0-3").memory_used_mib == 0  # type: ignore[union-attr]
    (p,) = s.processes
    assert (p.pid, p.gpu_uuid, p.memory_used_mib, p.sm_util_pct) == (
        1234, "GPU-sim-node0-5", 5000, 40,
    )
    sim.set_process_memory(1234, 0, "GPU-sim-node0-5")
    assert sim.collect().processes == ()
    with pytest.raises(ValueError):
        sim.set_process_memory(1, 10, "GPU-real-0")


def test_background_thread_fills_history_and_calls_listeners() -> None:
    sim = SimulatedSampler(interval_s=0.02, history_s=0.1)  # capacity 5
    seen: list[Sample] = []
    threads: set[str] = set()
    got = threading.Event()

    def listener(s: Sample) -> None:
        seen.append(s)
        threads.add(threading.current_thread().name)
        if len(seen) >= 8:
            got.set()

    sim.add_listener(listener)
    sim.start()
    try:
        assert got.wait(30)
    finally:
        sim.stop()
    assert not sim.running
    assert threads == {"gpushare-sampler-simulated"}
    hist = sim.history()
    assert len(hist) == 5 and hist == sorted(hist, key=lambda s: s.ts)
    assert sim.ticks >= 8 and sim.cpu_seconds > 0


def test_broken_listener_does_not_stop_sampling() -> None:
    sim = SimulatedSampler(interval_s=0.01)
    ok = threading.Event()
    sim.add_listener(lambda s: 1 / 0)
    sim.add_listener(lambda s: ok.set() if sim.ticks >= 3 else None)
    sim.start()
    try:
        assert ok.wait(30)
    finally:
        sim.stop()


def test_importing_telemetry_does_not_load_or_call_nvml() -> None:
    code = (
        "import sys, jupyter_gpushare.telemetry, jupyter_gpushare.serverextension, "
        "jupyter_gpushare.widgets; print('pynvml' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_make_sampler_kinds() -> None:
    assert isinstance(make_sampler("simulated"), SimulatedSampler)
    assert isinstance(make_sampler("nvml"), NVMLSampler)
    assert isinstance(make_sampler("auto"), AutoSampler)
    with pytest.raises(ValueError):
        make_sampler("cuda")


@pytest.mark.skipif(HAS_GPU, reason="a GPU is present: the no-GPU path is not reachable")
def test_without_gpu_nvml_fails_clearly_and_auto_falls_back_to_simulated() -> None:
    with pytest.raises(NVMLUnavailable):
        NVMLSampler().setup()
    auto = AutoSampler(interval_s=0.02, simulated_uuids=["GPU-sim-x-0"])
    auto.start()
    try:
        assert auto.wait_ready(30)
        while auto.latest() is None:
            time.sleep(0.01)
    finally:
        auto.stop()
    s = auto.latest()
    assert s is not None and s.simulated and auto.simulated
    assert [g.uuid for g in s.gpus] == ["GPU-sim-x-0"]
    assert any("NVML found no GPU" in n for n in s.notes)
    assert isinstance(underlying(auto), SimulatedSampler)
    assert auto.describe()["fallback_reason"]


@pytest.mark.skipif(HAS_GPU, reason="a GPU is present")
def test_nvml_sampler_thread_records_setup_error_without_gpu() -> None:
    s = NVMLSampler(interval_s=0.05)
    s.start()
    assert s.wait_ready(30)
    s.stop()
    assert s.setup_error and s.latest() is None
