"""Preemption: whom to stop so that a request inside its team's guarantee fits.

Rules (see DESIGN.md):

* only grants in the request's pool are candidates;
* a grant *borrowed* by another team is always reclaimable by a request inside its
  own team's guarantee, whatever its priority: borrowing is lent capacity, and a
  guarantee that could be refused by a borrower would not be a guarantee;
* otherwise a grant is a candidate only if its priority class is preemptible and its
  priority is lower than the request's;
* an interactive server inside its own team's guarantee is never a victim;
* among the sets of victims that free enough room on one node, the plan loses the
  least work: victims cost ``units x time held``, a quarter of that when they declared
  checkpointing (they resume), and ties go to fewer victims.

The plan is returned, not carried out: the broker notifies the victims, waits their
grace period, stops them, and then grants the waiting request.
"""

from __future__ import annotations

from dataclasses import dataclass

from .model import Grant, Kind, Placement, Request
from .placement import place_on_node
from .state import ClusterState, GPUState, NodeState


@dataclass(frozen=True)
class PreemptionPlan:
    """Victims to stop (all on ``placement.node``) and where the request will land."""

    victims: tuple[str, ...]
    placement: Placement
    lost_work: float


def is_candidate(grant: Grant, request: Request, request_priority: int) -> bool:
    """Whether ``grant`` may be stopped to make room for ``request``."""
    if grant.pool != request.pool:
        return False
    if grant.borrowed and grant.team != request.team:
        return True
    if grant.request.kind is Kind.INTERACTIVE and not grant.borrowed:
        return False
    return grant.preemptible and grant.priority_value < request_priority


def lost_work(grant: Grant, now: float) -> float:
    """Work lost by stopping ``grant`` now, in milli-unit-seconds."""
    held = max(0.0, now - grant.granted_at)
    factor = 0.25 if grant.request.checkpointing else 1.0
    return grant.units_milli * (held + 1.0) * factor


def _scratch(ns: NodeState) -> NodeState:
    """A copy of a node's free capacity that can be changed without touching the state."""
    gpus = [
        GPUState(g.gpu, g.node, g.capacity_mib, g.used_mib, g.used_compute, g.holders, g.whole)
        for g in ns.gpus
    ]
    return NodeState(ns.node, ns.pool, gpus, ns.free_cpu, ns.free_mem, ns.cordoned)


def _remove(scratch: NodeState, grant: Grant) -> None:
    scratch.free_cpu += grant.request.cpu_milli
    scratch.free_mem += grant.request.memory_mib
    for sl in grant.placement.slices:
        gs = scratch.by_uuid[sl.gpu_uuid]
        gs.holders -= 1
        gs.used_mib -= sl.memory_mib
        gs.used_compute -= sl.compute_milli
        if grant.request.gpu.whole:
            gs.whole = False


def _fits_without(ns: NodeState, gone: list[Grant], request: Request) -> Placement | None:
    scratch = _scratch(ns)
    for grant in gone:
        _remove(scratch, grant)
    return place_on_node(scratch, request)


def _plan_on_node(
    ns: NodeState, candidates: list[Grant], pending: list[Grant], request: Request, now: float
) -> PreemptionPlan | None:
    """Cheapest victim set on one node: add victims by cost until it fits, then prune."""
    chosen: list[Grant] = []
    placement = _fits_without(ns, pending, request)
    for grant in sorted(candidates, key=lambda g: lost_work(g, now)):
        if placement is not None:
            break
        chosen.append(grant)
        placement = _fits_without(ns, pending + chosen, request)
    if placement is None:
        return None
    for grant in sorted(chosen, key=lambda g: -lost_work(g, now)):  # drop victims not needed
        rest = [g for g in chosen if g is not grant]
        trial = _fits_without(ns, pending + rest, request)
        if trial is not None:
            chosen, placement = rest, trial
    cost = sum(lost_work(g, now) for g in chosen)
    victims = tuple(g.id for g in pending + chosen)
    return PreemptionPlan(victims, placement, cost)


def plan_preemption(
    state: ClusterState, request: Request, request_priority: int, now: float
) -> PreemptionPlan | None:
    """The plan that frees room for ``request`` losing the least work, or ``None``.

    Grants already being preempted *for this request* count as gone; grants being
    preempted for another request are left to that request. Between plans that lose the
    same work with as many victims, the node whose name sorts first wins.
    """
    by_node: dict[str, list[Grant]] = {}
    pending: dict[str, list[Grant]] = {}
    for grant in state.possible_victims(request.pool):  # none other is ever a candidate
        target = state.preempting.get(grant.id)
        if target == request.id:
            pending.setdefault(grant.placement.node, []).append(grant)
        elif target is None and is_candidate(grant, request, request_priority):
            by_node.setdefault(grant.placement.node, []).append(grant)
    best: PreemptionPlan | None = None
    for name in sorted(by_node.keys() | pending.keys()):  # ties: the first node by name
        plan = _plan_on_node(
            state.nodes[name], by_node.get(name, []), pending.get(name, []), request, now
        )
        if plan is None:
            continue
        if best is None or (plan.lost_work, len(plan.victims)) < (
            best.lost_work,
            len(best.victims),
        ):
            best = plan
    return best
