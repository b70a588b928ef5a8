"""How low could the packing benchmark's figure go? A lower bound, and two reference points.

    .venv/bin/python benchmarks/packing_bound.py --seeds 42-51
    .venv/bin/python benchmarks/packing_bound.py --seeds 42-51 --synthetic cpu-heavy

For each seed of ``benchmarks/packing.py`` (same trace, same inflation), at arrived 100 %
(the mean over the pods whose arrival falls in the 100 % bin, as the benchmark bins it):

* **lower bound** on the % of GPUs unallocated, for any placement at all, online or
  offline, that knows the future or not: the most GPU milli that the pods arrived so far
  could occupy on the cluster's GPUs taken as one pool (no nodes, no CPU, RAM or GPU models:
  dropping constraints only lets more fit), solved as the configuration LP of bin packing
  (a variable per multiset of fractions that fits one GPU; whole-GPU pods are whole GPUs;
  the LP's optimum is at least the integer one). It is computed at ``--checkpoints``
  points across the bin, and each pod of the bin is charged the bound of the next point
  (more pods can only fit more), so the figure is a true bound on the benchmark's.
* **one pool, best fit** (a reference, not a bound): the same pool of GPUs, pods placed
  online in arrival order on the fullest GPU they fit.
* **one big node** (a reference, not a bound): the whole cluster as one node with all its
  CPU and all its GPU milli as one amount; pods placed in arrival order while both last.
  On ``cpu-heavy`` CPU runs out first: this is what no fragmentation at all would leave.

Needs SciPy (``pip install -e .[bench]``): its HiGHS solver solves each LP (about 7,000
configurations on the default trace) in a tenth of a second.
"""

from __future__ import annotations

import argparse
import bisect
import statistics
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import packing_sim as sim  # noqa: E402
from packing import DEFAULT_NODES, DEFAULT_PODS, parse_seeds  # noqa: E402
from packing_synthetic import SYNTHETIC, synthesize  # noqa: E402

MILLI = sim.MILLI


def configurations(sizes: Sequence[int]) -> list[tuple[int, ...]]:
    """Every non-empty multiset of ``sizes`` (milli, each below ``MILLI``) that fits one
    GPU, as counts per size in the order given."""
    out: list[tuple[int, ...]] = []

    def grow(i: int, left: int, counts: list[int]) -> None:
        if i == len(sizes):
            if any(counts):
                out.append(tuple(counts))
            return
        k = 0
        while k * sizes[i] <= left:
            grow(i + 1, left - k * sizes[i], [*counts, k])
            k += 1

    grow(0, MILLI, [])
    return out


def max_allocatable(fractions: Counter[int], whole: int, gpus: int) -> float:
    """The LP bound on the GPU milli that ``fractions`` (per-GPU milli -> GPUs asked) and
    ``whole`` whole GPUs can occupy on ``gpus`` GPUs (at least what any packing occupies)."""
    from scipy.optimize import linprog
    from scipy.sparse import csc_matrix

    sizes = sorted(fractions)
    configs = configurations(sizes)
    rows, cols, vals, gain = [], [], [], []
    for j, counts in enumerate(configs):
        for i, k in enumerate(counts):
            if k:
                rows.append(i)
                cols.append(j)
                vals.append(k)
        rows.append(len(sizes))  # each configuration takes one GPU
        cols.append(j)
        vals.append(1)
        gain.append(-sum(k * s for k, s in zip(counts, sizes, strict=True)))
    # the whole GPUs: one more variable, taking a GPU and giving MILLI
    j = len(configs)
    rows += [len(sizes) + 1, len(sizes)]
    cols += [j, j]
    vals += [1, 1]
    gain.append(-MILLI)
    a = csc_matrix((vals, (rows, cols)), shape=(len(sizes) + 2, j + 1))
    b = [fractions[s] for s in sizes] + [gpus, whole]
    res = linprog(gain, A_ub=a, b_ub=b, bounds=(0, None), method="highs")
    if res.status != 0:
        raise RuntimeError(f"the LP did not solve: {res.message}")
    return float(-res.fun)


@dataclass
class SeedBound:
    """The figures of one seed (% of GPUs unallocated at arrived 100 %)."""

    seed: int
    lower_bound: float
    pool_best_fit: float
    big_node: float


def _bin_pods(pods: Sequence[sim.PodSpec], capacity: int) -> tuple[int, int]:
    """(first, end) indices of the pods whose arrival falls in the 100 % bin."""
    arrived, first = 0, -1
    for k, p in enumerate(pods):
        arrived += p.gpu_request
        b = sim.bin_of(100.0 * arrived / capacity)
        if b == 100 and first < 0:
            first = k
        if b > 100:
            return first, k
    return first, len(pods)


def lower_bound(pods: Sequence[sim.PodSpec], capacity: int, gpus: int, checkpoints: int) -> float:
    """The bound on the bin's mean % unallocated (module docstring)."""
    first, end = _bin_pods(pods, capacity)
    if first < 0:
        raise ValueError("the workload never reaches arrived 100 %")
    marks = sorted({first + (end - first) * (c + 1) // checkpoints - 1 for c in range(checkpoints)})
    fractions: Counter[int] = Counter()
    whole = 0
    done = 0
    bound_at: dict[int, float] = {}
    for mark in marks:
        for p in pods[done : mark + 1]:
            if p.num_gpu and p.gpu_milli < MILLI:
                fractions[p.gpu_milli] += p.num_gpu
            elif p.num_gpu:
                whole += p.num_gpu
        done = mark + 1
        bound_at[mark] = 100.0 - 100.0 * max_allocatable(fractions, whole, gpus) / capacity
    charged = [bound_at[marks[bisect.bisect_left(marks, k)]] for k in range(first, end)]
    return statistics.mean(charged)


def _mean_at_100(
    pods: Sequence[sim.PodSpec], capacity: int, place: Callable[[sim.PodSpec], bool]
) -> float:
    """The mean % unallocated over the pods of the 100 % bin, each pod in turn offered to
    ``place`` (True: it was placed)."""
    arrived = allocated = 0
    samples = []
    for p in pods:
        arrived += p.gpu_request
        if place(p):
            allocated += p.gpu_request
        b = sim.bin_of(100.0 * arrived / capacity)
        if b == 100:
            samples.append(100.0 - 100.0 * allocated / capacity)
        elif b > 100:
            break
    return statistics.mean(samples)


def pool_best_fit(pods: Sequence[sim.PodSpec], capacity: int, gpus: int) -> float:
    """One pool of GPUs, best fit online (a reference): the bin's mean % unallocated."""
    free = Counter({MILLI: gpus})  # free milli -> GPUs with that much free

    def place(p: sim.PodSpec) -> bool:
        if p.num_gpu == 1 and p.gpu_milli < MILLI:
            room = [f for f, n in free.items() if n and f >= p.gpu_milli]
            if not room:
                return False
            f = min(room)
            free[f] -= 1
            free[f - p.gpu_milli] += 1
            return True
        if p.num_gpu and p.gpu_milli == MILLI and free[MILLI] >= p.num_gpu:
            free[MILLI] -= p.num_gpu
            free[0] += p.num_gpu
            return True
        return False  # (CPU-only pods take no GPU; fractions of several GPUs are not traced)

    return _mean_at_100(pods, capacity, place)


def big_node(pods: Sequence[sim.PodSpec], capacity: int, cpu: int) -> float:
    """The cluster as one node, CPU and GPU milli each one amount (a reference)."""
    left = {"gpu": capacity, "cpu": cpu}

    def place(p: sim.PodSpec) -> bool:
        if p.cpu_milli > left["cpu"] or p.gpu_request > left["gpu"]:
            return False
        left["cpu"] -= p.cpu_milli
        left["gpu"] -= p.gpu_request
        return True

    return _mean_at_100(pods, capacity, place)


def bounds(
    nodes: Sequence[sim.NodeSpec],
    trace: Sequence[sim.PodSpec],
    seeds: Sequence[int],
    checkpoints: int = 10,
) -> list[SeedBound]:
    """The three figures per seed, the trace inflated as ``packing.py`` does."""
    capacity = sim.gpu_capacity_milli(nodes)
    gpus = capacity // MILLI
    cpu = sum(n.cpu_milli for n in nodes)
    out = []
    for seed in seeds:
        pods = sim.inflate(trace, seed, capacity)
        out.append(
            SeedBound(
                seed,
                lower_bound(pods, capacity, gpus, checkpoints),
                pool_best_fit(pods, capacity, gpus),
                big_node(pods, capacity, cpu),
            )
        )
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--nodes", default=str(DEFAULT_NODES))
    p.add_argument("--pods", default=str(DEFAULT_PODS))
    p.add_argument("--seeds", default="42-51")
    p.add_argument("--synthetic", default="", choices=["", *SYNTHETIC])
    p.add_argument("--synthetic-seed", type=int, default=7)
    p.add_argument("--checkpoints", type=int, default=10, help="LPs solved across the bin")
    args = p.parse_args(argv)
    nodes = sim.load_nodes(args.nodes)
    trace = sim.load_pods(args.pods)
    if args.synthetic:
        trace = synthesize(trace, nodes, args.synthetic, args.synthetic_seed)
    rows = bounds(nodes, trace, parse_seeds(args.seeds), args.checkpoints)
    print(f"trace {args.synthetic or Path(args.pods).name}: % of GPUs unallocated at arrived 100 %")
    print("seed  lower bound (any placement)  one pool, best fit  one big node")
    for r in rows:
        print(f"{r.seed:4d}  {r.lower_bound:27.3f}  {r.pool_best_fit:18.3f}  {r.big_node:12.3f}")
    print(
        f"mean  {statistics.mean(r.lower_bound for r in rows):27.3f}  "
        f"{statistics.mean(r.pool_best_fit for r in rows):18.3f}  "
        f"{statistics.mean(r.big_node for r in rows):12.3f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
