"""A generated month of demand (for tests, the benchmark and sites without history).

:func:`synth_month` draws ``count`` demands spread over ``[start, end)`` from a list of
:class:`Shape` (who asks for what, how often, for how long). Deterministic for a seed;
pure (no I/O).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from ..core.model import GPUAsk, Kind, Request
from .demand import Demand


@dataclass(frozen=True)
class Shape:
    """One kind of demand: a team's requests of one size in one pool."""

    team: str
    pool: str
    gpu: GPUAsk
    priority: str
    kind: Kind = Kind.INTERACTIVE
    weight: float = 1.0  # share of the demands drawn
    mean_hold_s: float = 3600.0
    users: int = 5
    checkpointing: bool = False
    patience_s: float | None = None  # queued requests give up after this wait
    retries: int = 0  # a refused interactive request is asked again this many times
    retry_every_s: float = 600.0
    requeue_delay_s: float = 60.0
    cpu_milli: int = 1000
    memory_mib: int = 4096


def synth_month(shapes: Sequence[Shape], count: int, start: float, end: float,
                seed: int = 0, prefix: str = "d") -> list[Demand]:
    """``count`` demands drawn from ``shapes`` (by weight), arriving uniformly in the window;
    holds are exponential around each shape's mean (at least a minute)."""
    rng = random.Random(seed)
    weights = [s.weight for s in shapes]
    demands = []
    for i in range(count):
        shape = rng.choices(shapes, weights)[0]
        at = rng.uniform(start, end)
        user = f"{shape.team}-u{rng.randrange(shape.users)}"
        rid = f"{prefix}{i}"
        req = Request(
            id=rid, user=user, team=shape.team, pool=shape.pool, gpu=shape.gpu,
            priority=shape.priority, kind=shape.kind, holder=rid if shape.kind is Kind.BATCH
            else f"srv{i}", cpu_milli=shape.cpu_milli, memory_mib=shape.memory_mib,
            checkpointing=shape.checkpointing, created_at=at,
        )
        offsets = (tuple(shape.retry_every_s * k for k in range(shape.retries + 1))
                   if shape.retries and shape.kind is Kind.INTERACTIVE else ())
        demands.append(Demand(
            id=rid, requests=(req,), work_s=max(60.0, rng.expovariate(1 / shape.mean_hold_s)),
            offsets=offsets, patience_s=shape.patience_s,
            requeue_delays=(shape.requeue_delay_s,) * 8,
        ))
    return demands
