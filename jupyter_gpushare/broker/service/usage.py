"""Measured use kept for the report and the culler: per grant and GPU, and power per node.

Each accepted heartbeat adds, in the heartbeat's own transaction (:meth:`UseRecorder.record`):

* to ``gpushare_grant_use`` (grant, GPU, month): one sample, its card utilisation and the
  memory the grant's processes held; the report's *used GPU-hours* and *data-bound
  sessions* come from these sums, so they survive the pruning of heartbeat detail;
* to ``gpushare_node_power`` (node, hour): when the heartbeat carries ``power_w``, one sample
  of the node's power, the sum over the node's GPUs of the latest power each reported within
  ``stale_s`` (GPUs nobody reports for are not counted), and the hour's maximum.

It also remembers in memory when each grant last showed GPU activity (utilisation at least
``active_util_pct`` on one of its GPUs), which the idle culler reads.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, case

from ...core.ledger import month_of
from ..store.db import grant_use_table, node_power_table


def month_key(ts: float) -> str:
    year, month = month_of(ts)
    return f"{year:04d}-{month:02d}"


class UseRecorder:
    """Adds each heartbeat to the lasting aggregates; tracks GPU activity per grant."""

    def __init__(self, *, stale_s: float = 120.0, active_util_pct: float = 5.0) -> None:
        self.stale_s = stale_s
        self.active_util_pct = active_util_pct
        self.last_power: dict[str, dict[str, tuple[float, float]]] = {}  # node -> uuid -> (ts, W)
        self.last_active: dict[str, float] = {}  # grant -> ts of its last GPU activity
        self.last_seen: dict[str, float] = {}  # grant -> ts of its last heartbeat
        self.last_kernel: dict[str, float] = {}  # grant -> last kernel activity its server saw
        self.last_gpus: dict[str, list[dict[str, Any]]] = {}  # grant -> its last GPU figures

    def prune(self, live: Any) -> None:
        """Forget grants that are no longer live (``live``: a container of grant ids)."""
        for table in (self.last_active, self.last_seen, self.last_kernel, self.last_gpus):
            for gid in [g for g in table if g not in live]:
                del table[gid]

    def record(
        self,
        conn: Connection,
        grant_id: str,
        node: str,
        ts: float,
        gpus: Sequence[dict[str, Any]],
        kernel_activity: float | None = None,
    ) -> None:
        """Add one heartbeat (already checked) inside the caller's transaction."""
        if kernel_activity is not None:
            # a server cannot claim activity later than its own heartbeat
            seen = min(kernel_activity, ts)
            self.last_kernel[grant_id] = max(seen, self.last_kernel.get(grant_id, 0.0))
        self.last_gpus[grant_id] = list(gpus)
        month = month_key(ts)
        t = grant_use_table.c
        active = False
        for item in gpus:
            util = float(item.get("utilization_pct") or 0.0)
            mem = float(item.get("memory_used_mib") or 0.0)
            active = active or util >= self.active_util_pct
            updated = conn.execute(
                grant_use_table.update()
                .where(t.grant_id == grant_id, t.gpu_uuid == item["uuid"], t.month == month)
                .values(
                    samples=t.samples + 1,
                    utilization_pct_sum=t.utilization_pct_sum + util,
                    memory_used_mib_sum=t.memory_used_mib_sum + mem,
                    last_ts=case((t.last_ts < ts, ts), else_=t.last_ts),
                )
            ).rowcount
            if not updated:
                conn.execute(grant_use_table.insert().values(
                    grant_id=grant_id, gpu_uuid=item["uuid"], month=month, samples=1,
                    utilization_pct_sum=util, memory_used_mib_sum=mem, last_ts=ts,
                ))
        self.last_seen[grant_id] = max(ts, self.last_seen.get(grant_id, 0.0))
        if active:
            self.last_active[grant_id] = max(ts, self.last_active.get(grant_id, 0.0))
        powered = [i for i in gpus if i.get("power_w") is not None]
        if not powered:
            return
        latest = self.last_power.setdefault(node, {})
        for item in powered:
            latest[item["uuid"]] = (ts, float(item["power_w"]))
        total = sum(w for seen, w in latest.values() if abs(ts - seen) <= self.stale_s)
        hour = ts - ts % 3600.0
        p = node_power_table.c
        updated = conn.execute(
            node_power_table.update()
            .where(p.node == node, p.hour_start == hour)
            .values(
                samples=p.samples + 1,
                watts_sum=p.watts_sum + total,
                watts_max=case((p.watts_max < total, total), else_=p.watts_max),
            )
        ).rowcount
        if not updated:
            conn.execute(node_power_table.insert().values(
                node=node, hour_start=hour, samples=1, watts_sum=total, watts_max=total,
            ))
