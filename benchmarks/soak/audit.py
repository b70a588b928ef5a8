"""The audit: a history's invariants, recomputed without the broker's own bookkeeping.

Pure functions of a :class:`~.history.History`: the grant, request and heartbeat rows read
directly from the database, the hub's snapshots of running servers, the clients' calls and
the policy's capacities. The broker's figures (ledger, report) are only compared with the
recomputation here. Each check returns the violations it found and how many cases it
checked; :func:`audit` runs them all. The checks live by invariant: :mod:`.audit_capacity`,
:mod:`.audit_servers`, :mod:`.audit_accounting` and :mod:`.audit_jobs`; what they share is in
:mod:`.audit_common`.
"""


from __future__ import annotations

from collections.abc import Callable

from .audit_accounting import check_client_5xx, check_gpu_hours, check_heartbeats
from .audit_accounting import recompute_gpu_hours as recompute_gpu_hours
from .audit_capacity import check_admission, check_capacity, check_team_limits
from .audit_common import Outcome, Violation
from .audit_servers import check_preemption_notice, check_server_grants
from .history import History

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
