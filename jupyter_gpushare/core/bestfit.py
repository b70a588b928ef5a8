"""Placement on one node, and plain best fit over a pool (exclusive and MIG pools).

``place_on_node`` answers for one node (preemption uses it to test a node with victims
gone); :func:`_best_fit_scan` is best fit over every node of a pool, the reference that
:class:`_FitIndex` (the pool's nodes in best-fit order, kept up to date by the placement
index of :mod:`.placement`) answers exactly, without the scan.
"""

from __future__ import annotations

import itertools
from bisect import bisect_left, insort

from .model import UNIT, GPUSlice, Placement, Request, SharingMode
from .state import ClusterState, GPUState, NodeState


def _model_ok(gs: GPUState, request: Request) -> bool:
    return not request.gpu_models or gs.gpu.model in request.gpu_models


def _fraction_fits(gs: GPUState, request: Request) -> bool:
    return (
        _model_ok(gs, request)
        and not gs.whole
        and request.gpu.memory_on(gs.gpu, gs.capacity_mib) <= gs.free_mib
        and request.gpu.compute_on() <= gs.free_compute
    )


def node_can_host(ns: NodeState, request: Request) -> bool:
    """CPU, RAM and cordon checks that do not depend on GPUs."""
    return (
        not ns.cordoned and request.cpu_milli <= ns.free_cpu and request.memory_mib <= ns.free_mem
    )


def _slice(gs: GPUState, request: Request) -> GPUSlice:
    ask = request.gpu
    return GPUSlice(gs.gpu.uuid, ask.memory_on(gs.gpu, gs.capacity_mib), ask.compute_on())


def place_on_node(ns: NodeState, request: Request) -> Placement | None:
    """Best placement of ``request`` on one node, or ``None``."""
    if not node_can_host(ns, request):
        return None
    ask = request.gpu
    if ask.is_empty:
        return Placement(ns.node.name, ())
    exclusive = ns.pool.mode in (SharingMode.EXCLUSIVE, SharingMode.MIG)
    if ask.whole or exclusive:
        count = ask.whole or 1
        idle = [g for g in ns.gpus if g.idle and _model_ok(g, request)]
        if len(idle) < count:
            return None
        chosen = idle[:count]
        return Placement(
            ns.node.name,
            tuple(GPUSlice(g.gpu.uuid, g.gpu.memory_mib, UNIT) for g in chosen),
        )
    fits = [g for g in ns.gpus if _fraction_fits(g, request)]
    if not fits:
        return None
    # tightest GPU first; among equals prefer one already shared (keeps idle cards whole)
    best = min(
        fits, key=lambda g: (g.free_mib - ask.memory_on(g.gpu, g.capacity_mib), g.idle, g.gpu.index)
    )
    return Placement(ns.node.name, (_slice(best, request),))


def _leftover(ns: NodeState, placement: Placement) -> tuple[int, int]:
    free_gpus = sum(1 for g in ns.gpus if g.idle) - len(placement.slices)
    return (free_gpus, ns.free_cpu)


def _best_fit_scan(state: ClusterState, request: Request) -> Placement | None:
    """Plain best fit over every node of the pool: the reference ``_best_fit`` must match.

    The best node leaves the fewest idle GPUs, then the least free CPU; ties go to the
    node listed first.
    """
    best: tuple[tuple[int, int], Placement] | None = None
    for ns in state.by_pool.get(request.pool, ()):
        placement = place_on_node(ns, request)
        if placement is None:
            continue
        score = _leftover(ns, placement)
        if best is None or score < best[0]:
            best = (score, placement)
    return best[1] if best else None


class _FitIndex:
    """The nodes of one pool in best-fit order, grouped by the GPU models they carry.

    Each group keeps a sorted list of ``(idle GPUs, free CPU, position)``: the scan's
    score (idle GPUs left, free CPU left, node order) shifted by a constant for a given
    request, since every node takes the same number of GPUs from it. The best node is
    then the first entry, in that order, that can host the request: per idle count
    (from the fewest that can fit), bisect past the nodes short of CPU and check the
    rest one by one (RAM, cordon, GPU models, a fraction's memory) until one fits.
    """

    def __init__(self, nodes: list[NodeState]) -> None:
        self.nodes = nodes
        self.pos: dict[str, int] = {ns.node.name: i for i, ns in enumerate(nodes)}
        self.group_of: list[int] = []
        self.groups: list[list[tuple[int, int, int]]] = []
        self.group_models: list[frozenset[str]] = []
        self.keys: list[tuple[int, int, int]] = []
        self.room: list[tuple[int, int]] = []  # per node: most free MiB, compute on one GPU
        self.max_gpus = 0
        self.exclusive = bool(nodes) and nodes[0].pool.mode in (
            SharingMode.EXCLUSIVE,
            SharingMode.MIG,
        )
        gid: dict[frozenset[str], int] = {}
        for i, ns in enumerate(nodes):
            models = ns.node.gpu_models
            g = gid.get(models)
            if g is None:
                g = gid[models] = len(self.groups)
                self.groups.append([])
                self.group_models.append(models)
            self.group_of.append(g)
            key = (ns.idle_gpus, ns.free_cpu, i)
            self.keys.append(key)
            self.room.append(_room(ns))
            self.groups[g].append(key)
            self.max_gpus = max(self.max_gpus, len(ns.gpus))
        for group in self.groups:
            group.sort()

    def refresh(self, name: str) -> None:
        i = self.pos[name]
        ns = self.nodes[i]
        self.room[i] = _room(ns)
        key = (ns.idle_gpus, ns.free_cpu, i)
        old = self.keys[i]
        if key == old:
            return
        group = self.groups[self.group_of[i]]
        del group[bisect_left(group, old)]
        insort(group, key)
        self.keys[i] = key

    def best(self, request: Request) -> Placement | None:
        ask = request.gpu
        cpu = request.cpu_milli
        models = request.gpu_models
        groups = [
            group
            for group, have in zip(self.groups, self.group_models, strict=True)
            if not models or ask.is_empty or not have.isdisjoint(models)
        ]
        nodes, room = self.nodes, self.room
        mem = request.memory_mib
        # a fraction needs one GPU with this much room (exact for explicit memory)
        fraction = ask.is_fraction and not self.exclusive
        need_mib = (ask.memory_mib or 0) if fraction else 0
        need_compute = ask.compute_on() if fraction else 0
        for k in range(ask.whole, self.max_gpus + 1):
            found: tuple[tuple[int, int, int], Placement] | None = None
            for group in groups:
                j = bisect_left(group, (k, cpu, -1))
                for key in itertools.islice(group, j, None):
                    if key[0] != k or (found is not None and key >= found[0]):
                        break
                    ns = nodes[key[2]]
                    if ns.cordoned or ns.free_mem < mem:
                        continue
                    most_mib, most_compute = room[key[2]]
                    if most_mib < need_mib or most_compute < need_compute:
                        continue
                    placement = place_on_node(ns, request)
                    if placement is not None:
                        found = (key, placement)
                        break
            if found is not None:
                return found[1]
        return None


def _room(ns: NodeState) -> tuple[int, int]:
    """The most free memory and the most free compute on one shareable GPU of a node."""
    mib = compute = 0
    for g in ns.gpus:
        if not g.whole:
            mib = max(mib, g.free_mib)
            compute = max(compute, g.free_compute)
    return mib, compute
