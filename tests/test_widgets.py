"""GPUMeter: ipywidgets bars of memory against the limit and utilisation."""

from __future__ import annotations

import os
import threading

import ipywidgets as w

from jupyter_gpushare.telemetry.grant import GrantInfo
from jupyter_gpushare.telemetry.simulated import SimulatedSampler
from jupyter_gpushare.widgets import GPUMeter

U = "GPU-sim-n-0"
GRANT = GrantInfo.from_env(
    {"GPUSHARE_GRANT_ID": "g1", "GPUSHARE_GPU_UUIDS": U, "GPUSHARE_MEMORY_LIMIT_MIB": "10240",
     "GPUSHARE_PROFILE": "inference-dev", "GPUSHARE_SIMULATED": "1"}
)


def test_bars_show_own_memory_against_limit_and_are_labelled_simulated() -> None:
    sim = SimulatedSampler(uuids=[U], background_load=False)
    meter = GPUMeter(sampler=sim, grant=GRANT, autostart=False, server_pid=os.getpid())
    sim.set_process_memory(os.getpid(), 11.2 * 1024, U, sm_util_pct=35)
    meter.update(sim.collect())
    assert isinstance(meter, w.VBox)
    assert "SIMULATED" in meter.header.value and "limit 10.0 GiB" in meter.header.value
    row = meter.rows[U]
    assert isinstance(row.memory, w.FloatProgress) and isinstance(row.util, w.FloatProgress)
    assert row.memory.value == 11.2 * 1024 and row.memory.bar_style == "danger"
    assert row.memory_text.value == "11.2 GiB of 10.0 GiB limit"
    assert row.util.value == 35 and row.util_text.value == "35 %"
    assert "(simulated)" in row.title.value
    sim.set_process_memory(os.getpid(), 2048, U, sm_util_pct=5)
    meter.update(sim.collect())
    assert row.memory.bar_style == "success" and row.memory_text.value.startswith("2.0 GiB")
    meter.close()


def test_no_grant_shows_all_gpus_against_their_total() -> None:
    sim = SimulatedSampler(count=2)
    meter = GPUMeter(sampler=sim, grant=GrantInfo(), autostart=False)
    meter.update(sim.collect())
    assert len(meter.rows) == 2 and "no grant" in meter.header.value
    for row in meter.rows.values():
        assert row.memory.max >= 143771 and row.memory_text.value.endswith("total")
    meter.close()


def test_default_meter_updates_live_from_a_background_thread(monkeypatch) -> None:
    for k in list(os.environ):
        if k.startswith("GPUSHARE_"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("GPUSHARE_SIMULATED", "1")
    meter = GPUMeter(interval_s=0.02)
    got = threading.Event()
    meter.sampler.add_listener(lambda s: got.set() if meter.sampler.ticks >= 3 else None)
    try:
        assert got.wait(30)
    finally:
        meter.close()
    assert not meter.sampler.running
    assert len(meter.rows) == 2 and "SIMULATED" in meter.header.value
    assert all(r.util.value > 0 for r in meter.rows.values())
