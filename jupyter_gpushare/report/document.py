"""One JSON-able document of a month's report, shared by every output format.

Numbers are rounded once here (:func:`num`), so the JSON, CSV, Markdown and HTML outputs
show the same figures to the digit.
"""

from __future__ import annotations

from dataclasses import asdict
from datetime import datetime, timezone
from typing import Any

from .figures import MonthFigures
from .rule import Recommendation, RuleConfig

DIGITS = 4

TEAM_COLUMNS: tuple[tuple[str, str], ...] = (
    ("guaranteed_units", "guaranteed (units)"),
    ("guaranteed_gpu_hours", "guaranteed GPU-h"),
    ("granted_gpu_hours", "granted GPU-h"),
    ("borrowed_gpu_hours", "borrowed GPU-h"),
    ("lent_gpu_hours", "lent GPU-h"),
    ("measured_gpu_hours", "measured GPU-h"),
    ("used_gpu_hours", "used GPU-h (by utilisation)"),
    ("idle_share", "idle share"),
    ("queued_gpu_hours", "queued GPU-h"),
    ("refused_gpu_hours", "refused GPU-h"),
    ("requests", "requests"),
    ("grants", "grants"),
    ("queue_wait_median_s", "queue wait median (s)"),
    ("queue_wait_p95_s", "queue wait p95 (s)"),
    ("refusals", "refusals by reason"),
    ("preemptions", "preemptions by reason"),
    ("culled", "culled idle"),
    ("data_bound_sessions", "data-bound sessions"),
    ("data_bound_gpu_hours", "data-bound GPU-h"),
    ("budget_gpu_hours", "budget GPU-h"),
    ("budget_used_share", "budget used"),
)

POOL_COLUMNS: tuple[tuple[str, str], ...] = (
    ("gpus", "GPUs"),
    ("capacity_units", "capacity (units)"),
    ("capacity_gpu_hours", "capacity GPU-h"),
    ("guaranteed_gpu_hours", "guaranteed GPU-h"),
    ("granted_gpu_hours", "granted GPU-h"),
    ("borrowed_gpu_hours", "borrowed GPU-h"),
    ("queued_gpu_hours", "queued GPU-h"),
    ("refused_gpu_hours", "refused GPU-h"),
    ("demand_gpu_hours", "demand GPU-h"),
    ("demand_share", "demand / capacity"),
    ("occupancy", "granted / capacity"),
    ("measured_gpu_hours", "measured GPU-h"),
    ("used_gpu_hours", "used GPU-h"),
    ("utilisation", "utilisation"),
    ("idle_share", "idle share"),
    ("queue_wait_median_s", "queue wait median (s)"),
    ("queue_wait_p95_s", "queue wait p95 (s)"),
    ("refusals", "refusals by reason"),
    ("preemptions", "preemptions by reason"),
    ("culled", "culled idle"),
    ("data_bound_sessions", "data-bound sessions"),
)

POWER_COLUMNS: tuple[tuple[str, str], ...] = (
    ("pool", "pool"),
    ("hours", "hours"),
    ("peak_w", "peak W"),
    ("average_w", "average W"),
    ("peak_to_average", "peak / average"),
)


def rnd(value: Any) -> Any:
    """Round floats (also inside dicts and lists) to :data:`DIGITS` decimals."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, float):
        r = round(value, DIGITS)
        return 0.0 if r == 0 else r
    if isinstance(value, dict):
        return {k: rnd(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [rnd(v) for v in value]
    return value


def num(value: Any) -> str:
    """The text of one figure, as every text format writes it: at most :data:`DIGITS`
    decimals, trailing zeros of the fraction dropped (never of the integer part: 2000
    stays "2000", 1500.0 is "1500", 0.50 is "0.5", -0.00001 is "0")."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, dict):
        return "; ".join(f"{k}: {num(v)}" for k, v in sorted(value.items()))
    if isinstance(value, float):
        text = f"{round(value, DIGITS):.{DIGITS}f}"
        if "." in text:  # (always, with DIGITS > 0; the guard keeps the integer part whole)
            text = text.rstrip("0").rstrip(".")
        return "0" if text in ("-0", "") else text
    return str(value)


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=timezone.utc).isoformat().replace("+00:00", "Z")


def _projection(month: MonthFigures) -> dict[str, Any] | None:
    """The labelled projection of a partial month (``None`` for a finished month)."""
    p = month.projection
    if p is None:
        return None
    return {
        "label": "projection to the month's end (linear extrapolation of the elapsed "
        "figures; not a measurement)",
        "factor": p.factor,
        "granted_gpu_hours": dict(p.granted_gpu_hours),
        "budget_share": dict(p.budget_share),
    }


def build(
    month: MonthFigures, recommendations: list[Recommendation], rule: RuleConfig
) -> dict[str, Any]:
    """The report as one dict of plain values (rounded)."""
    teams = []
    for f in month.teams:
        row: dict[str, Any] = {"team": f.team, "pool": f.pool}
        row.update({k: getattr(f, k) for k, _ in TEAM_COLUMNS})
        row["borrow_limit_units"] = f.borrow_limit_units
        teams.append(row)
    pools = []
    for p in month.pools:
        prow: dict[str, Any] = {"pool": p.pool}
        prow.update({k: getattr(p, k) for k, _ in POOL_COLUMNS})
        pools.append(prow)
    power = []
    for n in month.power:
        nrow: dict[str, Any] = {"node": n.node}
        nrow.update({k: getattr(n, k) for k, _ in POWER_COLUMNS})
        power.append(nrow)
    start, until = _iso(month.start), _iso(month.until or month.end)
    doc = {
        "month": month.month,
        "start": start,
        "end": _iso(month.end),
        # a month in progress: every figure stops at `until` (the report's now)
        "partial": month.partial,
        "until": until,
        "period": f"partial: {start} to {until}" if month.partial else f"{start} to {until}",
        "hours": month.hours,
        "month_hours": month.month_hours or month.hours,
        "elapsed_share": month.elapsed_share,
        "policy_version": month.policy_version,
        "teams": teams,
        "pools": pools,
        "power": power,
        "power_note": month.power_note,
        "recommendations": [asdict(r) for r in recommendations],
        "rule": asdict(rule),
        "thresholds": asdict(month.thresholds),
        "series": asdict(month.series),
        "projection": _projection(month),
    }
    return rnd(doc)  # type: ignore[no-any-return]
