"""Heartbeats: measured GPU use reported by the holder of a grant, checked and bounded.

A heartbeat is checked against its grant and the card (only the grant's GPUs, each once; its
memory 0 .. the card's memory, utilisation 0 .. 100 %, power 0 .. the card's power limit
(:class:`HeartbeatBounds`); a time near now): a figure out of range is a 400 naming the field
and nothing of the heartbeat is stored, never a clamped value. Accepted at most once per
``BrokerLimits.heartbeat_min_interval_s`` per grant (a faster one is a 429 with
``Retry-After``), stored as a detail row kept for ``heartbeat_retention_s``, and added to
the measured use of its team and pool for the month (``GET /teams/{team}/usage``), which
is kept for good.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, delete, select
from traitlets import Dict, Float, List, Unicode
from traitlets.config import Configurable

from ...core.ledger import month_of
from ...core.model import Grant
from ..errors import BrokerError
from ..store.db import heartbeats_table, usage_table
from ..store.serial import iso
from .fields import BadField, shorten
from .limits import BrokerLimits
from .usage import UseRecorder

log = logging.getLogger("gpushare")


class HeartbeatBounds(Configurable):
    """What a card can do, which bounds the figures a heartbeat may claim for it."""

    power_limit_w = Dict(
        value_trait=Float(min=1.0),
        key_trait=Unicode(),
        config=True,
        help="Power limit in watts per GPU model (the inventory's model name, e.g. "
        "{'NVIDIA H100 80GB HBM3': 700}); overrides the card catalogue (planner/cards.yaml).",
    )
    catalogues = List(
        Unicode(),
        config=True,
        help="Card catalogue files read after the bundled planner/cards.yaml (same shape); "
        "their power_w is the power limit of the cards whose model or name they give.",
    )
    default_power_limit_w = Float(
        1500.0,
        min=1.0,
        config=True,
        help="Power limit in watts of a card whose model is neither in power_limit_w nor in "
        "the catalogue (the largest accelerator boards draw about 1,200 W).",
    )
    power_tolerance = Float(
        1.1,
        min=1.0,
        config=True,
        help="A power reading may exceed the card's limit by this factor (short spikes "
        "above the board power that NVML reports); above it the heartbeat is refused.",
    )

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._catalogue: dict[str, float] | None = None

    def _card_powers(self) -> dict[str, float]:
        """Model name and catalogue key (lower case) -> power_w, read once."""
        if self._catalogue is None:
            from ...planner.reader import PlanError, load_catalogue

            found: dict[str, float] = {}
            try:
                cards, _ = load_catalogue(tuple(self.catalogues))
            except (PlanError, OSError) as exc:
                log.warning(
                    "gpushare: card catalogue unreadable (%s); heartbeat power is "
                    "bounded by default_power_limit_w",
                    exc,
                )
                cards = {}
            for card in cards.values():
                found[card.model.lower()] = card.power_w
                found[card.name.lower()] = card.power_w
            self._catalogue = found
        return self._catalogue

    def card_power_w(self, model: str) -> float:
        """The power limit of a card of this model (watts)."""
        if model in self.power_limit_w:
            return float(self.power_limit_w[model])
        return self._card_powers().get(model.lower(), self.default_power_limit_w)

    def max_power_w(self, model: str) -> float:
        """The highest power reading accepted for a card of this model."""
        return self.card_power_w(model) * self.power_tolerance


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


class Heartbeats:
    """Checking, rate-limiting and storing heartbeats; measured use per team and month.

    Owns the last heartbeat of each live grant (its ``usage`` in the API), when each was
    accepted (the rate limit), the month's measured use per (team, pool) and the lasting
    per-grant use (:class:`~.usage.UseRecorder`); reads the grants and cards it is handed."""

    def __init__(self, engine: Engine, clock: Callable[[], float], limits: BrokerLimits) -> None:
        self.engine = engine
        self.clock = clock
        self.limits = limits
        self.last: dict[str, dict[str, Any]] = {}  # grant id -> its last accepted heartbeat
        self.accepted_at: dict[str, float] = {}  # grant id -> broker time
        self.usage = UseRecorder()  # measured use per grant, node power, GPU activity
        self.measured: dict[tuple[str, str, str], Measured] = {}
        self._since_prune = 0
        self.bounds = HeartbeatBounds()

    def forget(self, grant_id: str) -> None:
        """Drop what a grant that ended sent (its measured use stays in the month's sums)."""
        self.last.pop(grant_id, None)
        self.accepted_at.pop(grant_id, None)

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

    def _check_figures(self, i: int, item: dict[str, Any], model: str, memory_mib: int) -> None:
        """Refuse (400 naming the field) a figure this card cannot show."""
        used = item.get("memory_used_mib")
        if used is not None and not 0 <= used <= memory_mib:
            raise BadField(
                f"gpus[{i}].memory_used_mib",
                f"GPU {item['uuid']} has {memory_mib} MiB; {used:g} MiB cannot be in use",
            )
        util = item.get("utilization_pct")
        if util is not None and not 0 <= util <= 100:
            raise BadField(
                f"gpus[{i}].utilization_pct",
                f"utilization_pct must be between 0 and 100, not {util:g}",
            )
        power = item.get("power_w")
        if power is not None:
            top = self.bounds.max_power_w(model)
            if not 0 <= power <= top:
                limit = self.bounds.card_power_w(model)
                raise BadField(
                    f"gpus[{i}].power_w",
                    f"GPU {item['uuid']} ({shorten(model)}) is limited to {limit:g} W; "
                    f"{power:g} W is not a reading it can give (at most {top:g} W)",
                )

    def accept(
        self,
        grants: Mapping[str, Grant],
        cards: Mapping[str, Any],
        grant_id: str,
        ts: float | None,
        gpus: list[dict[str, Any]],
        simulated: bool,
        kernel_activity: float | None = None,
    ) -> None:
        """Check and store one heartbeat of a live grant (BrokerError if refused);
        ``grants``: the live grants by id, ``cards``: the policy's GPUs by uuid."""
        grant = grants.get(grant_id)
        if grant is None:
            raise BrokerError(404, f"no live grant {shorten(grant_id)}")
        limits = self.limits
        now = self.clock()
        last = self.accepted_at.get(grant_id)
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
            card = cards.get(uuid)
            if card is not None:
                self._check_figures(i, item, card.model, card.memory_mib)
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
        prune = self._since_prune + 1 >= limits.heartbeat_prune_every
        with self.engine.begin() as conn:
            conn.execute(
                heartbeats_table.insert(),
                dict(grant_id=grant_id, ts=ts, simulated=simulated, gpus=gpus),
            )
            # lasting per-grant use and node power (report, culler, metrics): service/usage.py
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
        self._since_prune = 0 if prune else self._since_prune + 1
        self.measured[key] = new
        self.accepted_at[grant_id] = now
        self.last[grant_id] = {"ts": iso(ts), "gpus": gpus, "simulated": simulated}
