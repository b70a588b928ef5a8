"""Helpers of the report tests: write plain report rows into a real broker database."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine

from jupyter_gpushare.broker.service.usage import UseRecorder
from jupyter_gpushare.broker.store.db import grants_table, heartbeats_table, migrate, requests_table
from jupyter_gpushare.report.rows import GrantRow, RequestRow


def _spec(rid: str, user: str, team: str, pool: str, units: float, created: float) -> dict:
    whole = int(units)
    return {
        "id": rid, "user": user, "team": team, "pool": pool,
        "gpu": {"whole": whole, "fraction_milli": round((units - whole) * 1000),
                "memory_mib": None, "compute_milli": None},
        "priority": "interactive", "kind": "interactive", "holder": "", "profile": "",
        "cpu_milli": 0, "memory_mib": 0, "gpu_models": [], "checkpointing": False,
        "max_runtime_s": None, "created_at": created,
    }


def write_rows(
    engine: Engine,
    grants: list[GrantRow],
    requests: list[RequestRow],
    heartbeats: list[tuple[str, float, list[dict[str, Any]]]],
) -> None:
    """Insert grants, requests and heartbeats ``(grant_id, ts, gpus)`` through SQLAlchemy;
    heartbeats also go through the broker's :class:`UseRecorder`, in time order."""
    migrate(engine)
    grant_of = {g.request_id: g for g in grants}
    with engine.begin() as conn:
        for g in grants:
            conn.execute(grants_table.insert(), dict(
                id=g.id, request_id=g.request_id, username=g.user, server="", team=g.team,
                pool=g.pool, profile="", kind=g.kind, node=g.node,
                slices=[{"uuid": s.gpu_uuid, "memory_mib": s.memory_mib,
                         "compute_milli": round(s.compute * 1000)} for s in g.slices],
                units_milli=round(g.units * 1000), borrowed=g.borrowed,
                preemptible=g.borrowed, priority="interactive", priority_value=100,
                grace_period_s=30,
                spec=_spec(g.request_id, g.user, g.team, g.pool, g.units, g.granted_at),
                granted_at=g.granted_at, released_at=g.released_at,
                release_reason=g.release_reason or None,
            ))
        for r in requests:
            grant = grant_of.get(r.id)
            conn.execute(requests_table.insert(), dict(
                id=r.id, username=r.user, server="", team=r.team, pool=r.pool,
                kind="interactive", profile="", status=r.status, reason=r.code, code=r.code,
                spec=_spec(r.id, r.user, r.team, r.pool, r.units, r.created_at),
                grant_id=grant.id if grant else None, idempotency_key=None,
                created_at=r.created_at, updated_at=r.updated_at,
            ))
        recorder = UseRecorder()
        node_of = {g.id: g.node for g in grants}
        for gid, ts, gpus in sorted(heartbeats, key=lambda b: b[1]):
            conn.execute(heartbeats_table.insert(), dict(
                grant_id=gid, ts=ts, simulated=True, gpus=gpus))
            recorder.record(conn, gid, node_of[gid], ts, gpus)
