"""Watchdog decisions and low-utilisation hints (pure logic)."""

from __future__ import annotations

from jupyter_gpushare.telemetry.attribution import KernelInfo, ProcessTree, attribute
from jupyter_gpushare.telemetry.hints import UsagePoint, low_util_hints, usage_points
from jupyter_gpushare.telemetry.simulated import SimulatedSampler
from jupyter_gpushare.telemetry.watchdog import LimitWatchdog, violation_message

U = "GPU-sim-n-0"
LIMIT = 10240


def _att(mem_by_pid: dict[int, float], kernels: list[KernelInfo]):
    sim = SimulatedSampler(uuids=[U], background_load=False)
    for pid, mib in mem_by_pid.items():
        sim.set_process_memory(pid, mib, U)
    owner = {k.pid: k.kernel_id for k in kernels if k.pid}
    return attribute(sim.collect(), [U], ProcessTree(1, owner), kernels, lambda p: True)


def test_message_matches_the_issue() -> None:
    assert violation_message(10240, "analysis.ipynb", 11.2 * 1024, 11.2 * 1024, U) == (
        "GPU memory limit 10.0 GiB exceeded: kernel of analysis.ipynb used 11.2 GiB"
    )


def test_grace_then_act_then_cooldown() -> None:
    k = KernelInfo("k1", 100, "analysis.ipynb")
    over = _att({100: 11.2 * 1024}, [k])
    wd = LimitWatchdog(LIMIT, grace_samples=2, cooldown_s=10)
    assert wd.check(over, 0.0) == []  # first over-limit sample: grace
    (v,) = wd.check(over, 1.0)
    assert v.kernel_id == "k1" and v.path == "analysis.ipynb" and v.limit_mib == LIMIT
    assert v.message == "GPU memory limit 10.0 GiB exceeded: kernel of analysis.ipynb used 11.2 GiB"
    assert wd.check(over, 5.0) == []  # cooldown
    assert len(wd.check(over, 11.5)) == 1


def test_under_limit_resets_the_count() -> None:
    k = KernelInfo("k1", 100, "a.ipynb")
    over, under = _att({100: 12000}, [k]), _att({100: 9000}, [k])
    wd = LimitWatchdog(LIMIT, grace_samples=2)
    assert wd.check(over, 0) == [] and wd.check(under, 1) == [] and wd.check(over, 2) == []
    assert len(wd.check(over, 3)) == 1


def test_two_kernels_together_over_the_limit_stop_the_biggest() -> None:
    a, b = KernelInfo("ka", 100, "a.ipynb"), KernelInfo("kb", 200, "b.ipynb")
    att = _att({100: 6000, 200: 5000}, [a, b])
    (v,) = LimitWatchdog(LIMIT, grace_samples=1).check(att, 0)
    assert v.kernel_id == "ka"
    assert v.message == (
        "GPU memory limit 10.0 GiB exceeded: kernel of a.ipynb used 5.9 GiB "
        f"(this server used 10.7 GiB in all on {U})"
    )


def test_device_totals_mode_never_acts() -> None:
    sim = SimulatedSampler(uuids=[U], background_load=False)
    sim.set_process_memory(5, 50000, U)
    att = attribute(sim.collect(), [U], ProcessTree(1, {}), [], lambda p: False)
    assert LimitWatchdog(LIMIT, grace_samples=1).check(att, 0) == []


def _points(n: int, util: float, mem: float, start: float = 0.0) -> list[UsagePoint]:
    return [UsagePoint(start + i, U, mem, util, "process") for i in range(n)]


def test_low_util_hint_after_a_covered_window() -> None:
    pts = _points(301, 12.0, 20000)
    (h,) = low_util_hints(pts, now=300.0, window_s=300, threshold_pct=20)
    assert h.gpu_uuid == U and h.kind == "low_utilization"
    assert h.mean_util_pct == 12.0 and h.mean_memory_mib == 20000 and h.samples >= 300
    assert "data-loading bottleneck" in h.message and h.basis == "process"


def test_no_hint_before_window_is_covered_busy_or_without_memory() -> None:
    assert low_util_hints(_points(100, 5, 20000, start=200), now=300.0, window_s=300) == []
    assert low_util_hints(_points(301, 60, 20000), now=300.0, window_s=300) == []
    assert low_util_hints(_points(301, 5, 100), now=300.0, window_s=300) == []


def test_usage_points_prefer_process_utilisation() -> None:
    k = KernelInfo("k1", 100, "a.ipynb")
    sim = SimulatedSampler(uuids=[U], background_load=True)
    sim.set_process_memory(100, 4000, U, sm_util_pct=7)
    att = attribute(sim.collect(), [U], ProcessTree(1, {100: "k1"}), [k], lambda p: True)
    (p,) = usage_points(5.0, att)
    assert (p.util_pct, p.basis, p.memory_mib) == (7, "process", 4000)
