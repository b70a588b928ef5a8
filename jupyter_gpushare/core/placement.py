"""Placement: which node and which GPU(s) a request lands on.

``place(state, request)`` returns a :class:`Placement` or ``None`` when nothing fits.
It never changes the state; the caller applies the grant. ``place_on_node`` answers
the same question for one node (preemption uses it to test a node with victims gone).

This first version is best-fit: the node and GPU that leave the least free capacity.
"""

from __future__ import annotations

from .model import GPUSlice, Placement, Request, SharingMode
from .state import ClusterState, GPUState, NodeState


def _model_ok(gs: GPUState, request: Request) -> bool:
    return not request.gpu_models or gs.gpu.model in request.gpu_models


def _fraction_fits(gs: GPUState, request: Request) -> bool:
    return (
        _model_ok(gs, request)
        and not gs.whole
        and request.gpu.memory_on(gs.gpu) <= gs.free_mib
        and request.gpu.compute_on() <= gs.free_compute
    )


def node_can_host(ns: NodeState, request: Request) -> bool:
    """CPU, RAM and cordon checks that do not depend on GPUs."""
    return (
        not ns.cordoned
        and request.cpu_milli <= ns.free_cpu
        and request.memory_mib <= ns.free_mem
    )


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
            tuple(GPUSlice(g.gpu.uuid, g.gpu.memory_mib, 1000) for g in chosen),
        )
    fits = [g for g in ns.gpus if _fraction_fits(g, request)]
    if not fits:
        return None
    # tightest GPU first; among equals prefer one already shared (keeps idle cards whole)
    best = min(fits, key=lambda g: (g.free_mib - ask.memory_on(g.gpu), g.idle, g.gpu.index))
    return Placement(
        ns.node.name, (GPUSlice(best.gpu.uuid, ask.memory_on(best.gpu), ask.compute_on()),)
    )


def _leftover(ns: NodeState, placement: Placement) -> tuple[int, int]:
    free_gpus = sum(1 for g in ns.gpus if g.idle) - len(placement.slices)
    return (free_gpus, ns.free_cpu)


def place(state: ClusterState, request: Request) -> Placement | None:
    """Choose a node and GPU(s) for ``request`` in its pool, or ``None`` if nothing fits."""
    best: tuple[tuple[int, int], Placement] | None = None
    for ns in state.by_pool.get(request.pool, ()):
        placement = place_on_node(ns, request)
        if placement is None:
            continue
        score = _leftover(ns, placement)
        if best is None or score < best[0]:
            best = (score, placement)
    return best[1] if best else None
