"""Why nothing in a pool fits a request: the actual cause, in words (pure).

:func:`why_nothing_fits` is asked once placement found no node (admission's refusal and
queue reasons). It tells apart the causes an admin acts on differently:

* no free capacity in the pool at all (every GPU busy, or less free memory in total than
  the request needs);
* enough free GPUs in total but no node with as many free together (whole GPUs), naming
  the node with the most;
* enough free memory in total but fragmented across cards (fractions), with the most free
  on one card;
* the memory is there but the compute share is taken;
* the GPUs are there but their nodes lack CPU or RAM, or are cordoned;
* no GPU of the models the request allows.

It scans the pool once (GPUs x nodes, ~4 ms for 4,000 GPUs), on the refusal path only, and
remembers its answer per request shape until the state changes (a flood of refusals of one
shape costs one scan).
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

from .model import Request, SharingMode
from .state import ClusterState, GPUState, NodeState


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _model_ok(gs: GPUState, request: Request) -> bool:
    return not request.gpu_models or gs.gpu.model in request.gpu_models


def _host_short(nodes: Sequence[NodeState], request: Request, what: str) -> str:
    """Why none of ``nodes`` (those with room on their GPUs) can host the request."""
    if all(ns.cordoned for ns in nodes):
        verb = "is" if len(nodes) == 1 else "are"
        return f"the {_plural(len(nodes), 'node')} with {what} {verb} cordoned"
    open_nodes = [ns for ns in nodes if not ns.cordoned]
    cpu_short = [ns for ns in open_nodes if request.cpu_milli > ns.free_cpu]
    mem_short = [ns for ns in open_nodes if request.memory_mib > ns.free_mem]
    parts = []
    if cpu_short:
        most = max(cpu_short, key=lambda ns: ns.free_cpu)
        parts.append(
            f"CPU ({request.cpu_milli / 1000:g} cores asked, at most {most.free_cpu / 1000:g} "
            f"free on node {most.node.name})"
        )
    if mem_short:
        most = max(mem_short, key=lambda ns: ns.free_mem)
        parts.append(
            f"RAM ({request.memory_mib} MiB asked, at most {most.free_mem} MiB free on "
            f"node {most.node.name})"
        )
    if not parts:
        return f"no node can host {request.gpu.describe()}"
    verb = "lacks" if len(open_nodes) == 1 else "lack"
    return f"the {_plural(len(open_nodes), 'node')} with {what} {verb} " + " and ".join(parts)


def _why_whole(nodes: Sequence[NodeState], request: Request, count: int) -> str:
    total_gpus = free = best = 0
    best_node = ""
    for ns in nodes:
        if ns.cordoned:
            continue
        mine = [g for g in ns.gpus if _model_ok(g, request)]
        total_gpus += len(mine)
        idle = sum(1 for g in mine if g.idle)
        free += idle
        if idle > best:
            best, best_node = idle, ns.node.name
    if free < count:
        return (
            f"no free capacity in the pool: {free} of {_plural(total_gpus, 'GPU')} free, "
            f"{count} asked"
        )
    if best < count:
        return (
            f"enough free GPUs in total ({free}) but no node has {count} free together "
            f"(largest: {best} on node {best_node})"
        )
    roomy = [
        ns for ns in nodes if sum(1 for g in ns.gpus if g.idle and _model_ok(g, request)) >= count
    ]
    return _host_short(roomy, request, f"{count} free GPU" + ("s" if count > 1 else ""))


def _why_fraction(nodes: Sequence[NodeState], request: Request) -> str:
    ask = request.gpu
    cards = [g for ns in nodes if not ns.cordoned for g in ns.gpus if _model_ok(g, request)]
    open_cards = [g for g in cards if not g.whole]
    if not open_cards:
        return (
            "no free capacity in the pool: every GPU is held whole" if cards
            else "no free capacity in the pool: every node is cordoned"
        )
    need = min(ask.memory_on(g.gpu, g.capacity_mib) for g in open_cards)
    roomy = [g for g in open_cards if ask.memory_on(g.gpu, g.capacity_mib) <= g.free_mib]
    if not roomy:
        total = sum(g.free_mib for g in open_cards)
        most = max(open_cards, key=lambda g: g.free_mib)
        if total >= need:
            return (
                f"memory fragmented across cards: {total} MiB free in total but at most "
                f"{most.free_mib} MiB on one card (GPU {most.gpu.index} of node {most.node}), "
                f"{need} MiB needed"
            )
        return (
            f"no free capacity in the pool: {total} MiB of GPU memory free in total, "
            f"{need} MiB needed"
        )
    compute = ask.compute_on()
    both = [g for g in roomy if compute <= g.free_compute]
    if not both:
        most = max(roomy, key=lambda g: g.free_compute)
        return (
            f"compute taken: the cards with {need} MiB free have at most "
            f"{most.free_compute / 10:g} % of their compute free, {compute / 10:g} % asked"
        )
    names = {g.node for g in both}
    hosts = [ns for ns in nodes if ns.node.name in names]
    return _host_short(hosts, request, f"room for {ask.describe()} on a GPU")


_ANSWERS: weakref.WeakKeyDictionary[ClusterState, tuple[int, dict[Any, str]]] = (
    weakref.WeakKeyDictionary()
)
_KEEP = 256  # shapes remembered per state version


def why_nothing_fits(state: ClusterState, request: Request) -> str:
    """The cause, in words, that no node of the request's pool can take it now."""
    key = (request.pool, request.gpu, request.cpu_milli, request.memory_mib,
           request.gpu_models)
    version, answers = _ANSWERS.get(state, (-1, {}))
    if version != state.version:
        answers = {}
        _ANSWERS[state] = (state.version, answers)
    found = answers.get(key)
    if found is None:
        found = _why(state, request)
        if len(answers) < _KEEP:
            answers[key] = found
    return found


def _why(state: ClusterState, request: Request) -> str:
    pool = state.policy.pool(request.pool)
    nodes = state.by_pool.get(request.pool, [])
    if pool is None or not nodes:
        return f"pool {request.pool} has no nodes"
    if all(ns.cordoned for ns in nodes):
        return f"every node of pool {request.pool} is cordoned"
    if request.gpu_models and not any(
        _model_ok(g, request) for ns in nodes for g in ns.gpus
    ):
        return f"no GPU of model {', '.join(sorted(request.gpu_models))} in pool {pool.name}"
    ask = request.gpu
    if ask.is_empty:
        return _host_short([ns for ns in nodes if not ns.cordoned], request, "no GPU asked")
    if ask.whole or pool.mode in (SharingMode.EXCLUSIVE, SharingMode.MIG):
        return _why_whole(nodes, request, ask.whole or 1)
    return _why_fraction(nodes, request)
