"""Heartbeats: measured GPU use reported by the holder of a grant, checked and bounded.

A heartbeat is checked against its grant and the card (only the grant's GPUs, at most the
card's memory, a time near now), accepted at most once per
``BrokerLimits.heartbeat_min_interval_s`` per grant (a faster one is a 429 with
``Retry-After``), stored as a detail row kept for ``heartbeat_retention_s``, and added to
the measured use of its team and pool for the month (``GET /teams/{team}/usage``), which
is kept for good.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, select

from ..core.ledger import month_of
from .base import BrokerBase
from .db import heartbeats_table, usage_table
from .errors import BrokerError
from .fields import BadField, shorten
from .serial import iso


@dataclass
class Measured:
    """Measured use of one team in one pool in one month, summed over heartbeats."""

    samples: int = 0
    utilization_pct_sum: float = 0.0
    memory_used_mib_sum: float = 0.0
    last_ts: float = 0.0

    def view(self) -> dict[str, Any]:
        n = self.samples
        return {
            "heartbeats": n,
            "utilization_pct_avg": round(self.utilization_pct_sum / n, 2) if n else None,
            "memory_used_mib_avg": round(self.memory_used_mib_sum / n, 1) if n else None,
            "last_heartbeat": iso(self.last_ts) if n else None,
        }


def month_key(ts: float) -> str:
    year, month = month_of(ts)
    return f"{year:04d}-{month:02d}"


class HeartbeatsMixin(BrokerBase):
    """Checking, rate-limiting and storing heartbeats; measured use per team and month."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.measured: dict[tuple[str, str, str], Measured] = {}
        self._heartbeats_since_prune = 0

    def load_measured(self) -> None:
        """Read this month's measured use from the database (at start)."""
        self.measured.clear()
        with self.engine.connect() as conn:
            for row in conn.execute(
                select(usage_table).where(usage_table.c.month == month_key(self.clock()))
            ):
                self.measured[(row.team, row.pool, row.month)] = Measured(
                    row.samples, row.utilization_pct_sum, row.memory_used_mib_sum, row.last_ts
                )

    def measured_view(self, team: str, pool: str) -> dict[str, Any] | None:
        found = self.measured.get((team, pool, month_key(self.clock())))
        return (found or Measured()).view()

    def heartbeat(
        self,
        grant_id: str,
        ts: float | None,
        gpus: list[dict[str, Any]],
        simulated: bool,
        kernel_activity: float | None = None,
    ) -> None:
        """Check and store one heartbeat of a live grant (BrokerError if refused)."""
        grant = self.state.grants.get(grant_id)
        if grant is None:
            raise BrokerError(404, f"no live grant {shorten(grant_id)}")
        limits = self.limits
        now = self.clock()
        last = self.heartbeat_accepted_at.get(grant_id)
        if last is not None and now - last < limits.heartbeat_min_interval_s:
            wait = limits.heartbeat_min_interval_s - (now - last)
            raise BrokerError(
                429,
                f"one heartbeat per {limits.heartbeat_min_interval_s:g} s per grant",
                headers={"Retry-After": str(max(1, math.ceil(wait)))},
            )
        if ts is None:
            ts = now
        skew = limits.heartbeat_max_skew_s
        if ts > now + skew or ts < grant.granted_at - skew:
            raise BadField("ts", "ts must lie between the grant's start and now (epoch seconds)")
        own = {s.gpu_uuid for s in grant.placement.slices}
        seen: set[str] = set()
        for i, item in enumerate(gpus):
            uuid = item["uuid"]
            if uuid not in own:
                raise BadField(
                    f"gpus[{i}].uuid", f"GPU {shorten(uuid)} is not part of grant {grant_id}"
                )
            if uuid in seen:
                raise BadField(f"gpus[{i}].uuid", f"GPU {shorten(uuid)} is reported twice")
            seen.add(uuid)
            card = self.gpus.get(uuid)
            used = item.get("memory_used_mib")
            if card is not None and used is not None and used > card.memory_mib:
                raise BadField(
                    f"gpus[{i}].memory_used_mib",
                    f"GPU {uuid} has {card.memory_mib} MiB; {used:g} MiB cannot be in use",
                )
        key = (grant.team, grant.pool, month_key(ts))
        measured = self.measured.get(key) or Measured()
        utils = [g["utilization_pct"] for g in gpus if g.get("utilization_pct") is not None]
        mems = [g["memory_used_mib"] for g in gpus if g.get("memory_used_mib") is not None]
        new = Measured(
            measured.samples + 1,
            measured.utilization_pct_sum + (sum(utils) / len(utils) if utils else 0.0),
            measured.memory_used_mib_sum + sum(mems),
            max(measured.last_ts, ts),
        )
        prune = self._heartbeats_since_prune + 1 >= limits.heartbeat_prune_every
        with self.engine.begin() as conn:
            conn.execute(
                heartbeats_table.insert(),
                dict(grant_id=grant_id, ts=ts, simulated=simulated, gpus=gpus),
            )
            # lasting per-grant use and node power (report, culler, metrics): broker/usage.py
            self.usage.record(conn, grant_id, grant.placement.node, ts, gpus, kernel_activity)
            values = dict(
                samples=new.samples,
                utilization_pct_sum=new.utilization_pct_sum,
                memory_used_mib_sum=new.memory_used_mib_sum,
                last_ts=new.last_ts,
            )
            updated = conn.execute(
                usage_table.update()
                .where(
                    usage_table.c.team == key[0],
                    usage_table.c.pool == key[1],
                    usage_table.c.month == key[2],
                )
                .values(**values)
            ).rowcount
            if not updated:
                conn.execute(
                    usage_table.insert().values(team=key[0], pool=key[1], month=key[2], **values)
                )
            if prune:
                conn.execute(
                    delete(heartbeats_table).where(
                        heartbeats_table.c.ts < now - limits.heartbeat_retention_s
                    )
                )
        self._heartbeats_since_prune = 0 if prune else self._heartbeats_since_prune + 1
        self.measured[key] = new
        self.heartbeat_accepted_at[grant_id] = now
        self.last_heartbeat[grant_id] = {"ts": iso(ts), "gpus": gpus, "simulated": simulated}
