"""Where the unallocated GPUs are when the arrived workload reaches 100 % (gpushare).

    .venv/bin/python benchmarks/packing_waste.py --seeds 42-44 [--synthetic NAME] [--top 12]

Replays the packing benchmark (:func:`packing_sim.simulate`, the ``gpushare`` policy) and,
at the first pod that takes the arrived workload past 100 % of GPU capacity, reads the
cluster as the placement left it: the GPUs still idle, and for each GPU shared by fractions
the fractions it holds and the part left free. Per seed it prints the unallocated % (the
benchmark's figure) and the free GPU capacity by the combination of fractions on the GPU,
largest first, with the fractions of each size that had arrived by then. It asserts nothing.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter, defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
for _path in (HERE, HERE.parent):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import packing_sim as sim  # noqa: E402
from packing import DEFAULT_NODES, DEFAULT_PODS, parse_seeds  # noqa: E402
from packing_gpushare import GPUSharePolicy  # noqa: E402
from packing_synthetic import SYNTHETIC, synthesize  # noqa: E402

from jupyter_gpushare.core.state import ClusterState  # noqa: E402

Combination = tuple[int, ...]


def free_by_combination(state: ClusterState) -> tuple[int, Counter[Combination], Counter]:
    """(idle GPUs, free milli by the sorted fractions a shared GPU holds, GPUs of each)."""
    held: dict[str, list[int]] = defaultdict(list)
    for grant in state.grants.values():
        for piece in grant.placement.slices:
            if piece.compute_milli < 1000:
                held[piece.gpu_uuid].append(piece.compute_milli)
    free: Counter[Combination] = Counter()
    gpus: Counter[Combination] = Counter()
    for fractions in held.values():
        combination = tuple(sorted(fractions))
        free[combination] += 1000 - sum(fractions)
        gpus[combination] += 1
    idle = sum(1 for ns in state.nodes.values() for g in ns.gpus if g.idle)
    return idle, free, gpus


class WastePolicy(GPUSharePolicy):
    """gpushare, reading the state when the arrived workload first passes 100 %."""

    capacity = 0
    report: dict = {}

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.arrived = 0
        self.fractions: Counter[int] = Counter()

    def choose(self, pod):  # type: ignore[no-untyped-def]
        self.arrived += pod.gpu_request
        if self.arrived <= self.capacity:
            if 0 < pod.gpu_milli < 1000:
                self.fractions[pod.gpu_milli] += 1
        elif not WastePolicy.report:
            state = free_by_combination(self.state)
            WastePolicy.report = {"state": state, "arrived": self.fractions}
        return super().choose(pod)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="42")
    ap.add_argument("--synthetic", default="", choices=["", *SYNTHETIC])
    ap.add_argument("--synthetic-seed", type=int, default=7)
    ap.add_argument("--top", type=int, default=12, help="combinations shown per seed")
    args = ap.parse_args(argv)
    nodes = sim.load_nodes(str(DEFAULT_NODES))
    pods = sim.load_pods(str(DEFAULT_PODS))
    if args.synthetic:
        pods = synthesize(pods, nodes, args.synthetic, args.synthetic_seed)
    WastePolicy.capacity = sim.gpu_capacity_milli(nodes)
    gpus_total = WastePolicy.capacity / 1000
    for seed in parse_seeds(args.seeds):
        WastePolicy.report = {}
        res = sim.simulate(nodes, pods, WastePolicy, seed, "gpushare")
        idle, free, gpus = WastePolicy.report["state"]
        arrived = WastePolicy.report["arrived"]
        print(
            f"seed {seed}: unallocated at arrived 100 %: {100.0 - res.alloc_pct[100]:.3f} % of "
            f"{gpus_total:.0f} GPUs; idle GPUs {idle}; free on shared GPUs "
            f"{sum(free.values()) / 1000:.1f} GPUs"
        )
        print(f"  fractions arrived by then (milli: pods): {dict(sorted(arrived.items()))}")
        for combination, milli in free.most_common(args.top):
            print(
                f"  {'+'.join(map(str, combination)):>16}: {gpus[combination]:5d} GPUs, "
                f"{milli / 1000:6.1f} GPUs free ({1000 - sum(combination)} milli each)"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
