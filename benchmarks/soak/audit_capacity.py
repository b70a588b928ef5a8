"""Audit checks of capacity and quota: no GPU over what it has, no team over guarantee plus
borrow limit, no user over their cap, and every request inside its team's guarantee admitted
within the stated time (outages of the pool, the database or the broker excused)."""

from __future__ import annotations

from typing import Any

from .audit_common import UNIT, Violation, grant_end, sweep
from .history import History


def check_capacity(h: History) -> tuple[int, list[Violation]]:
    """No GPU ever holds more memory or compute than it has."""
    gpus = h.policy["gpus"]
    mem: list[tuple[float, float, str, int, str]] = []
    cpt: list[tuple[float, float, str, int, str]] = []
    for g in h.rows.get("grants", []):
        for s in g["slices"]:
            span = (float(g["granted_at"]), grant_end(g, h.ended))
            mem.append((*span, s["uuid"], int(s["memory_mib"]), g["id"]))
            cpt.append((*span, s["uuid"], int(s["compute_milli"]), g["id"]))
    found: list[Violation] = []
    for t, uuid, total, ref in sweep(mem):
        have = int(gpus.get(uuid, {}).get("memory_mib", 0))
        if total > have:
            found.append(
                Violation(
                    "capacity",
                    f"GPU {uuid} holds {total} MiB of {have} MiB when grant {ref} starts",
                    t,
                    (ref,),
                )
            )
    for t, uuid, total, ref in sweep(cpt):
        if total > UNIT:
            found.append(
                Violation(
                    "capacity",
                    f"GPU {uuid} holds {total / 10:.1f} % compute when grant {ref} starts",
                    t,
                    (ref,),
                )
            )
    return len(mem), found


def _quota(h: History, team: str, pool: str) -> dict[str, Any]:
    return h.policy["quotas"].get(team, {}).get(pool) or {"guaranteed": 0, "borrow": 0, "cap": None}


def check_team_limits(h: History) -> tuple[int, list[Violation]]:
    """No team above guarantee + borrow limit in a pool, no user above their cap."""
    teams: list[tuple[float, float, str, int, str]] = []
    users: list[tuple[float, float, str, int, str]] = []
    for g in h.rows.get("grants", []):
        span = (float(g["granted_at"]), grant_end(g, h.ended))
        teams.append((*span, f"{g['team']}/{g['pool']}", int(g["units_milli"]), g["id"]))
        users.append(
            (*span, f"{g['team']}/{g['pool']}/{g['username']}", int(g["units_milli"]), g["id"])
        )
    found: list[Violation] = []
    for t, key, total, ref in sweep(teams):
        q = _quota(h, *key.split("/"))
        limit = int(q["guaranteed"]) + int(q["borrow"])
        if total > limit:
            found.append(
                Violation(
                    "team_limit",
                    f"team/pool {key} holds {total / UNIT:g} GPU "
                    f"units, above guarantee + borrow limit {limit / UNIT:g}",
                    t,
                    (ref,),
                )
            )
    for t, key, total, ref in sweep(users):
        team, pool, user = key.split("/")
        cap = _quota(h, team, pool).get("cap")
        if cap is not None and total > int(cap):
            found.append(
                Violation(
                    "user_cap",
                    f"user {user} holds {total / UNIT:g} GPU units "
                    f"in {team}/{pool}, above the cap {int(cap) / UNIT:g}",
                    t,
                    (ref,),
                )
            )
    return len(teams), found


def _team_use_at(
    grants: list[dict[str, Any]], team: str, pool: str, t: float, ended: float, but: str
) -> int:
    return sum(
        int(g["units_milli"])
        for g in grants
        if g["team"] == team
        and g["pool"] == pool
        and g["request_id"] != but
        and float(g["granted_at"]) <= t < grant_end(g, ended)
    )


def _team_waiting_at(
    grants: list[dict[str, Any]], requests: list[dict[str, Any]], team: str, pool: str, t: float,
    but: str,
) -> int:
    """What the team's earlier requests in ``pool`` that were still being admitted at ``t``
    (asked before it, granted after it: a preemption for them under way) later got. The
    broker serves a team's requests in order, so they claim its guarantee first."""
    asked = {r["id"]: float(r["created_at"]) for r in requests
             if r["team"] == team and r["pool"] == pool and r["id"] != but}
    return sum(
        int(g["units_milli"])
        for g in grants
        if g["request_id"] in asked and asked[g["request_id"]] < t < float(g["granted_at"])
    )


def _outage_within(h: History, start: float, end: float) -> float:
    """Seconds of [start, end) during which the broker itself was down (a fault of the hub,
    which takes its managed broker with it, or of the broker, until it served again): they
    are recovery time, reported and held to its own target, not admission time."""
    down = 0.0
    for e in h.events:
        if (
            e["kind"] == "fault"
            and e.get("recovered_s") is not None
            and (str(e["fault"]).startswith(("hub_", "broker_")))
        ):
            lo, hi = max(start, float(e["t"])), min(end, float(e["t"]) + float(e["recovered_s"]))
            down += max(0.0, hi - lo)
    return down


SLURM_IN_SERVICE = {"idle", "mixed", "allocated", "completing"}  # sinfo %T, nothing appended


def _pool_out_of_service(h: History, pool: str, start: float, end: float) -> bool:
    """Whether Slurm's own view (the ``slurm_nodes`` snapshots) had a node of ``pool`` out of
    service (down, drained, not responding) at a moment of [start - slack, end]: the capacity
    a guarantee counts on was not there (a killed node, a node Slurm drained after its
    slurmctld died). The slack covers the broker's resume of a node Slurm has back."""
    nodes = {g["node"] for g in h.policy["gpus"].values() if g.get("pool") == pool}
    slack = float(h.settings.get("slack_s", 15.0))
    return any(
        e["kind"] == "slurm_nodes"
        and start - slack <= float(e["t"]) <= end
        and any(e["states"].get(n, "idle") not in SLURM_IN_SERVICE for n in nodes)
        for e in h.events
    ) or any(_node_killed(e, nodes, start - slack, end) for e in h.events)


def _node_killed(e: dict[str, Any], nodes: set[str], start: float, end: float) -> bool:
    """Whether ``e`` is the harness killing one of ``nodes`` (until it was back) within
    [start, end]: the node was dead whatever Slurm said yet (it notices after a timeout)."""
    if e["kind"] != "fault" or e.get("fault") != "slurm_node_kill9":
        return False
    words = str(e.get("target", "")).split()  # "Slurm node <name> ..."
    if len(words) < 3 or words[2] not in nodes:
        return False
    t = float(e["t"])
    return t <= end and start <= t + float(e.get("recovered_s") or 0.0)


def check_admission(h: History) -> tuple[int, list[Violation]]:
    """A request inside its team's guarantee (counting what the team held and what its
    earlier requests were being admitted to) is admitted within the stated time, unless
    Slurm itself had a node of its pool out of service meanwhile (with ``--slurm``)."""
    within = float(h.settings["admit_within_s"])
    grants = h.rows.get("grants", [])
    by_request = {g["request_id"]: g for g in grants}
    profiles = h.policy["profiles"]
    checked, found = 0, []
    requests = h.rows.get("requests", [])
    for r in requests:
        units = int(profiles.get(r["profile"], {}).get("units", 0))
        t0 = float(r["created_at"])
        q = _quota(h, r["team"], r["pool"])
        if not units or t0 + within > h.ended:
            continue
        held = _team_use_at(grants, r["team"], r["pool"], t0, h.ended, r["id"])
        held += _team_waiting_at(grants, requests, r["team"], r["pool"], t0, r["id"])
        if held + units > int(q["guaranteed"]):
            continue
        g = by_request.get(r["id"])
        answered = float(g["granted_at"]) if g is not None else t0 + within
        if _pool_out_of_service(h, r["pool"], t0, answered):
            continue  # the capacity was gone in the engine's own view: not a broker's refusal
        checked += 1
        if g is not None:
            waited = float(g["granted_at"]) - t0 - _outage_within(h, t0, float(g["granted_at"]))
            if waited > within:
                found.append(
                    Violation(
                        "admission",
                        f"request {r['id']} of {r['team']} inside "
                        f"its guarantee waited {waited:.1f} s (> {within:g} s) while the "
                        "broker served",
                        t0,
                        (r["id"], g["id"]),
                    )
                )
        elif r["status"] == "cancelled" and float(r["updated_at"]) - t0 <= within:
            continue  # withdrawn by its holder before its time was up
        else:
            found.append(
                Violation(
                    "admission",
                    f"request {r['id']} of {r['team']} inside its "
                    f"guarantee was not admitted ({r['status']}: "
                    f"{r.get('reason', '')[:120]})",
                    t0,
                    (r["id"],),
                )
            )
    return checked, found
