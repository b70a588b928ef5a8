"""Scarcity of a request shape in one pool: how few of the pool's GPUs could ever host it.

FGD's target workload weighs each shape by how often it is asked for. A shape that only a
rare kind of node can host (one GPU model, or the few nodes with enough CPU for an 8-GPU
pod) then weighs as little as its count, and a common small request lands on that rare
node as readily as on any other: the shape that needed it fails later. Here a shape's
weight is its count times its *scarcity*, the pool's GPU capacity over the capacity of
the node kinds that could host it when empty (GPU model, GPU count, CPU), capped at
``SCARCITY_CAP``; the target is then the heaviest shapes covering ``POPULARITY`` of the
weight, renormalised, so a rare node's special use shows in the fragmentation a small
request would add there. Shapes no node of the pool can host keep weight 1 (nothing to
protect). The pool's kinds never change, so a shape's scarcity is computed once.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from .fragmentation import POPULARITY, Shape
from .state import NodeState

SCARCITY_CAP = 32.0
"""The most a shape's weight is multiplied by for being hostable on few of the pool's GPUs."""


@dataclass(frozen=True)
class HostKind:
    """What decides whether an empty node can host a shape: its models, GPUs and CPU."""

    models: frozenset[str]
    gpus: int
    cpu_milli: int


class Scarcity:
    """Per-shape scarcity over one pool's node kinds (GPUs of each kind counted)."""

    def __init__(self, kinds: Iterable[tuple[HostKind, int]], cap: float = SCARCITY_CAP) -> None:
        self.kinds = [(kind, gpus) for kind, gpus in kinds if gpus > 0]
        self.capacity = sum(gpus for _, gpus in self.kinds)
        self.cap = cap
        self._factor: dict[Shape, float] = {}

    def factor(self, shape: Shape) -> float:
        """Pool GPUs over the GPUs of kinds that can host ``shape`` (1 .. ``cap``)."""
        got = self._factor.get(shape)
        if got is None:
            got = self._factor[shape] = self._compute(shape)
        return got

    def _compute(self, shape: Shape) -> float:
        cpu, milli, num, models = shape
        if milli == 0 or not self.capacity:
            return 1.0
        hosts = sum(
            gpus
            for kind, gpus in self.kinds
            if kind.gpus >= num
            and kind.cpu_milli >= cpu
            and (not models or not kind.models.isdisjoint(models))
        )
        if hosts == 0:
            return 1.0
        return min(self.cap, self.capacity / hosts)

    def target(
        self, counts: Counter[Shape], threshold: float = POPULARITY
    ) -> list[tuple[Shape, float]]:
        """The heaviest shapes (count times scarcity) covering ``threshold``, renormalised."""
        weighed = [(shape, count * self.factor(shape)) for shape, count in counts.items()]
        total = sum(w for _, w in weighed)
        if total <= 0:
            return []
        weighed.sort(key=lambda kv: (kv[1], kv[0]), reverse=True)
        chosen: list[tuple[Shape, float]] = []
        cum = 0.0
        for shape, weight in weighed:
            if cum >= threshold * total:
                break
            chosen.append((shape, weight))
            cum += weight
        return [(shape, weight / cum) for shape, weight in chosen]


def scarcity_of(nodes: Iterable[NodeState]) -> Scarcity:
    """A pool's node kinds as hosts (models, GPU count, CPU), with their GPUs counted."""
    gpus: dict[HostKind, int] = {}
    for ns in nodes:
        kind = HostKind(ns.node.gpu_models, len(ns.gpus), ns.node.cpu_milli)
        gpus[kind] = gpus.get(kind, 0) + len(ns.gpus)
    return Scarcity(gpus.items())
