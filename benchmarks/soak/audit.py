"""The audit: a history's invariants, recomputed without the broker's own bookkeeping.

Pure functions of a :class:`~.history.History`: the grant, request and heartbeat rows read
directly from the database, the hub's snapshots of running servers, the clients' calls and
the policy's capacities. The broker's figures (ledger, report) are only compared with the
recomputation here. Each check returns the violations it found and how many cases it
checked; :func:`audit` runs them all (the job checks are in :mod:`.audit_jobs`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from .history import History

UNIT = 1000  # milli-units in one GPU, compute_milli of a whole card
EPS = 1e-6


@dataclass(frozen=True)
class Violation:
    check: str
    detail: str
    t: float
    refs: tuple[str, ...] = ()  # grant, request or job ids the history around it names


@dataclass
class Outcome:
    checked: dict[str, int] = field(default_factory=dict)
    violations: list[Violation] = field(default_factory=list)

    def add(self, check: str, checked: int, found: Iterable[Violation]) -> None:
        self.checked[check] = self.checked.get(check, 0) + checked
        self.violations.extend(found)


def _end(row: dict[str, Any], ended: float) -> float:
    return float(row["released_at"]) if row.get("released_at") is not None else ended


def _sweep(
    intervals: list[tuple[float, float, str, int, str]],
) -> Iterable[tuple[float, str, int, str]]:
    """(start, end, key, amount, ref) intervals -> (t, key, total after, ref) at each start;
    an interval ending when another starts is gone first."""
    points = []
    for start, end, key, amount, ref in intervals:
        points.append((start, 1, key, amount, ref))
        points.append((end, 0, key, -amount, ref))
    points.sort(key=lambda p: (p[0], p[1]))
    totals: dict[str, int] = defaultdict(int)
    for t, starting, key, amount, ref in points:
        totals[key] += amount
        if starting:
            yield t, key, totals[key], ref


def check_capacity(h: History) -> tuple[int, list[Violation]]:
    """No GPU ever holds more memory or compute than it has."""
    gpus = h.policy["gpus"]
    mem: list[tuple[float, float, str, int, str]] = []
    cpt: list[tuple[float, float, str, int, str]] = []
    for g in h.rows.get("grants", []):
        for s in g["slices"]:
            span = (float(g["granted_at"]), _end(g, h.ended))
            mem.append((*span, s["uuid"], int(s["memory_mib"]), g["id"]))
            cpt.append((*span, s["uuid"], int(s["compute_milli"]), g["id"]))
    found: list[Violation] = []
    for t, uuid, total, ref in _sweep(mem):
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
    for t, uuid, total, ref in _sweep(cpt):
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
        span = (float(g["granted_at"]), _end(g, h.ended))
        teams.append((*span, f"{g['team']}/{g['pool']}", int(g["units_milli"]), g["id"]))
        users.append(
            (*span, f"{g['team']}/{g['pool']}/{g['username']}", int(g["units_milli"]), g["id"])
        )
    found: list[Violation] = []
    for t, key, total, ref in _sweep(teams):
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
    for t, key, total, ref in _sweep(users):
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
        and float(g["granted_at"]) <= t < _end(g, ended)
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
    """A request inside its team's guarantee is admitted within the stated time, unless
    Slurm itself had a node of its pool out of service meanwhile (with ``--slurm``)."""
    within = float(h.settings["admit_within_s"])
    grants = h.rows.get("grants", [])
    by_request = {g["request_id"]: g for g in grants}
    profiles = h.policy["profiles"]
    checked, found = 0, []
    for r in h.rows.get("requests", []):
        units = int(profiles.get(r["profile"], {}).get("units", 0))
        t0 = float(r["created_at"])
        q = _quota(h, r["team"], r["pool"])
        if not units or t0 + within > h.ended:
            continue
        if _team_use_at(grants, r["team"], r["pool"], t0, h.ended, r["id"]) + units > int(
            q["guaranteed"]
        ):
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
            if float(g["granted_at"]) <= t < _end(g, h.ended):
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
                    _end(g, h.ended),
                    (g["id"],),
                )
            )
            continue
        announced = float(deadline) - float(g["grace_period_s"])
        released = _end(g, h.ended)
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


def recompute_gpu_hours(h: History, start: float, end: float) -> dict[str, float]:
    """GPU-hours per team/pool: the integral of the grant intervals within [start, end)."""
    hours: dict[str, float] = defaultdict(float)
    for g in h.rows.get("grants", []):
        lo = max(start, float(g["granted_at"]))
        hi = min(end, _end(g, end))
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
        if g is None or not float(g["granted_at"]) - slack <= ts <= _end(g, h.ended) + slack:
            found.append(
                Violation(
                    "heartbeat",
                    f"heartbeat at {ts:.1f} for grant {b['grant_id']} outside its life",
                    ts,
                    (b["grant_id"],),
                )
            )
    return len(beats), found


CHECKS: dict[str, Callable[[History], tuple[int, list[Violation]]]] = {
    "capacity": check_capacity,
    "team_and_user_limits": check_team_limits,
    "admission_in_guarantee": check_admission,
    "one_grant_per_server": check_server_grants,
    "preemption_announced": check_preemption_notice,
    "gpu_hours_conserved": check_gpu_hours,
    "no_client_5xx": check_client_5xx,
    "heartbeats_in_grant_life": check_heartbeats,
}


def audit(h: History) -> Outcome:
    from .audit_jobs import JOB_CHECKS

    out = Outcome()
    for name, check in {**CHECKS, **JOB_CHECKS}.items():
        checked, found = check(h)
        out.add(name, checked, found)
    out.violations = dedupe(out.violations)
    return out


def dedupe(found: list[Violation]) -> list[Violation]:
    """One violation per check and thing (a grant seen outliving its server in ten snapshots
    is one violation), the earliest kept."""
    seen: set[tuple[str, ...]] = set()
    kept = []
    for v in sorted(found, key=lambda v: v.t):
        key = (v.check, *v.refs) if v.refs else (v.check, v.detail)
        if key not in seen:
            seen.add(key)
            kept.append(v)
    return kept
