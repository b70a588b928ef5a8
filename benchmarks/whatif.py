"""What-if replay speed: a generated month of 50,000 requests on 500 GPUs (issue 27).

Targets: the replay takes <= 30 s of CPU on one core and <= 2 GiB of memory (peak RSS of
the process). The month: 20 teams sharing a 320-GPU exclusive pool (training inside
guarantees, preemptible research jobs that borrow and are preempted and requeued) and a
180-GPU shared pool (notebooks of 1/4 and 1/2 GPU, refused interactive requests asked
again); load near the capacity so that queues, preemptions and refusals happen.

    .venv/bin/python benchmarks/whatif.py [--requests 50000] [--seed 1] [--add train:H100:32]

Prints the CPU seconds and the peak RSS of the replay, and what the month looked like.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from collections import Counter

from jupyter_gpushare.core.ledger import month_bounds
from jupyter_gpushare.core.model import (
    GPU,
    GPUAsk,
    Kind,
    Node,
    Policy,
    Pool,
    PoolQuota,
    PriorityClass,
    SharingMode,
    Team,
)
from jupyter_gpushare.whatif.inventory import add_cards, parse_add
from jupyter_gpushare.whatif.replay import replay
from jupyter_gpushare.whatif.synth import Shape, synth_month

TEAMS = 20
H = 3600.0


def _nodes(pool: str, count: int, gpus: int) -> list[Node]:
    return [Node(f"{pool}-{i}", pool,
                 tuple(GPU(f"GPU-{pool}-{i}-{j}", "H100", 81920, j) for j in range(gpus)),
                 128000, 1024000) for i in range(count)]


def bench_policy() -> Policy:
    """500 GPUs: train 40 x 8 exclusive, shared 45 x 4 (20 % headroom); 20 teams."""
    nodes = _nodes("train", 40, 8) + _nodes("shared", 45, 4)
    priorities = (
        PriorityClass("training", 1000, preemptible=False, grace_period_s=60),
        PriorityClass("interactive", 500, preemptible=False, grace_period_s=30),
        PriorityClass("research", 100, preemptible=True, grace_period_s=120,
                      checkpoint_required_after_s=7200),
    )
    teams = tuple(
        Team(f"t{i}", (f"t{i}",), (
            ("train", PoolQuota(16000, 16000)),
            ("shared", PoolQuota(9000, 4000)),
        ))
        for i in range(TEAMS)
    )
    return Policy(tuple(nodes), (Pool("train", SharingMode.EXCLUSIVE),
                                 Pool("shared", SharingMode.SHARED, 0.2)), priorities, teams)


def bench_shapes() -> list[Shape]:
    out = []
    for i in range(TEAMS):
        team, w = f"t{i}", 1.0 + (i % 4) / 2
        out += [
            Shape(team, "train", GPUAsk(whole=1), "training", Kind.BATCH, weight=w,
                  mean_hold_s=12 * H, patience_s=24 * H),
            Shape(team, "train", GPUAsk(whole=4), "research", Kind.BATCH, weight=w / 4,
                  mean_hold_s=10 * H, checkpointing=True),
            Shape(team, "train", GPUAsk(whole=2), "research", Kind.BATCH, weight=w / 2,
                  mean_hold_s=6 * H, checkpointing=True),
            Shape(team, "shared", GPUAsk(fraction_milli=250), "interactive", weight=3 * w,
                  mean_hold_s=8 * H, retries=2, retry_every_s=900.0),
            Shape(team, "shared", GPUAsk(fraction_milli=500), "interactive", weight=w,
                  mean_hold_s=6 * H),
        ]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=50_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--add", action="append", default=[], metavar="POOL:MODEL:COUNT")
    args = parser.parse_args(argv)
    start, end = month_bounds(2026, 11)
    policy = bench_policy()
    if args.add:
        policy = add_cards(policy, [parse_add(a) for a in args.add])
    demands = synth_month(bench_shapes(), args.requests, start, end, seed=args.seed)
    gpus = sum(len(n.gpus) for n in policy.nodes)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    result = replay(policy, demands)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    statuses = Counter(o.status for o in result.outcomes)
    preemptions = sum(o.preemptions for o in result.outcomes)
    waited = sum(1 for o in result.outcomes if o.wait_s)
    print(f"what-if replay: {len(demands):,} demands on {gpus} GPUs, "
          f"{result.decisions:,} core decisions, {len(result.grants):,} grants")
    print(f"  outcomes: {dict(statuses)}; preemptions {preemptions:,}; waited {waited:,}")
    print(f"  CPU {cpu:.2f} s (target <= 30 s), wall {wall:.2f} s, "
          f"peak RSS {peak_kib / 1024:.0f} MiB (target <= 2048 MiB)")
    ok = cpu <= 30 and peak_kib <= 2 * 1024 * 1024
    print("  within targets" if ok else "  OVER TARGET")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
