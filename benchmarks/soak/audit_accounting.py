"""Audit checks of accounting and clients: GPU-hours conserved (the ledger and the report
against the integral of the grant intervals), no client 5xx that was not retried away, and
no heartbeat outside its grant's life."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from .audit_common import UNIT, Violation, grant_end
from .history import History


def recompute_gpu_hours(h: History, start: float, end: float) -> dict[str, float]:
    """GPU-hours per team/pool: the integral of the grant intervals within [start, end)."""
    hours: dict[str, float] = defaultdict(float)
    for g in h.rows.get("grants", []):
        lo = max(start, float(g["granted_at"]))
        hi = min(end, grant_end(g, end))
        if hi > lo:
            hours[f"{g['team']}/{g['pool']}"] += int(g["units_milli"]) / UNIT * (hi - lo) / 3600
    return dict(hours)


def check_gpu_hours(h: History) -> tuple[int, list[Violation]]:
    """The broker's ledger and the report's figures equal the recomputed integral."""
    tol = float(h.settings.get("gpu_hours_tolerance", 1e-4))
    checked, found = 0, []
    for source in ("ledger", "report"):
        fig = h.figures.get(source)
        if not fig:
            continue
        mine = recompute_gpu_hours(h, float(fig["start"]), float(fig["now"]))
        for key in sorted(set(mine) | set(fig["hours"])):
            checked += 1
            theirs, ours = float(fig["hours"].get(key, 0.0)), mine.get(key, 0.0)
            if abs(theirs - ours) > tol + 1e-6 * ours:
                found.append(
                    Violation(
                        "gpu_hours",
                        f"{source} says {theirs:.6f} GPU-h for "
                        f"{key}; the grant intervals give {ours:.6f}",
                        float(fig["now"]),
                        (),
                    )
                )
    return checked, found


def check_client_5xx(h: History) -> tuple[int, list[Violation]]:
    """No client got a 5xx (after the retries of the spawner or the lab), but from its own
    server while the broker's preemption stopped that server (announced to it, and checked
    by ``preemption_announced``): a stopped server cannot answer."""
    calls = [e for e in h.events if e["kind"] == "call" and e.get("counts", True)]
    found = [
        Violation(
            "client_5xx",
            f"{c['client']} got {c['status']} for {c['method']} "
            f"{c['path']}: {str(c.get('body', ''))[:160]}",
            float(c["t"]),
            (),
        )
        for c in calls
        if int(c["status"]) >= 500 and not _own_server_preempted(h, c)
    ]
    return len(calls), found


def _own_server_preempted(h: History, call: dict[str, Any]) -> bool:
    """Whether ``call`` went to its client's own server (``user/<client>/...``) and a
    preemption ended that server's grant while the call was under way."""
    user = str(call["client"])
    if not str(call.get("path", "")).startswith(f"user/{user}/"):
        return False
    t0 = float(call["t"])
    t1 = t0 + float(call.get("ms", 0.0)) / 1000
    return any(
        g["username"] == user
        and g["server"] == ""
        and g.get("end_kind") == "preempted"
        and g.get("released_at") is not None
        and float(g["granted_at"]) <= t1
        and t0 <= float(g["released_at"])
        for g in h.rows.get("grants", [])
    )


def check_heartbeats(h: History) -> tuple[int, list[Violation]]:
    """A heartbeat (a GPU in use) was only stored for a grant live at that moment."""
    slack = float(h.settings.get("clock_tolerance_s", 0.5))
    grants = {g["id"]: g for g in h.rows.get("grants", [])}
    beats = h.rows.get("heartbeats", [])
    found = []
    for b in beats:
        g = grants.get(b["grant_id"])
        ts = float(b["ts"])
        if g is None or not float(g["granted_at"]) - slack <= ts <= grant_end(g, h.ended) + slack:
            found.append(
                Violation(
                    "heartbeat",
                    f"heartbeat at {ts:.1f} for grant {b['grant_id']} outside its life",
                    ts,
                    (b["grant_id"],),
                )
            )
    return len(beats), found
