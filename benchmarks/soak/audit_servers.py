"""Audit checks of servers and preemption: every running server holds exactly one live grant
(none for a CPU-only profile), no grant outlives its holder longer than a reconcile interval,
and every preemption is announced before it is carried out, with the grace period."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from .audit_common import Violation, grant_end
from .history import History


def _servers_at(snap: dict[str, Any]) -> dict[str, str]:
    """user/server -> profile of the ready servers of one hub snapshot."""
    return {k: v.get("profile", "") for k, v in snap["servers"].items() if v.get("ready")}


def check_server_grants(h: History) -> tuple[int, list[Violation]]:
    """Every running server holds one live grant (none for a CPU-only profile), and no grant
    outlives its server, each give or take ``slack_s`` (one reconcile interval)."""
    slack = float(h.settings["slack_s"])
    snaps = [e for e in h.events if e["kind"] == "hub_snapshot"]
    grants = [g for g in h.rows.get("grants", []) if g["kind"] != "batch"]
    profiles = h.policy["profiles"]
    checked, found = 0, []
    for snap in snaps:
        t = float(snap["t"])
        running = _servers_at(snap)
        present = {k for k, v in snap["servers"].items()}
        live: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for g in grants:
            if float(g["granted_at"]) <= t < grant_end(g, h.ended):
                live[f"{g['username']}/{g['server']}"].append(g)
        for key, profile in running.items():
            checked += 1
            want = 1 if profiles.get(profile, {}).get("units", 0) else 0
            have = live.get(key, [])
            if len(have) == want:
                continue
            if want == 0 or not _steady(h, key, t, slack, snaps):
                if want == 0 and have:
                    found.append(
                        Violation(
                            "server_grant",
                            f"CPU-only server {key} holds {len(have)} grant(s)",
                            t,
                            tuple(g["id"] for g in have),
                        )
                    )
                continue
            found.append(
                Violation(
                    "server_grant",
                    f"running server {key} ({profile}) holds {len(have)} live grants",
                    t,
                    (key, *[g["id"] for g in have]),
                )
            )
        for key, held in live.items():
            for g in held:
                if key in present or t - float(g["granted_at"]) <= slack:
                    continue
                gone = _gone_since(key, t, snaps)
                if gone is not None and t - gone > slack:
                    checked += 1
                    found.append(
                        Violation(
                            "grant_outlived",
                            f"grant {g['id']} of {key} live "
                            f"{t - gone:.1f} s after its server was gone",
                            t,
                            (g["id"],),
                        )
                    )
    return checked, found


def _steady(h: History, key: str, t: float, slack: float, snaps: list[dict[str, Any]]) -> bool:
    """Whether ``key`` was ready in every snapshot of the ``slack`` before ``t`` and after
    it (a server just started, stopped or restarted has one reconcile interval)."""
    near = [s for s in snaps if abs(float(s["t"]) - t) <= slack]
    return all(key in _servers_at(s) for s in near) and any(
        float(s["t"]) <= t - slack for s in snaps
    )


def _gone_since(key: str, t: float, snaps: list[dict[str, Any]]) -> float | None:
    """The first snapshot time from which ``key`` is absent through ``t``."""
    since = None
    for s in snaps:
        st = float(s["t"])
        if st > t:
            break
        since = None if key in s["servers"] else (since if since is not None else st)
    return since


def check_preemption_notice(h: History) -> tuple[int, list[Violation]]:
    """Every preemption was announced (a deadline recorded) and the grant was not taken
    before its grace period ran out, unless its holder let go of it first."""
    tol = float(h.settings.get("clock_tolerance_s", 0.5))
    checked, found = 0, []
    for g in h.rows.get("grants", []):
        if g.get("end_kind") != "preempted":
            continue
        checked += 1
        deadline = g.get("preempt_deadline")
        if deadline is None:
            found.append(
                Violation(
                    "preemption_notice",
                    f"grant {g['id']} preempted without a recorded announcement",
                    grant_end(g, h.ended),
                    (g["id"],),
                )
            )
            continue
        announced = float(deadline) - float(g["grace_period_s"])
        released = grant_end(g, h.ended)
        by_holder = _holder_let_go(h, g, released, tol)
        if released + tol < announced:
            found.append(
                Violation(
                    "preemption_notice",
                    f"grant {g['id']} ended before its preemption was announced",
                    released,
                    (g["id"],),
                )
            )
        elif not by_holder and released + tol < float(deadline):
            found.append(
                Violation(
                    "preemption_notice",
                    f"grant {g['id']} taken "
                    f"{float(deadline) - released:.1f} s before its grace "
                    f"period ({g['grace_period_s']} s) ran out",
                    released,
                    (g["id"],),
                )
            )
    return checked, found


def _holder_let_go(h: History, g: dict[str, Any], released: float, tol: float) -> bool:
    """Whether the holder itself let go (the broker then records the end as the
    preemption): a job is told at the announcement and may stop early; a client released
    the grant; the user stopped the server the grant was for, a stop asked for during the
    grant's life (also one asked for before the announcement and still under way); or a
    fault killed that server during the grant's life."""
    if g["kind"] == "batch":
        return True
    stop_path = f"/users/{g['username']}/server"
    granted = float(g["granted_at"])
    for e in h.events:
        if (  # the server was killed (a fault) during the grant: its holder is gone
            e["kind"] == "fault"
            and e.get("fault") in ("server_kill9", "server_term")
            and g["server"] == ""
            and str(e.get("target", "")).startswith(f"server of {g['username']} pid ")
            and granted - tol <= float(e["t"]) <= released + tol
        ):
            return True
        if e["kind"] != "call" or float(e["t"]) > released + tol:
            continue
        if e.get("released") == g["id"]:
            return True
        # a call's event is stamped when it ended: it was asked for ``ms`` before that
        asked = float(e["t"]) - float(e.get("ms") or 0.0) / 1000.0
        if (
            e.get("what") == "stop"
            and g["server"] == ""
            and e.get("client") == g["username"]
            and str(e.get("path", "")).endswith(stop_path)
            and asked >= granted - tol
        ):
            return True
    return False
