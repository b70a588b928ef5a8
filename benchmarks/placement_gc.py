"""Garbage collection inside placement decisions, in a harness process (not the broker).

    .venv/bin/python benchmarks/placement_gc.py --seed 42            # default trace
    .venv/bin/python benchmarks/placement_gc.py --seed 42 --scale 10 --synthetic multigpu-heavy

Replays a trace of ``benchmarks/packing.py`` (the pods of one seed, up to 130 % of the GPU
capacity) through the product's placement (``core.placement.place`` on a real
``ClusterState``) twice:

1. with the collector off, reading ``gc.get_count()[0]`` around each ``place()``: the
   objects tracked by the collector that a decision leaves behind (allocations less
   deallocations of tracked objects: what counts towards the next collection);
2. with the collector on (CPython's default thresholds), the collections that begin inside
   ``place()`` per generation, of all those of the replay, and their CPU time
   (``gc.callbacks``, ``time.thread_time``).

With ``--peak``, a third replay (collector off) follows ``gc.get_count()[0]`` at every Python
call and return inside ``place()`` (``sys.setprofile``): the most objects a decision holds at
once above its start, its short-lived ones included (the first decision, which builds the
index, is left out).

It prints figures; it asserts nothing.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))

import packing  # noqa: E402
import packing_sim as sim  # noqa: E402
from packing_gpushare import GPUSharePolicy  # noqa: E402
from packing_synthetic import SYNTHETIC, synthesize  # noqa: E402


class GCWatch:
    """Collections that begin while ``inside`` is set, per generation, and their duration."""

    def __init__(self) -> None:
        self.inside = False
        self.began = [0, 0, 0]
        self.all = [0, 0, 0]  # collections of the whole replay, inside place() or not
        self.ms: list[list[float]] = [[], [], []]
        self._t0 = 0.0
        self._gen = -1

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self.all[info["generation"]] += 1
            self._gen = info["generation"] if self.inside else -1
            self._t0 = time.thread_time()
        elif self._gen >= 0:
            self.began[self._gen] += 1
            self.ms[self._gen].append((time.thread_time() - self._t0) * 1000.0)
            self._gen = -1


def _pods(args: argparse.Namespace) -> tuple[list[sim.NodeSpec], list[sim.PodSpec]]:
    nodes = sim.load_nodes(args.nodes)
    pods = sim.load_pods(args.pods)
    if args.synthetic:
        pods = synthesize(pods, nodes, args.synthetic, args.synthetic_seed)
    nodes, pods = sim.replicate(nodes, pods, args.scale)
    return nodes, sim.inflate(pods, args.seed, sim.gpu_capacity_milli(nodes))


def replay(
    nodes: Sequence[sim.NodeSpec],
    pods: Sequence[sim.PodSpec],
    seed: int,
    collect: bool,
    freeze: bool = False,
) -> tuple[list[int], GCWatch, float]:
    """One replay: (tracked objects left per decision, collections inside, seconds)."""
    frag = sim.FragMeasure([])
    policy = GPUSharePolicy(sim.SimCluster(list(nodes)), sim.node_ranks(nodes, seed), seed, frag)
    watch = GCWatch()
    left: list[int] = []
    gc.collect()
    if freeze:  # what was loaded before the replay is never scanned again (as the broker does)
        gc.freeze()
    if collect:
        gc.enable()
        gc.callbacks.append(watch)
    else:
        gc.disable()
    t0 = time.perf_counter()
    try:
        for pod in pods:
            policy.prepare(pod)
            before = gc.get_count()[0]
            watch.inside = True
            choice = policy.choose(pod)
            watch.inside = False
            left.append(gc.get_count()[0] - before)
            if choice is not None:
                policy.commit(pod, choice)
    finally:
        if collect:
            gc.callbacks.remove(watch)
        gc.enable()
        gc.unfreeze()
    return left, watch, time.perf_counter() - t0


def peaks(nodes: Sequence[sim.NodeSpec], pods: Sequence[sim.PodSpec], seed: int) -> list[int]:
    """Per decision: the most tracked objects above its start count while it ran."""
    frag = sim.FragMeasure([])
    policy = GPUSharePolicy(sim.SimCluster(list(nodes)), sim.node_ranks(nodes, seed), seed, frag)
    top = [0, 0]  # start count, highest count seen

    def follow(frame: object, event: str, arg: object) -> None:
        top[1] = max(top[1], gc.get_count()[0])

    out: list[int] = []
    gc.collect()
    gc.disable()
    try:
        for pod in pods:
            policy.prepare(pod)
            top[0] = top[1] = gc.get_count()[0]
            sys.setprofile(follow)
            choice = policy.choose(pod)
            sys.setprofile(None)
            out.append(top[1] - top[0])
            if choice is not None:
                policy.commit(pod, choice)
    finally:
        sys.setprofile(None)
        gc.enable()
    return out[1:]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", default=str(packing.DEFAULT_NODES))
    p.add_argument("--pods", default=str(packing.DEFAULT_PODS))
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--scale", type=int, default=1)
    p.add_argument("--synthetic", default="", choices=["", *SYNTHETIC])
    p.add_argument("--synthetic-seed", type=int, default=7)
    p.add_argument(
        "--freeze",
        action="store_true",
        help="gc.freeze() the trace and the empty cluster before the replay (the broker "
        "freezes its state at start)",
    )
    p.add_argument("--peak", action="store_true", help="also the objects a decision holds at once")
    args = p.parse_args(argv)
    nodes, pods = _pods(args)
    left, _, _ = replay(nodes, pods, args.seed, collect=False)
    _, watch, seconds = replay(nodes, pods, args.seed, collect=True, freeze=args.freeze)
    n = len(left)
    print(
        f"{n} decisions, {len(nodes)} nodes, scale {args.scale}, seed {args.seed}"
        + (", loaded objects frozen" if args.freeze else "")
    )
    print(
        "tracked objects left per decision (collector off): "
        f"mean {statistics.fmean(left):.1f}, p50 {packing.percentile(left, 50)}, "
        f"p99 {packing.percentile(left, 99)}, total {sum(left)}"
    )
    for gen in range(3):
        ms = watch.ms[gen]
        print(
            f"gen-{gen} collections begun inside place(): {watch.began[gen]} of "
            f"{watch.all[gen]} in the replay ({1000.0 * watch.began[gen] / n:.2f} per 1000 "
            f"decisions), {sum(ms):.1f} ms CPU in all, longest {max(ms, default=0.0):.1f} ms"
        )
    print(f"replay with the collector on: {seconds:.1f} s wall")
    if args.peak:
        most = peaks(nodes, pods, args.seed)
        print(
            "tracked objects held at once above the start, per decision: "
            f"mean {statistics.fmean(most):.1f}, p50 {packing.percentile(most, 50)}, "
            f"p99 {packing.percentile(most, 99)}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
