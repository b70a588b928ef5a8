"""The database adapter of the report: the broker's tables (SQLAlchemy) into plain rows.

Reads only; safe to run beside a live broker (SQLite in WAL mode lets readers in).
Measured use comes from the lasting aggregates the broker keeps from heartbeats
(:mod:`jupyter_gpushare.broker.service.usage`), not from heartbeat detail, which is pruned.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict

from sqlalchemy import Engine, Text, func, or_, select, type_coerce

from ..broker.store.db import grant_use_table, grants_table, node_power_table, requests_table
from ..core.grant_end import kind_of
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


def _units_of_spec(text: str | None) -> float:
    spec = json.loads(text) if text else {}
    gpu = (spec or {}).get("gpu") or {}
    return int(gpu.get("whole", 0) or 0) + int(gpu.get("fraction_milli", 0) or 0) / 1000.0


def _slices(text: str | None, cache: dict[str, tuple[SliceRow, ...]]) -> tuple[SliceRow, ...]:
    """Decode a grant's slices (JSON text); identical texts (same GPUs, same shape) once."""
    if not text:
        return ()
    found = cache.get(text)
    if found is None:
        found = cache[text] = tuple(
            SliceRow(
                s["uuid"],
                int(s.get("memory_mib") or 0),
                int(s.get("compute_milli") or 0) / 1000.0,
            )
            for s in json.loads(text)
        )
    return found


def load_month(
    engine: Engine,
    policy: Policy,
    year: int,
    month: int,
    *,
    policy_version: str = "",
    now: float | None = None,
) -> MonthRows:
    """Every row the figures of ``year-month`` need, read from the broker's database.

    ``now`` (default: the clock) inside the month makes it a partial month: only what
    happened before ``now`` is read, and the figures stop there (:func:`.figures.compute`).

    Rows are fetched in one ``fetchall`` per table and JSON columns are read as text and
    decoded here (slices once per distinct text): about 3x faster than row-by-row
    SQLAlchemy processing for a month of 50,000 grants."""
    start, end = month_bounds(year, month)
    now = time.time() if now is None else now
    cut = min(end, max(start, now))
    pools, quotas = policy_rows(policy)
    g = grants_table.c
    r = requests_table.c
    cache: dict[str, tuple[SliceRow, ...]] = {}
    with engine.connect() as conn:
        grant_rows = conn.execute(
            select(
                g.id, g.request_id, g.username, g.team, g.pool, g.node, g.units_milli,
                g.borrowed, g.granted_at, g.released_at, g.release_reason,
                type_coerce(g.slices, Text), g.kind, g.end_kind, g.ended_by_team,
            ).where(g.granted_at < cut, or_(g.released_at.is_(None), g.released_at >= start))
        ).all()
        grants = [
            GrantRow(gid, rid, user, team, pool, node, units / 1000.0, bool(borrowed), ga, ra,
                     why or "", _slices(sl, cache), kind,
                     kind_of(ek, why).value if ra is not None else "", by_team or "")
            for gid, rid, user, team, pool, node, units, borrowed, ga, ra, why, sl, kind, ek,
            by_team in grant_rows
        ]
        granted = {gr.request_id: gr for gr in grants}
        request_rows = conn.execute(
            select(
                r.id, r.username, r.team, r.pool, r.status, r.code, r.created_at,
                r.updated_at, r.grant_id,
            ).where(
                r.created_at < cut,
                or_(r.created_at >= start, r.updated_at >= start, r.status.in_(LIVE)),
            )
        ).all()
        # the units of requests without a grant in the month come from their spec
        lacking = [row[0] for row in request_rows if row[0] not in granted]
        units_of: dict[str, float] = {}
        for k in range(0, len(lacking), 500):
            for rid, spec in conn.execute(
                select(r.id, type_coerce(r.spec, Text)).where(r.id.in_(lacking[k:k + 500]))
            ):
                units_of[rid] = _units_of_spec(spec)
        requests = []
        for rid, user, team, pool, status, code, created, updated, _grant in request_rows:
            gr = granted.get(rid)
            requests.append(RequestRow(
                rid, user, team, pool,
                gr.units if gr is not None else units_of.get(rid, 0.0),
                status, code or "", created, updated,
                gr.granted_at if gr is not None else None,
            ))
        month_key = f"{year:04d}-{month:02d}"
        use: dict[str, dict[str, GPUUse]] = defaultdict(dict)
        u = grant_use_table.c
        for gid, uuid, samples, util_sum, mem_sum in conn.execute(
            select(u.grant_id, u.gpu_uuid, u.samples, u.utilization_pct_sum,
                   u.memory_used_mib_sum).where(u.month == month_key, u.samples > 0)
        ).all():
            use[gid][uuid] = GPUUse(samples, util_sum / samples, mem_sum / samples)
        p = node_power_table.c
        # one row per node, summed by the database: hours with samples, the mean of the
        # hourly means, the highest sample
        power_rows = tuple(
            PowerRow(node, int(hours), float(avg), float(peak))
            for node, hours, avg, peak in conn.execute(
                select(
                    p.node,
                    func.count(),
                    func.avg(p.watts_sum / p.samples),
                    func.max(p.watts_max),
                )
                .where(p.hour_start >= start, p.hour_start < cut, p.samples > 0)
                .group_by(p.node)
            ).all()
        )
    usage = tuple(UsageRow(gid, gpus) for gid, gpus in use.items())
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
        policy_version=policy_version,
        now=now,
    )
