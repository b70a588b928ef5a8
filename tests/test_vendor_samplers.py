"""AMD (amdsmi) and MetaX (mx-smi) samplers against recorded outputs.

The recorded outputs in tests/data/vendors/ are written from the vendors' documented
formats, not captured on hardware (see the README there). The AMD library is a stand-in
module put where ``import amdsmi`` finds it, answering from the recording; mx-smi is a
real executable script on PATH printing the recording, so the sampler's subprocess path
runs for real.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from jupyter_gpushare.telemetry.amd import AMDSMISampler, AMDSMIUnavailable
from jupyter_gpushare.telemetry.factory import AutoSampler, make_sampler
from jupyter_gpushare.telemetry.metax import MetaXSMISampler, MXSMIUnavailable, parse_mx_smi

DATA = Path(__file__).parent / "data" / "vendors"


# --------------------------------------------------------------------------- AMD


class AmdSmiLibraryException(Exception):
    pass


def fake_amdsmi(recording: dict[str, Any]) -> types.ModuleType:
    """A module with amdsmi's functions, answering from ``recording``."""
    devices = recording["devices"]
    mod = types.ModuleType("amdsmi")
    state = {"open": False}

    def dev(h: int, name: str) -> Any:
        if not state["open"]:
            raise AmdSmiLibraryException("not initialised")
        return devices[h][name]

    mod.AmdSmiLibraryException = AmdSmiLibraryException  # type: ignore[attr-defined]
    mod.AmdSmiInitFlags = types.SimpleNamespace(INIT_AMD_GPUS=2)  # type: ignore[attr-defined]
    mod.AmdSmiTemperatureType = types.SimpleNamespace(  # type: ignore[attr-defined]
        EDGE="EDGE", HOTSPOT="HOTSPOT")
    mod.AmdSmiTemperatureMetric = types.SimpleNamespace(  # type: ignore[attr-defined]
        CURRENT="CURRENT")

    def amdsmi_init(flags: int = 2) -> None:
        state["open"] = True

    def amdsmi_shut_down() -> None:
        state["open"] = False

    def temp(h: int, sensor: str, metric: str) -> Any:
        value = dev(h, "amdsmi_get_temp_metric")[sensor]
        if value == "N/A":
            raise AmdSmiLibraryException("AMDSMI_STATUS_NOT_SUPPORTED")
        return value

    mod.amdsmi_init = amdsmi_init  # type: ignore[attr-defined]
    mod.amdsmi_shut_down = amdsmi_shut_down  # type: ignore[attr-defined]
    mod.amdsmi_get_processor_handles = lambda: list(range(len(devices)))  # type: ignore
    mod.amdsmi_get_temp_metric = temp  # type: ignore[attr-defined]
    for name in ("amdsmi_get_gpu_asic_info", "amdsmi_get_gpu_device_uuid",
                 "amdsmi_get_gpu_vram_usage", "amdsmi_get_gpu_activity",
                 "amdsmi_get_power_info", "amdsmi_get_gpu_process_list"):
        setattr(mod, name, lambda h, _n=name: dev(h, _n))
    mod.state = state  # type: ignore[attr-defined]
    return mod


@pytest.fixture
def amdsmi(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    mod = fake_amdsmi(json.loads((DATA / "amdsmi-mi300x.json").read_text()))
    monkeypatch.setitem(sys.modules, "amdsmi", mod)
    return mod


def test_amd_module_never_imports_amdsmi_at_import_time() -> None:
    code = ("import sys, jupyter_gpushare.telemetry.amd, jupyter_gpushare.telemetry.factory;"
            "import jupyter_gpushare.telemetry.metax;"
            "print('amdsmi' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "False"


def test_amd_sampler_reads_recorded_mi300x(amdsmi: types.ModuleType) -> None:
    s = AMDSMISampler()
    s.setup()
    sample = s.collect()
    g0, g1 = sample.gpus
    assert (g0.vendor, g0.name, g0.uuid) == ("AMD", "AMD Instinct MI300X",
                                             "e7ff74a1-0000-1000-8030-1c2d3e4f5a6b")
    assert (g0.memory_used_mib, g0.memory_total_mib) == (40960, 196592)
    assert (g0.utilization_pct, g0.memory_bandwidth_pct) == (87, 41)
    assert (g0.power_w, g0.power_limit_w, g0.temperature_c) == (612, 750, 71)
    # N/A current power falls back to the average; no hotspot sensor -> edge
    assert (g1.power_w, g1.temperature_c, g1.utilization_pct) == (143, 38, 0)
    (proc,) = sample.processes
    assert (proc.pid, proc.gpu_uuid, proc.memory_used_mib) == (5150, g0.uuid, 40960)
    assert sample.source == "amdsmi" and not sample.simulated
    s.teardown()
    assert not amdsmi.state["open"]


def test_amd_sampler_without_library_or_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "amdsmi", None)  # import amdsmi -> ImportError
    with pytest.raises(AMDSMIUnavailable, match="not installed"):
        AMDSMISampler().setup()
    mod = fake_amdsmi({"devices": []})
    monkeypatch.setitem(sys.modules, "amdsmi", mod)
    with pytest.raises(AMDSMIUnavailable, match="sees no GPU"):
        AMDSMISampler().setup()
    assert not mod.state["open"]  # closed again


def test_amd_sampler_runs_in_its_thread(amdsmi: types.ModuleType) -> None:
    s = make_sampler("amd", interval_s=0.05)
    s.start()
    try:
        assert s.wait_ready(5) and s.setup_error is None
        for _ in range(100):
            if s.latest() is not None:
                break
            import time

            time.sleep(0.05)
        latest = s.latest()
        assert latest is not None and latest.gpus[0].vendor == "AMD"
    finally:
        s.stop()


# ------------------------------------------------------------------------- MetaX


def test_parse_mx_smi_two_c500() -> None:
    table = parse_mx_smi((DATA / "mx-smi-c500x2.txt").read_text())
    assert table.version == "2.1.12"
    g0, g1 = table.gpus
    assert (g0.vendor, g0.name, g0.uuid, g0.index) == ("MetaX", "MetaX C500",
                                                       "MetaX-0000:0f:00.0", 0)
    assert (g0.memory_used_mib, g0.memory_total_mib, g0.utilization_pct) == (17242, 65536, 35)
    assert (g0.temperature_c, g0.power_w, g0.power_limit_w) == (41, 128, 350)
    assert (g1.uuid, g1.memory_used_mib, g1.utilization_pct) == ("MetaX-0000:34:00.0", 858, 0)
    assert [(p.pid, p.gpu_uuid, p.memory_used_mib) for p in table.processes] == [
        (4242, g0.uuid, 16384), (4310, g0.uuid, 512)]
    # what the server extension answers says which card it is: vendor and model
    from jupyter_gpushare.telemetry.model import Sample

    answer = Sample(ts=0.0, gpus=table.gpus, source="mx-smi").to_dict()
    assert (answer["gpus"][0]["vendor"], answer["gpus"][0]["name"]) == ("MetaX", "MetaX C500")


def test_parse_mx_smi_idle_card_with_na_figures() -> None:
    table = parse_mx_smi((DATA / "mx-smi-c500-idle.txt").read_text())
    (g,) = table.gpus
    assert (g.utilization_pct, g.power_w, g.power_limit_w) == (None, None, 350)
    assert (g.memory_used_mib, g.memory_total_mib) == (0, 65536)
    assert table.processes == ()


def test_parse_mx_smi_of_something_else_finds_nothing() -> None:
    assert parse_mx_smi("command not found\n").gpus == ()


@pytest.fixture
def mx_smi_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A real ``mx-smi`` executable printing the recorded output."""
    script = tmp_path / "mx-smi"
    script.write_text(f"#!/bin/sh\ncat {DATA / 'mx-smi-c500x2.txt'}\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}")
    return script


def test_metax_sampler_runs_mx_smi(mx_smi_on_path: Path) -> None:
    s = MetaXSMISampler()
    s.setup()
    assert s.describe()["mx_smi_version"] == "2.1.12"
    sample = s.collect()
    assert sample.source == "mx-smi" and [g.name for g in sample.gpus] == ["MetaX C500"] * 2


def test_metax_sampler_without_mx_smi(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(MXSMIUnavailable, match="not on PATH"):
        MetaXSMISampler().setup()
    failing = tmp_path / "mx-smi"
    failing.write_text("#!/bin/sh\necho 'no device' >&2\nexit 3\n")
    failing.chmod(0o755)
    with pytest.raises(MXSMIUnavailable, match="exited 3: no device"):
        MetaXSMISampler().setup()


def test_auto_sampler_picks_metax_when_nvml_finds_nothing(
    mx_smi_on_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "amdsmi", None)
    import jupyter_gpushare.telemetry.nvml as nvml

    def no_nvml(self: object) -> None:
        raise nvml.NVMLUnavailable("no driver")

    monkeypatch.setattr(nvml.NVMLSampler, "setup", no_nvml)
    auto = AutoSampler()
    auto.setup()
    assert auto.source == "mx-smi" and auto.fallback_reason is None
    assert auto.collect().gpus[0].vendor == "MetaX"
