"""Demand from the planner's team inputs (``jupyter-gpushare plan`` input file): a month
synthesised from each team's kinds of work, for sites without history. Pure.

For each task need of the plan (today's scenario, not the grown one): the ask is what the
planner found one task takes (whole cards, or a fraction of one in a shared pool), in the
planner's pool (``train``, ``inference``, ``debug``), which the policy must have. The
assumptions, stated in the output's demand model and in ``docs/whatif.md``:

* **hold** per kind: training 8 h, fine-tuning 4 h, inference 24 h, debugging 2 h
  (:data:`HOLD_S`), exponential around that mean;
* **arrivals** spread uniformly over the month, as many as keep
  ``concurrent x`` :data:`AVERAGE_OF_PEAK` tasks running on average
  (``concurrent`` is the *peak*): ``concurrent x 0.6 x month / hold``;
* **kind and class**: training and fine-tuning are batch jobs at the class ``training``
  (else the highest class), inference and debugging are servers at ``interactive`` (else
  the lowest class that is not preemptible); five users per team.
"""

from __future__ import annotations

from typing import Any

from ..core.model import GPUAsk, Kind, Policy
from .demand import Demand
from .synth import Shape, synth_month

HOLD_S = {"training": 8 * 3600.0, "fine-tuning": 4 * 3600.0, "inference": 24 * 3600.0,
          "debugging": 2 * 3600.0}
AVERAGE_OF_PEAK = 0.6


class PlanSourceError(ValueError):
    """The plan's work cannot be mapped onto the policy (names what is missing)."""


def _class(policy: Policy, batch: bool) -> str:
    wanted = policy.priority("training" if batch else "interactive")
    if wanted is not None:
        return wanted.name
    ordered = sorted(policy.priority_classes, key=lambda c: c.value)
    steady = [c for c in ordered if not c.preemptible] or ordered
    return (steady[-1] if batch else steady[0]).name


def plan_shapes(plan: Any, policy: Policy, window_s: float) -> list[tuple[Shape, float]]:
    """(shape, expected arrivals in the window) per task need of the plan's today scenario."""
    out = []
    for pool_plan in plan.now.pools:
        for need in pool_plan.tasks:
            if need.problem or not (need.whole_cards or need.milli):
                continue
            w = need.workload
            if policy.pool(need.pool) is None:
                raise PlanSourceError(f"the plan puts {w.team}/{w.name} in pool {need.pool}, "
                                      "which the policy does not have")
            if policy.team(w.team) is None:
                raise PlanSourceError(f"the plan's team {w.team} is not in the policy")
            batch = w.kind in ("training", "fine-tuning")
            hold = HOLD_S[w.kind]
            ask = GPUAsk(whole=need.whole_cards) if need.whole_cards else GPUAsk(
                fraction_milli=need.milli)
            shape = Shape(w.team, need.pool, ask, _class(policy, batch),
                          Kind.BATCH if batch else Kind.INTERACTIVE, mean_hold_s=hold,
                          cpu_milli=0, memory_mib=0)
            out.append((shape, need.concurrent * AVERAGE_OF_PEAK * window_s / hold))
    return out


def plan_month(plan: Any, policy: Policy, start: float, end: float, seed: int = 0
               ) -> list[Demand]:
    """The synthesised month (see the module's docstring)."""
    shapes = plan_shapes(plan, policy, end - start)
    if not shapes:
        return []
    weighted = [Shape(**{**s.__dict__, "weight": n}) for s, n in shapes]
    count = max(1, round(sum(n for _, n in shapes)))
    return synth_month(weighted, count, start, end, seed=seed, prefix="plan-")
