"""Low-utilisation hint: GPU memory held while compute sits idle (pure logic).

A card holding memory with compute utilisation under 20 % for a sustained window
usually waits on its input pipeline: a likely data-loading bottleneck.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from .attribution import Attribution

DEFAULT_THRESHOLD_PCT = 20.0
DEFAULT_WINDOW_S = 300.0
DEFAULT_MIN_MEMORY_MIB = 1024.0


@dataclass(frozen=True, slots=True)
class UsagePoint:
    """This server's use of one granted GPU at one instant."""

    ts: float
    uuid: str
    memory_mib: float
    util_pct: float | None
    basis: str  # "process" (this server's processes) or "device" (whole GPU)


def usage_points(ts: float, att: Attribution) -> list[UsagePoint]:
    """One point per granted GPU, preferring this server's own utilisation."""
    out = []
    for g in att.gpus:
        util: float | None
        if g.own_util_pct is not None and att.mode == "processes":
            util, basis = g.own_util_pct, "process"
        else:
            util, basis = g.gpu.utilization_pct, "device"
        out.append(UsagePoint(ts, g.uuid, g.own_memory_mib, util, basis))
    return out


@dataclass(frozen=True)
class LowUtilHint:
    """The figures behind a "likely data-loading bottleneck" flag."""

    gpu_uuid: str
    kind: str
    message: str
    window_s: float
    samples: int
    threshold_pct: float
    mean_util_pct: float
    max_util_pct: float
    share_under_threshold: float
    mean_memory_mib: float
    min_memory_mib: float
    basis: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _hint_for(
    uuid: str,
    pts: Sequence[UsagePoint],
    window_s: float,
    threshold_pct: float,
    min_memory_mib: float,
) -> LowUtilHint | None:
    utils = [p.util_pct for p in pts if p.util_pct is not None]
    if len(utils) < 3 or len(utils) < len(pts) * 0.8:
        return None
    mems = [p.memory_mib for p in pts]
    if min(mems) < min_memory_mib:
        return None
    mean_u = sum(utils) / len(utils)
    under = sum(1 for u in utils if u < threshold_pct) / len(utils)
    if mean_u >= threshold_pct or under < 0.8:
        return None
    mean_m = sum(mems) / len(mems)
    return LowUtilHint(
        gpu_uuid=uuid,
        kind="low_utilization",
        message=(
            f"GPU memory held ({mean_m / 1024:.1f} GiB) with compute utilisation "
            f"{mean_u:.0f} % (under {threshold_pct:.0f} %) for {window_s / 60:.0f} min: "
            "likely a data-loading bottleneck (input pipeline, CPU preprocessing or I/O)"
        ),
        window_s=window_s,
        samples=len(pts),
        threshold_pct=threshold_pct,
        mean_util_pct=round(mean_u, 1),
        max_util_pct=round(max(utils), 1),
        share_under_threshold=round(under, 3),
        mean_memory_mib=round(mean_m, 1),
        min_memory_mib=round(min(mems), 1),
        basis=pts[-1].basis,
    )


def low_util_hints(
    points: Iterable[UsagePoint],
    now: float,
    window_s: float = DEFAULT_WINDOW_S,
    threshold_pct: float = DEFAULT_THRESHOLD_PCT,
    min_memory_mib: float = DEFAULT_MIN_MEMORY_MIB,
    interval_s: float = 1.0,
) -> list[LowUtilHint]:
    """Hints for GPUs whose window is fully covered and idle while holding memory."""
    start = now - window_s
    by_gpu: dict[str, list[UsagePoint]] = {}
    for p in points:
        if p.ts >= start - interval_s / 2:
            by_gpu.setdefault(p.uuid, []).append(p)
    hints = []
    for uuid, pts in by_gpu.items():
        pts.sort(key=lambda p: p.ts)
        if pts[0].ts > start + max(interval_s * 1.5, window_s * 0.05):
            continue  # window not covered yet
        h = _hint_for(uuid, pts, window_s, threshold_pct, min_memory_mib)
        if h:
            hints.append(h)
    return hints
