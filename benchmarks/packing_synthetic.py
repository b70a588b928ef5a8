"""Synthetic trace shapes for the packing benchmark, derived deterministically from a seed.

Each transform rewrites a trace (normally the default one) so that the policies meet
workloads they were not tuned on:

* ``multigpu-heavy``: 40 % of the one-whole-GPU pods become 2-, 4- or 8-GPU pods
  (CPU and RAM scale with the GPU count, capped by the largest node);
* ``gpumodel-constrained``: 30 % of the GPU pods get a ``gpu_spec`` naming one or two
  GPU models that have nodes with enough GPUs for the pod;
* ``cpu-heavy``: CPU-only pods drawn from the trace are added until they are 25 % of
  all pods, and GPU pods ask for 1.5x the CPU (capped by the largest node);
* ``multigpu-heavier``: 70 % of the one-whole-GPU pods become 2-, 4- or 8-GPU pods (as
  ``multigpu-heavy``, with more 8-GPU pods);
* ``rare-model-pinned``: GPU pods are pinned to one of the rarer models (those holding
  fewer GPUs than the median model) with nodes big enough, as large a share of the pods
  as those models hold of the GPUs (6.6 % on the Alibaba nodes), each model drawn in
  proportion to its GPUs: the rare models are asked for about as much as they hold;
* ``multigpu-pinned``: ``multigpu-heavy``, then 20 % of the GPU pods pinned to one or two
  models (``gpumodel-constrained`` at a lower share).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import replace

from packing_sim import MILLI, NodeSpec, PodSpec


def _multigpu_heavy(
    pods: Sequence[PodSpec],
    nodes: Sequence[NodeSpec],
    rng: random.Random,
    share: float = 0.4,
    counts: tuple[int, ...] = (2, 2, 4, 4, 8),
) -> list[PodSpec]:
    max_cpu = max(n.cpu_milli for n in nodes)
    max_mem = max(n.memory_mib for n in nodes)
    out = []
    for p in pods:
        if p.num_gpu == 1 and p.gpu_milli == MILLI and rng.random() < share:
            k = rng.choice(counts)
            p = replace(
                p,
                num_gpu=k,
                cpu_milli=min(max_cpu, p.cpu_milli * k),
                memory_mib=min(max_mem, p.memory_mib * k),
            )
        out.append(p)
    return out


def _gpumodel_constrained(
    pods: Sequence[PodSpec], nodes: Sequence[NodeSpec], rng: random.Random, share: float = 0.3
) -> list[PodSpec]:
    most: dict[str, int] = {}
    for n in nodes:
        if n.model:
            most[n.model] = max(most.get(n.model, 0), n.gpus)
    out = []
    for p in pods:
        if p.num_gpu > 0 and rng.random() < share:
            models = sorted(m for m, g in most.items() if g >= p.num_gpu)
            pick = rng.sample(models, min(len(models), rng.choice((1, 2))))
            p = replace(p, gpu_spec="|".join(sorted(pick)))
        out.append(p)
    return out


def _cpu_heavy(
    pods: Sequence[PodSpec], nodes: Sequence[NodeSpec], rng: random.Random
) -> list[PodSpec]:
    max_cpu = max(n.cpu_milli for n in nodes)
    out = [
        replace(p, cpu_milli=min(max_cpu, p.cpu_milli * 3 // 2)) if p.num_gpu else p for p in pods
    ]
    cpu_only = sorted((p for p in pods if p.num_gpu == 0), key=lambda p: p.name)
    if not cpu_only:
        return out
    n_cpu = len(cpu_only)
    k = 0
    while n_cpu < 0.25 * len(out):
        src = cpu_only[rng.randrange(len(cpu_only))]
        out.append(replace(src, name=f"{src.name}-cpu{k}"))
        n_cpu += 1
        k += 1
    return out


def _multigpu_heavier(
    pods: Sequence[PodSpec], nodes: Sequence[NodeSpec], rng: random.Random
) -> list[PodSpec]:
    return _multigpu_heavy(pods, nodes, rng, share=0.7, counts=(2, 4, 4, 8, 8))


def _rare_model_pinned(
    pods: Sequence[PodSpec], nodes: Sequence[NodeSpec], rng: random.Random
) -> list[PodSpec]:
    most: dict[str, int] = {}
    gpus: dict[str, int] = {}
    for n in nodes:
        if n.model:
            most[n.model] = max(most.get(n.model, 0), n.gpus)
            gpus[n.model] = gpus.get(n.model, 0) + n.gpus
    shares = sorted(gpus.values())
    median = shares[len(shares) // 2]
    rare = sorted(m for m, g in gpus.items() if g < median)
    share = sum(gpus[m] for m in rare) / sum(gpus.values())
    out = []
    for p in pods:
        if p.num_gpu > 0 and rng.random() < share:
            models = [m for m in rare if most[m] >= p.num_gpu]
            if models:
                pick = rng.choices(models, weights=[gpus[m] for m in models])[0]
                p = replace(p, gpu_spec=pick)
        out.append(p)
    return out


def _multigpu_pinned(
    pods: Sequence[PodSpec], nodes: Sequence[NodeSpec], rng: random.Random
) -> list[PodSpec]:
    return _gpumodel_constrained(_multigpu_heavy(pods, nodes, rng), nodes, rng, share=0.2)


SYNTHETIC: dict[
    str, Callable[[Sequence[PodSpec], Sequence[NodeSpec], random.Random], list[PodSpec]]
] = {
    "multigpu-heavy": _multigpu_heavy,
    "gpumodel-constrained": _gpumodel_constrained,
    "cpu-heavy": _cpu_heavy,
    "multigpu-heavier": _multigpu_heavier,
    "rare-model-pinned": _rare_model_pinned,
    "multigpu-pinned": _multigpu_pinned,
}


def synthesize(
    pods: Sequence[PodSpec], nodes: Sequence[NodeSpec], name: str, seed: int
) -> list[PodSpec]:
    """Apply the transform ``name`` with its own ``random.Random(seed)``."""
    return SYNTHETIC[name](pods, nodes, random.Random(f"{name}:{seed}"))
