"""Policies for broker tests and benchmarks (importable as ``brokerpolicies:<name>``)."""

from __future__ import annotations

import dataclasses

from corefactory import policy

from jupyter_gpushare.core.model import Policy, PriorityClass, SharingMode

FAST = (
    PriorityClass("training", 1000, preemptible=False, grace_period_s=1),
    PriorityClass("interactive", 500, preemptible=False, grace_period_s=1),
    PriorityClass(
        "research", 100, preemptible=True, grace_period_s=1, checkpoint_required_after_s=7200
    ),
)
def explicit(pol: Policy, allowed: bool = True) -> Policy:
    """``pol`` with explicit GPU requests (no profile) allowed, or not, in every quota."""
    teams = tuple(
        dataclasses.replace(
            team,
            quotas=tuple(
                (pool, dataclasses.replace(q, explicit_requests=allowed))
                for pool, q in team.quotas
            ),
        )
        for team in pol.teams
    )
    return dataclasses.replace(pol, teams=teams)


POOLS = {"train": SharingMode.EXCLUSIVE, "shared": SharingMode.SHARED, "debug": SharingMode.DEBUG}


def small() -> Policy:
    """One node per pool with 4 GPUs; teams a (owner) and b (borrower); 1 s grace periods."""
    pol = policy(
        {
            "a": {"train": (4, 0), "shared": (2, 1), "debug": (0.25, 0)},
            "b": {"train": (0, 4), "shared": (1, 2), "debug": (0.25, 0)},
        },
        pools=POOLS,
    )
    # the broker tests send explicit asks ({"pool", "gpu"}) as members: allowed here
    return explicit(dataclasses.replace(pol, priority_classes=FAST))


def crash() -> Policy:
    """Many small nodes, many teams: a burst both grants and refuses."""
    pol = policy(
        {f"t{i}": {"train": (6, 6), "shared": (3, 3)} for i in range(8)},
        pools={"train": SharingMode.EXCLUSIVE, "shared": SharingMode.SHARED},
        node_count=10,
        gpus=4,
    )
    return explicit(dataclasses.replace(pol, priority_classes=FAST))


def bench() -> Policy:
    """1,000 nodes x 8 GPUs in two pools; 20 teams with room for 10,000+ live grants."""
    pol = policy(
        {f"t{i}": {"train": (100, 100), "shared": (200, 100)} for i in range(20)},
        pools={"train": SharingMode.EXCLUSIVE, "shared": SharingMode.SHARED},
        node_count=500,
        gpus=8,
    )
    return explicit(pol)


def bench_nodes() -> Policy:
    """``bench`` with ``$GPUSHARE_BENCH_NODES`` nodes (default 1,000) x 8 GPUs, half per pool,
    and team quotas grown with them (``benchmarks/broker.py --nodes``)."""
    import os

    count = max(2, int(os.environ.get("GPUSHARE_BENCH_NODES", "1000")))
    grow = count / 1000
    pol = policy(
        {f"t{i}": {"train": (100 * grow, 100 * grow), "shared": (200 * grow, 100 * grow)}
         for i in range(20)},
        pools={"train": SharingMode.EXCLUSIVE, "shared": SharingMode.SHARED},
        node_count=count // 2,
        gpus=8,
    )  # fmt: skip
    return explicit(pol)
