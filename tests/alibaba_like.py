"""A cluster and a pod list shaped like Alibaba's GPU-sharing trace, made here (no data files).

The FGD paper's trace (``../shared/data/alibaba-gpu-v2023``) is not in the repository, so
tests that need its shape draw one: 8-GPU nodes, and pods in about the trace's mix of whole
GPUs, CPU-only pods and fractions (810, 470, 320, 650 milli... the sizes that decide how
much of the cluster packing strands).
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import packing_sim as sim  # noqa: E402

MIX: list[tuple[tuple[int, int], float]] = [
    ((1, 1000), 48), ((0, 0), 13), ((1, 810), 13), ((1, 470), 9), ((1, 320), 4),
    ((1, 650), 3), ((1, 230), 2), ((1, 460), 1.6), ((1, 160), 1), ((1, 590), 1),
    ((1, 550), 1), ((1, 110), 0.3), ((8, 1000), 0.5), ((2, 1000), 0.2), ((4, 1000), 0.2),
]  # fmt: skip
"""((GPUs, milli per GPU), share in %) of the pods, about the default trace's."""


def nodes(count: int) -> list[sim.NodeSpec]:
    """``count`` nodes of 8 GPUs, 96 CPUs and 768 GiB."""
    return [sim.NodeSpec(f"n{i:04d}", 96000, 786432, 8, "A") for i in range(count)]


def pods(count: int, seed: int = 1) -> list[sim.PodSpec]:
    """``count`` pods drawn from :data:`MIX` (1-8 CPUs per GPU asked, 4 GiB)."""
    rng = random.Random(seed)
    shapes, weights = zip(*MIX, strict=True)
    out = []
    for k in range(count):
        num, milli = rng.choices(shapes, weights)[0]
        cpu = rng.choice([1000, 2000, 4000, 8000]) * max(1, num)
        out.append(sim.PodSpec(f"p{k:05d}", cpu, 4096, num, milli, ""))
    return out
