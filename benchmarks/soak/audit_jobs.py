"""The audit's job checks: every job ended exactly once with its reason, none ran twice at
once, and each preempted checkpointing job resumed from its checkpoint.

From the stored job rows and events (read directly from the database), the batch grants
(their holder is the job's id) and what the backend left in the job folders: the
checkpointing notebook writes "<attempt> <steps already done>" for every attempt it starts.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

from .audit_common import Violation, grant_end
from .history import History

TERMINAL = ("succeeded", "failed", "cancelled", "lost")


def check_jobs_end_once(h: History) -> tuple[int, list[Violation]]:
    events: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for e in sorted(h.rows.get("job_events", []), key=lambda e: (e["ts"], e["id"])):
        events[e["job_id"]].append(e)
    found = []
    jobs = h.rows.get("jobs", [])
    for job in jobs:
        seq = events.get(job["id"], [])
        ends = [e for e in seq if e["to_state"] in TERMINAL]
        ref = (job["id"],)
        t = float(job.get("ended_at") or job["updated_at"])
        if len(ends) != 1:
            found.append(
                Violation(
                    "job_end",
                    f"job {job['id']} ended {len(ends)} times "
                    f"({', '.join(e['to_state'] for e in ends) or 'never'}; "
                    f"state {job['state']})",
                    t,
                    ref,
                )
            )
            continue
        if seq[-1] is not ends[0]:
            found.append(
                Violation(
                    "job_end",
                    f"job {job['id']} changed state after it ended "
                    f"({ends[0]['to_state']} then {seq[-1]['to_state']})",
                    float(seq[-1]["ts"]),
                    ref,
                )
            )
        if job["state"] != ends[0]["to_state"]:
            found.append(
                Violation(
                    "job_end",
                    f"job {job['id']} is {job['state']} but ended {ends[0]['to_state']}",
                    t,
                    ref,
                )
            )
        if job["state"] != "succeeded" and not (job.get("reason") or ends[0].get("reason")):
            found.append(
                Violation("job_end", f"job {job['id']} {job['state']} without a reason", t, ref)
            )
    return len(jobs), found


def check_jobs_run_once(h: History) -> tuple[int, list[Violation]]:
    """No two grants of one job live at once (one attempt at a time)."""
    ids = {j["id"] for j in h.rows.get("jobs", [])}
    held: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for g in h.rows.get("grants", []):
        if g["server"] in ids:
            held[g["server"]].append(g)
    found = []
    for job_id, grants in held.items():
        grants.sort(key=lambda g: float(g["granted_at"]))
        for a, b in zip(grants, grants[1:], strict=False):
            if float(b["granted_at"]) < grant_end(a, h.ended):
                found.append(
                    Violation(
                        "job_twice",
                        f"job {job_id} held grants {a['id']} and {b['id']} at once",
                        float(b["granted_at"]),
                        (job_id, a["id"], b["id"]),
                    )
                )
    return len(held), found


def check_jobs_resume(h: History) -> tuple[int, list[Violation]]:
    """A checkpointing job's later attempt never starts behind an earlier one's start (it
    resumed from its checkpoint, not from scratch)."""
    found = []
    attempts = h.backend.get("attempts", {})
    for job_id, lines in attempts.items():
        starts = [int(start) for _, start in lines]
        for k in range(1, len(starts)):
            if starts[k] < max(starts[:k]):
                found.append(
                    Violation(
                        "job_resume",
                        f"job {job_id} attempt {lines[k][0]} "
                        f"started at step {starts[k]}, behind step "
                        f"{max(starts[:k])} already checkpointed",
                        h.ended,
                        (job_id,),
                    )
                )
    return len(attempts), found


JOB_CHECKS: dict[str, Callable[[History], tuple[int, list[Violation]]]] = {
    "jobs_end_once": check_jobs_end_once,
    "jobs_run_once": check_jobs_run_once,
    "jobs_resume_from_checkpoint": check_jobs_resume,
}
