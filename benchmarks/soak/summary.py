"""The printed summary of a soak run: faults by kind, invariants checked, each violation with
the history around it, recovery per fault kind, admission latency during faults, GPU-hours,
and the last line ``violations: N``."""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from typing import Any

from .audit import Outcome, Violation, recompute_gpu_hours
from .history import History

AROUND_S = 5.0  # history shown either side of a violation
MONTH_H = 30 * 24.0


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))]


def around(h: History, v: Violation) -> list[str]:
    """The events within AROUND_S of the violation and the stored rows it names."""
    lines = [
        f"    {e['t'] - h.started:8.2f}s {e['kind']}: "
        + json.dumps(
            {k: x for k, x in e.items() if k not in ("t", "kind", "servers")}, default=str
        )[:200]
        for e in h.events
        if abs(float(e["t"]) - v.t) <= AROUND_S and _telling(e)
    ][:20]
    for table in ("grants", "requests", "jobs"):
        for row in h.rows.get(table, []):
            if row["id"] in v.refs:
                lines.append(f"    row {table}: " + json.dumps(row, default=str)[:400])
    return lines


def _telling(e: dict[str, Any]) -> bool:
    """Events worth showing around a violation: not snapshots nor calls that went well."""
    if e["kind"] in ("hub_snapshot", "admission"):
        return False
    return not (e["kind"] == "call" and int(e.get("status", 0)) < 400)


def recovery(h: History) -> dict[str, tuple[int, float, float]]:
    """fault kind -> (faults, median, max seconds to recover)."""
    took: dict[str, list[float]] = defaultdict(list)
    for e in h.events:
        if e["kind"] == "fault" and e.get("recovered_s") is not None:
            took[e["fault"]].append(float(e["recovered_s"]))
    return {k: (len(v), statistics.median(v), max(v)) for k, v in sorted(took.items())}


def render(h: History, out: Outcome) -> str:
    faults: dict[str, int] = defaultdict(int)
    for e in h.events:
        if e["kind"] == "fault":
            faults[e["fault"]] += 1
    run_h = max(h.ended - h.started, 1e-9) / 3600
    lines = [
        f"soak: seed {h.seed}, {run_h * 60:.1f} min of real time standing for a month "
        f"(x{MONTH_H / run_h:,.0f}; the broker's clock runs at real time)",
        f"stack: broker {h.settings.get('broker', 'managed')} "
        f"({'outside the hub' if h.settings.get('broker') == 'outside' else 'the hub starts it'}),"
        f" database {h.settings.get('db', 'sqlite')}, jobs on "
        f"{'a real Slurm cluster' if h.settings.get('slurm') else 'the local batch backend'}, "
        f"proxy {'run apart' if h.settings.get('proxy') == 'outside' else 'started by the hub'}",
    ]
    lines.append(
        "faults injected: " + (", ".join(f"{k} {n}" for k, n in sorted(faults.items())) or "none")
    )
    for kind, (n, med, worst) in recovery(h).items():
        lines.append(f"  recovery after {kind}: median {med:.2f} s, max {worst:.2f} s ({n})")
    adm = [e for e in h.events if e["kind"] == "admission"]
    during = [float(e["ms"]) for e in adm if e.get("in_fault")]
    calm = [float(e["ms"]) for e in adm if not e.get("in_fault")]
    lines.append(
        f"admission latency: p99 {percentile(during, 99):.1f} ms during faults "
        f"({len(during)} probes), p99 {percentile(calm, 99):.1f} ms outside "
        f"({len(calm)} probes)"
    )
    by_kind: dict[str, list[float]] = defaultdict(list)
    for e in adm:
        if e.get("fault"):
            by_kind[e["fault"]].append(float(e["ms"]))
    for kind, values in sorted(by_kind.items()):
        lines.append(
            f"  admission p99 during {kind} faults: {percentile(values, 99):.1f} ms "
            f"({len(values)} probes)"
        )
    excused = [
        e
        for e in h.events
        if e["kind"] == "call" and not e.get("counts", True) and int(e["status"]) >= 500
    ]
    if excused:
        kinds = sorted({f"{e['status']} {e.get('what', e['method'])}" for e in excused})
        lines.append(
            f"5xx or no answer during a fault of the part asked (not counted): "
            f"{len(excused)} ({', '.join(kinds)})"
        )
    rounds = [e for e in h.events if e["kind"] == "reclaim"]
    if rounds:
        waited = [float(e["owner_waited_s"]) for e in rounds if e.get("admitted")]
        lines.append(
            f"reclaims: {len(rounds)} rounds, the owner admitted in {len(waited)}"
            + (
                f" (median {statistics.median(waited):.2f} s, max {max(waited):.2f} s)"
                if waited
                else ""
            )
        )
    hours = recompute_gpu_hours(h, h.started, h.ended)
    total = sum(hours.values())
    lines.append(
        f"GPU-hours recomputed from the grant intervals: {total:.4f} GPU-h in the run "
        f"= {total * MONTH_H / run_h:,.1f} GPU-h for the compressed month"
    )
    for name, n in out.checked.items():
        bad = sum(1 for v in out.violations if _check_of(v) == name)
        lines.append(f"  checked {name}: {n} cases, {bad} violations")
    for v in out.violations:
        lines.append(f"VIOLATION {v.check} at {v.t - h.started:.2f}s: {v.detail}")
        lines.extend(around(h, v))
    lines.append(f"violations: {len(out.violations)}")
    return "\n".join(lines)


CHECK_OF = {
    "capacity": "capacity",
    "team_limit": "team_and_user_limits",
    "user_cap": "team_and_user_limits",
    "admission": "admission_in_guarantee",
    "server_grant": "one_grant_per_server",
    "grant_outlived": "one_grant_per_server",
    "preemption_notice": "preemption_announced",
    "gpu_hours": "gpu_hours_conserved",
    "client_5xx": "no_client_5xx",
    "heartbeat": "heartbeats_in_grant_life",
    "job_end": "jobs_end_once",
    "job_twice": "jobs_run_once",
    "job_resume": "jobs_resume_from_checkpoint",
}


def _check_of(v: Violation) -> str:
    return CHECK_OF.get(v.check, v.check)


def figures_of(out: Outcome) -> dict[str, Any]:
    return {"violations": len(out.violations), "checked": out.checked}
