"""The database adapter of the report: the broker's tables (SQLAlchemy) into plain rows.

Reads only; safe to run beside a live broker (SQLite in WAL mode lets readers in).
Heartbeats are aggregated here, one pass in ``ts`` order, into one :class:`GPUUse` per
grant and GPU and into power buckets per node and GPU.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from sqlalchemy import Engine, or_, select

from ..broker.db import grants_table, heartbeats_table, requests_table
from ..core.ledger import month_bounds
from ..core.model import Policy, from_milli
from .rows import (
    GPUUse,
    GrantRow,
    MonthRows,
    PoolRow,
    PowerRow,
    QuotaRow,
    RequestRow,
    SliceRow,
    UsageRow,
)

LIVE = ("queued", "preempting")


def policy_rows(policy: Policy) -> tuple[tuple[PoolRow, ...], tuple[QuotaRow, ...]]:
    """Pools (capacity from the inventory) and quotas of ``policy``."""
    pools = []
    for pool in policy.pools:
        nodes = [n for n in policy.nodes if n.pool == pool.name]
        units = sum(g.units_milli for n in nodes for g in n.gpus)
        pools.append(
            PoolRow(
                pool.name,
                from_milli(units),
                sum(len(n.gpus) for n in nodes),
                tuple(n.name for n in nodes),
            )
        )
    quotas = [
        QuotaRow(
            team.name,
            pool,
            from_milli(q.guaranteed_milli),
            from_milli(q.borrow_limit_milli),
            q.gpu_hours_per_month,
        )
        for team in policy.teams
        for pool, q in team.quotas
    ]
    return tuple(pools), tuple(quotas)


def _units_of_spec(spec: dict[str, Any]) -> float:
    gpu = (spec or {}).get("gpu") or {}
    return int(gpu.get("whole", 0) or 0) + int(gpu.get("fraction_milli", 0) or 0) / 1000.0


def load_month(
    engine: Engine,
    policy: Policy,
    year: int,
    month: int,
    *,
    power_bucket_s: float = 300.0,
    policy_version: str = "",
) -> MonthRows:
    """Every row the figures of ``year-month`` need, read from the broker's database."""
    start, end = month_bounds(year, month)
    pools, quotas = policy_rows(policy)
    g = grants_table.c
    r = requests_table.c
    h = heartbeats_table.c
    grants: list[GrantRow] = []
    requests: list[RequestRow] = []
    with engine.connect() as conn:
        for row in conn.execute(
            select(
                g.id, g.request_id, g.username, g.team, g.pool, g.node, g.units_milli,
                g.borrowed, g.granted_at, g.released_at, g.release_reason, g.slices, g.kind,
            ).where(g.granted_at < end, or_(g.released_at.is_(None), g.released_at >= start))
        ):
            grants.append(
                GrantRow(
                    id=row.id,
                    request_id=row.request_id,
                    user=row.username,
                    team=row.team,
                    pool=row.pool,
                    node=row.node,
                    units=row.units_milli / 1000.0,
                    borrowed=bool(row.borrowed),
                    granted_at=row.granted_at,
                    released_at=row.released_at,
                    release_reason=row.release_reason or "",
                    slices=tuple(
                        SliceRow(
                            s["uuid"],
                            int(s.get("memory_mib") or 0),
                            int(s.get("compute_milli") or 0) / 1000.0,
                        )
                        for s in (row.slices or ())
                    ),
                    kind=row.kind,
                )
            )
        granted_at = {gr.request_id: gr.granted_at for gr in grants}
        query = (
            select(
                r.id, r.username, r.team, r.pool, r.status, r.code, r.spec, r.created_at,
                r.updated_at, r.grant_id, g.granted_at,
            )
            .select_from(requests_table.outerjoin(grants_table, g.id == r.grant_id))
            .where(
                r.created_at < end,
                or_(r.created_at >= start, r.updated_at >= start, r.status.in_(LIVE)),
            )
        )
        for row in conn.execute(query):
            requests.append(
                RequestRow(
                    id=row.id,
                    user=row.username,
                    team=row.team,
                    pool=row.pool,
                    units=_units_of_spec(row.spec),
                    status=row.status,
                    code=row.code or "",
                    created_at=row.created_at,
                    updated_at=row.updated_at,
                    granted_at=row.granted_at
                    if row.granted_at is not None
                    else granted_at.get(row.id),
                )
            )
        node_of = {gr.id: gr.node for gr in grants}
        # per (grant, uuid): samples, sum of utilisation, sum of memory
        use: dict[str, dict[str, list[float]]] = defaultdict(dict)
        power: dict[tuple[str, str, float], list[float]] = {}
        any_power = False
        for grant_id, ts, gpus in conn.execute(
            select(h.grant_id, h.ts, h.gpus).where(h.ts >= start, h.ts < end)
        ):
            per = use[grant_id]
            node = node_of.get(grant_id)
            for item in gpus or ():
                uuid = item.get("uuid")
                if not uuid:
                    continue
                acc = per.get(uuid)
                if acc is None:
                    acc = per[uuid] = [0.0, 0.0, 0.0]
                acc[0] += 1
                acc[1] += float(item.get("utilization_pct") or 0.0)
                acc[2] += float(item.get("memory_used_mib") or 0.0)
                watts = item.get("power_w")
                if watts is not None and node is not None:
                    any_power = True
                    bucket = start + ((ts - start) // power_bucket_s) * power_bucket_s
                    p = power.get((node, uuid, bucket))
                    if p is None:
                        power[(node, uuid, bucket)] = [float(watts), 1.0]
                    else:
                        p[0] += float(watts)
                        p[1] += 1.0
    usage = tuple(
        UsageRow(
            gid,
            {u: GPUUse(int(a[0]), a[1] / a[0], a[2] / a[0]) for u, a in per.items() if a[0]},
        )
        for gid, per in use.items()
    )
    power_rows = tuple(
        PowerRow(node, uuid, bucket, s / n) for (node, uuid, bucket), (s, n) in power.items()
    )
    return MonthRows(
        year=year,
        month=month,
        start=start,
        end=end,
        pools=pools,
        quotas=quotas,
        grants=tuple(grants),
        requests=tuple(requests),
        usage=usage,
        power=power_rows,
        power_in_heartbeats=any_power,
        power_bucket_s=power_bucket_s,
        policy_version=policy_version,
    )
