"""Small builders of core model objects for tests (no policy file needed)."""

from __future__ import annotations

import itertools

from jupyter_gpushare.core.model import (
    GPU,
    GPUAsk,
    Kind,
    Node,
    Policy,
    Pool,
    PoolQuota,
    PriorityClass,
    Request,
    SharingMode,
    Team,
    to_milli,
)

PRIORITIES = (
    PriorityClass("training", 1000, preemptible=False, grace_period_s=60),
    PriorityClass("interactive", 500, preemptible=False, grace_period_s=30),
    PriorityClass("research", 100, preemptible=True, grace_period_s=10,
                  checkpoint_required_after_s=7200),
)


def nodes(pool: str, count: int, gpus: int = 4, memory_mib: int = 81920,
          model: str = "H100") -> tuple[Node, ...]:
    return tuple(
        Node(
            name=f"{pool}-n{i}",
            pool=pool,
            gpus=tuple(GPU(f"GPU-{pool}-n{i}-{j}", model, memory_mib, j) for j in range(gpus)),
            cpu_milli=64000,
            memory_mib=512000,
        )
        for i in range(count)
    )


def policy(
    quotas: dict[str, dict[str, tuple[float, float]]],
    pools: dict[str, SharingMode] | None = None,
    node_count: int = 1,
    gpus: int = 4,
    headroom: float = 0.2,
    per_user_cap: float | None = None,
    budgets: dict[str, float] | None = None,
    priorities: tuple[PriorityClass, ...] = PRIORITIES,
) -> Policy:
    """A policy with one node per pool (or ``node_count``), teams with (guaranteed, borrow)."""
    pools = pools or {"train": SharingMode.EXCLUSIVE}
    pool_objs = tuple(Pool(name, mode, headroom) for name, mode in pools.items())
    all_nodes = tuple(n for name in pools for n in nodes(name, node_count, gpus))
    teams = tuple(
        Team(
            name=team,
            groups=(team,),
            quotas=tuple(
                (pool, PoolQuota(to_milli(g), to_milli(b),
                                 (budgets or {}).get(team),
                                 to_milli(per_user_cap) if per_user_cap else None))
                for pool, (g, b) in per_pool.items()
            ),
        )
        for team, per_pool in quotas.items()
    )
    return Policy(all_nodes, pool_objs, priorities, teams)


_ids = itertools.count()


def request(team: str, pool: str, whole: int = 0, fraction: float = 0.0,
            priority: str = "interactive", kind: Kind = Kind.INTERACTIVE,
            user: str | None = None, **kw: object) -> Request:
    n = next(_ids)
    return Request(
        id=f"r{n}", user=user or f"{team}-user", team=team, pool=pool,
        gpu=GPUAsk(whole=whole, fraction_milli=to_milli(fraction)),
        priority=priority, kind=kind, holder=f"h{n}", **kw,  # type: ignore[arg-type]
    )
