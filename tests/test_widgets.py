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
    assert row.memory_text.value == "11.2 GiB of 10.0 GiB your limit"
    assert row.util.value == 35 and row.util_text.value == "35 % of your 100 % share"
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
        assert row.memory.max >= 143771 and row.memory_text.value.endswith("card total")
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


SHARE = GrantInfo.from_env(
    {"GPUSHARE_GRANT_ID": "g2", "GPUSHARE_GPU_UUIDS": U, "GPUSHARE_MEMORY_LIMIT_MIB": "18022",
     "GPUSHARE_COMPUTE_PCT": "12.5", "GPUSHARE_PROFILE": "debug-eighth",
     "GPUSHARE_SIMULATED": "1", "GPUSHARE_GPU_MEMORY_MIB": "143771"}
)


def test_own_use_against_own_share_with_the_card_total_beside_it() -> None:
    """An idle share on a busy card: own compute 0 % of the 12.5 % share, card total apart."""
    sim = SimulatedSampler(uuids=[U], background_load=True)
    meter = GPUMeter(sampler=sim, grant=SHARE, autostart=False, server_pid=os.getpid(),
                     notices=lambda: [])
    sample = sim.collect()
    meter.update(sample)
    row = meter.rows[U]
    card = sample.gpus[0].utilization_pct
    assert card > 5  # others use the card
    assert row.util.value == 0 and row.util_text.value == "0 % of your 12.5 % share"
    assert row.util.max == 12.5
    assert row.memory_text.value == "0.0 GiB of 17.6 GiB your limit"
    assert "Whole card (all users)" in row.card_text.value
    assert f"compute {card:.0f} %" in row.card_text.value
    assert "your limit 17.6 GiB per GPU, 12.5 % compute" in meter.header.value
    meter.close()


def test_simulated_own_use_follows_what_the_process_really_computes() -> None:
    """Idle when nothing runs; a process that computes shows up, capped at its share."""
    import subprocess
    import sys
    import time

    from jupyter_gpushare.telemetry.attribution import attribute, collect_process_tree

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        pids = [child.pid]
        sim = SimulatedSampler(uuids=[U], background_load=True, own_pids=lambda: pids,
                               own_compute_pct=25)

        def own_util() -> float:
            s = sim.collect()
            att = attribute(s, [U], collect_process_tree(os.getpid(), []))
            return float(att.gpus[0].own_util_pct or 0.0)

        import psutil

        started, deadline = psutil.Process(child.pid), time.monotonic() + 20
        before = started.cpu_times()
        while time.monotonic() < deadline:  # the interpreter's own start-up is done
            time.sleep(0.3)
            now = started.cpu_times()
            if (now.user, now.system) == (before.user, before.system):
                break
            before = now
        own_util()
        time.sleep(0.5)
        assert own_util() == 0.0  # an idle process computes nothing
        pids = [busy.pid]
        own_util()
        time.sleep(1.5)
        got = own_util()
        assert 0.5 <= got <= 25.0, got  # computing: visible, and never above the share
    finally:
        for p in (child, busy):
            p.kill()
            p.wait(10)


def test_meter_shows_the_preemption_countdown() -> None:
    import time

    deadline = time.time() + 30
    notices = [{"grant_id": "g2", "kind": "preemption", "deadline_ts": deadline,
                "reason": "team nlp needs its guarantee back"}]
    sim = SimulatedSampler(uuids=[U], background_load=False)
    meter = GPUMeter(sampler=sim, grant=SHARE, autostart=False, server_pid=os.getpid(),
                     notices=lambda: notices)
    meter.refresh_notices()
    meter.update(sim.collect())
    assert "gpushare-preemption" in meter.notice.value
    assert "team nlp needs its guarantee back" in meter.notice.value
    import re

    first = int(re.search(r"\(in (\d+) s\)", meter.notice.value).group(1))
    assert 25 <= first <= 30
    notices[0]["deadline_ts"] = deadline - 10  # later samples count down
    meter.update(sim.collect())
    second = int(re.search(r"\(in (\d+) s\)", meter.notice.value).group(1))
    assert second < first
    notices.clear()
    meter.refresh_notices()
    meter.update(sim.collect())
    assert meter.notice.value == ""
    meter.close()


async def test_meter_reads_notices_from_the_broker() -> None:
    """The default notice source is the broker's /notices for the grant, with the token."""
    import asyncio

    from telemetry_fakes import TOKEN, FakeBroker

    from jupyter_gpushare.widgets import broker_notices

    b = FakeBroker()
    b.start()
    try:
        b.state.notices.append({"grant_id": "g2", "kind": "preemption",
                                "deadline": "2099-01-01T00:00:00+00:00", "reason": "r"})
        grant = GrantInfo.from_env({"GPUSHARE_GRANT_ID": "g2", "GPUSHARE_BROKER_URL": b.url})
        loop = asyncio.get_running_loop()
        got = await loop.run_in_executor(None, broker_notices(grant, TOKEN))
        assert [n["reason"] for n in got] == ["r"]
        assert await loop.run_in_executor(None, broker_notices(grant, "wrong")) == []
    finally:
        b.stop()
