"""The rows a change of the lifecycle writes (:mod:`.lifecycle`): a grant and its
preemption victims, a closed grant and its request.

Each is given two ways: fast-path statements (:mod:`..store.fastsql`, by name, for
:meth:`.writes.Writes.write`) and SQLAlchemy statements on a connection (the path without
the fast writer, and the start's repairs).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import bindparam

from ...core.grant_end import EndFacts, GrantEnd, resolve
from ...core.model import Grant
from ..store import fastsql
from ..store.db import grants_table, requests_table
from ..store.serial import grant_row

# pre-built statements of the hot paths (parameters bound at execution: SQLAlchemy caches them)
_CLOSE_GRANT = (
    grants_table.update()
    .where(grants_table.c.id == bindparam("g_id"), grants_table.c.released_at.is_(None))
    .values(
        released_at=bindparam("g_released"),
        release_reason=bindparam("g_reason"),
        end_kind=bindparam("g_kind"),
        ended_by_request=bindparam("g_by_request"),
        ended_by_team=bindparam("g_by_team"),
    )
)
_CLOSE_REQUEST = (
    requests_table.update()
    .where(requests_table.c.id == bindparam("r_id"))
    .values(status="released", updated_at=bindparam("r_updated"))
)


def grant_and_victim_statements(
    grant: Grant | None, marks: list[tuple[str, str, str, float]], spec_json: str | None = None
) -> list[tuple[str, tuple[Any, ...]]]:
    """Fast-path statements that insert ``grant`` (if any) and mark preemption victims."""
    statements: list[tuple[str, tuple[Any, ...]]] = []
    if grant is not None:
        params = (
            fastsql.grant_params(grant_row(grant), spec_json)
            if spec_json is not None
            else fastsql.grant_params(grant_row(grant))
        )
        statements.append(("insert_grant", params))
    statements.extend(
        ("mark_victim", (for_id, why, deadline, vid)) for vid, for_id, why, deadline in marks
    )
    return statements


def mark_victims(conn: Any, marks: list[tuple[str, str, str, float]]) -> None:
    """Mark preemption victims (id, for request, why, deadline) in ``conn``."""
    for victim_id, for_id, why, deadline in marks:
        conn.execute(
            grants_table.update()
            .where(grants_table.c.id == victim_id)
            .values(preempt_for=for_id, preempt_reason=why, preempt_deadline=deadline)
        )


def close_grant_rows(
    conn: Any,
    grant_id: str,
    request_id: str,
    now: float,
    reason: str,
    end: GrantEnd | None = None,
) -> None:
    """Close a grant and its request in the transaction ``conn`` (SQLAlchemy)."""
    end = end or resolve(reason, EndFacts(now, now))
    conn.execute(
        _CLOSE_GRANT,
        {
            "g_id": grant_id,
            "g_released": now,
            "g_reason": end.reason or reason,
            "g_kind": end.kind.value,
            "g_by_request": end.by_request,
            "g_by_team": end.by_team,
        },
    )
    conn.execute(_CLOSE_REQUEST, {"r_id": request_id, "r_updated": now})
