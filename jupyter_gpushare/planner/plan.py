"""The capacity plan: cards per pool and model, card comparison, growth, power (pure).

:func:`make_plan` takes a :class:`~.model.PlanInput` and returns a :class:`Plan` with two
scenarios, *now* (the peak concurrency as given) and *grown* (after the planned growth),
each with its pools and its power plan, plus a comparison of one large card with two
smaller ones for every kind of work. Memory is planned by peak, never by average.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .memory import Estimate, cards_for, estimate, gib
from .model import POOL_OF_KIND, Card, PlanInput, Workload
from .packing import UNIT, Item, fraction_milli, pack, per_card, task_mib, usable_mib
from .power import PowerPlan, place, servers_for

POOL_MODES = {"train": "exclusive", "inference": "shared", "debug": "debug"}
POOL_ORDER = ("train", "inference", "debug")


@dataclass(frozen=True)
class TaskNeed:
    """What one kind of work needs in its pool."""

    workload: Workload
    estimate: Estimate
    pool: str
    card: Card
    concurrent: int
    whole_cards: int  # cards per task when it takes whole cards (0: packed fraction)
    milli: int  # fraction of a card per task when packed (0: whole cards)
    memory_mib: int  # peak per card, rounded up to MiB
    problem: str | None = None

    @property
    def units_milli(self) -> int:
        """GPU units (milli) the team needs for this work at peak."""
        per_task = self.whole_cards * UNIT if self.whole_cards else self.milli
        return per_task * self.concurrent


@dataclass(frozen=True)
class PoolPlan:
    """One pool: its card, how many, and what is on them."""

    name: str
    mode: str
    card: Card
    usable_mib: int  # per card, for packed pools (headroom taken off)
    tasks: tuple[TaskNeed, ...]
    whole_cards: int  # cards taken by whole-card tasks
    packed: tuple[tuple[tuple[str, int], ...], ...]  # packed cards: (task label, milli)

    @property
    def cards(self) -> int:
        return self.whole_cards + len(self.packed)


@dataclass(frozen=True)
class Scenario:
    """The pools and the power of one point in time."""

    label: str
    pools: tuple[PoolPlan, ...]
    power: PowerPlan

    def pool(self, name: str) -> PoolPlan | None:
        return next((p for p in self.pools if p.name == name), None)

    @property
    def cards(self) -> int:
        return sum(p.cards for p in self.pools)


@dataclass(frozen=True)
class Comparison:
    """One large card against two smaller ones for one kind of work."""

    workload: Workload
    large: Card
    small: Card | None
    large_tasks: int  # tasks of this work one large card holds (0: does not fit one)
    small_tasks: int  # tasks two smaller cards hold together
    large_cards: int | None  # cards per task on the large card (sharded training)
    small_cards: int | None
    verdict: str  # "two smaller", "one large" or "no smaller card"
    why: str


@dataclass(frozen=True)
class Plan:
    """The whole plan."""

    input: PlanInput
    now: Scenario
    grown: Scenario
    comparisons: tuple[Comparison, ...]
    problems: tuple[str, ...]

    @property
    def growth_applies(self) -> bool:
        return any(self.concurrent(w, grown=True) != w.concurrent
                   for t in self.input.teams for w in t.workloads)

    def concurrent(self, w: Workload, grown: bool) -> int:
        return grown_concurrency(self.input, w) if grown else w.concurrent


def growth_of(inp: PlanInput, w: Workload) -> float:
    """The growth that applies to ``w``: its own, else its team's, else the organisation's."""
    if w.growth is not None:
        return w.growth
    team = next((t for t in inp.teams if t.name == w.team), None)
    if team is not None and team.growth is not None:
        return team.growth
    return inp.settings.growth


def grown_concurrency(inp: PlanInput, w: Workload) -> int:
    """Peak concurrency after growth, rounded up to whole tasks."""
    return max(w.concurrent, math.ceil(w.concurrent * (1.0 + growth_of(inp, w)) - 1e-9))


def _pool_card(inp: PlanInput, pool: str) -> Card:
    name = {"train": inp.cards.train, "inference": inp.cards.inference,
            "debug": inp.cards.debug}[pool]
    return inp.catalogue[name]


def task_label(w: Workload) -> str:
    return f"{w.team}/{w.name}"


def need(inp: PlanInput, w: Workload, concurrent: int, est: Estimate | None = None) -> TaskNeed:
    """Cards or fraction one task of ``w`` takes, for ``concurrent`` tasks."""
    pool = POOL_OF_KIND[w.kind]
    card = _pool_card(inp, pool)
    est = est or estimate(w, inp.settings)
    if POOL_MODES[pool] == "exclusive":
        n = cards_for(est, card.memory_bytes)
        if n is None:
            return TaskNeed(w, est, pool, card, concurrent, 0, 0, task_mib(est.total_bytes),
                            f"{task_label(w)} does not fit {card.name} even split over many "
                            f"cards: {gib(est.fixed_bytes)} of it cannot be sharded (lower "
                            "micro_batch or sequence_length, or set activation_checkpointing)")
        return TaskNeed(w, est, pool, card, concurrent, n, 0,
                        task_mib(est.per_card_bytes(n)))
    usable = usable_mib(card.memory_bytes, inp.settings.headroom)
    mib = task_mib(est.total_bytes)
    milli = fraction_milli(mib, usable, w.compute_share)
    if milli <= UNIT:
        return TaskNeed(w, est, pool, card, concurrent, 0, milli, mib)
    n = cards_for(est, usable * 1024 * 1024)
    if n is None:
        return TaskNeed(w, est, pool, card, concurrent, 0, 0, mib,
                        f"{task_label(w)} does not fit {card.name} with "
                        f"{inp.settings.headroom:.0%} headroom even split over many cards")
    return TaskNeed(w, est, pool, card, concurrent, n, 0, task_mib(est.per_card_bytes(n)))


def _pools(inp: PlanInput, grown: bool, estimates: dict[tuple[str, str], Estimate]
           ) -> tuple[tuple[PoolPlan, ...], list[str]]:
    by_pool: dict[str, list[TaskNeed]] = {}
    problems: list[str] = []
    for team in inp.teams:
        for w in team.workloads:
            count = grown_concurrency(inp, w) if grown else w.concurrent
            t = need(inp, w, count, estimates[(w.team, w.name)])
            if t.problem:
                problems.append(t.problem)
            elif t.whole_cards > inp.racks.gpus_per_server:
                problems.append(f"{task_label(w)} needs {t.whole_cards} cards per task, more "
                                f"than one server holds ({inp.racks.gpus_per_server}): "
                                "multi-node work, left out of the draft profiles")
            by_pool.setdefault(t.pool, []).append(t)
    pools = []
    for name in POOL_ORDER:
        tasks = by_pool.get(name)
        if not tasks:
            continue
        card = tasks[0].card
        whole = sum(t.whole_cards * t.concurrent for t in tasks if not t.problem)
        items = [Item(task_label(t.workload), t.milli, t.concurrent)
                 for t in tasks if t.milli and not t.problem]
        packed = tuple(tuple(b) for b in pack(items))
        pools.append(PoolPlan(name, POOL_MODES[name], card,
                              usable_mib(card.memory_bytes, inp.settings.headroom),
                              tuple(tasks), whole, packed))
    return tuple(pools), problems


def _scenario(inp: PlanInput, label: str, grown: bool,
              estimates: dict[tuple[str, str], Estimate]) -> tuple[Scenario, list[str]]:
    pools, problems = _pools(inp, grown, estimates)
    servers = [s for p in pools for s in servers_for(p.name, p.card, p.cards, inp.racks)]
    power = place(servers, inp.racks)
    if power.too_big:
        problems.append(f"{label}: a server draws {power.servers[power.too_big[0]].watts:.0f} W "
                        f"at peak, more than one rack's {power.rack_limit_w:.0f} W "
                        f"({power.limited_by})")
    if power.racks_needed > power.available_racks:
        problems.append(f"{label}: needs {power.racks_needed} racks for "
                        f"{power.peak_w / 1000:.1f} kW at peak; {power.available_racks} "
                        f"available ({power.rack_limit_w / 1000:.1f} kW each, limited by "
                        f"{power.limited_by})")
    return Scenario(label, pools, power), problems


def smaller_card(inp: PlanInput, large: Card) -> Card | None:
    """The card two of which are compared with one ``large`` card."""
    if inp.cards.smaller:
        card = inp.catalogue[inp.cards.smaller]
        if card.memory_bytes < large.memory_bytes:
            return card
    candidates = [c for c in inp.catalogue.values()
                  if c.vendor == large.vendor and c.memory_bytes < large.memory_bytes]
    if not candidates:
        return None
    half = large.memory_bytes / 2
    return min(candidates, key=lambda c: (abs(c.memory_bytes - half), -c.bf16_tflops, c.name))


def compare(inp: PlanInput, t: TaskNeed) -> Comparison:
    """One large card (the pool's) against two smaller ones for the work of ``t``."""
    w, large = t.workload, t.card
    small = smaller_card(inp, large)
    est = t.estimate
    if small is None:
        return Comparison(w, large, None, 0, 0, None, None, "no smaller card",
                          f"the catalogue has no {large.vendor} card smaller than {large.name}")
    need_gib = gib(est.total_bytes)
    if POOL_MODES[t.pool] == "exclusive":
        n_large = cards_for(est, large.memory_bytes)
        n_small = cards_for(est, small.memory_bytes)
        large_tasks = 1 if n_large == 1 else 0
        small_tasks = 2 if n_small == 1 else (1 if n_small == 2 else 0)
        if n_small == 1:
            verdict = "two smaller"
            why = (f"the task ({need_gib}) fits one {small.name} ({gib(small.memory_bytes)}): "
                   f"two of them run 2 tasks at once where one {large.name} runs 1")
        elif n_large == 1:
            verdict = "one large"
            why = (f"no choice: the task needs {need_gib}, more than one {small.name} "
                   f"({gib(small.memory_bytes)}); it fits one {large.name}")
        else:
            verdict = "one large"
            why = (f"no choice: the task needs {need_gib} and is split over "
                   f"{n_large if n_large else 'too many'} {large.name} or "
                   f"{n_small if n_small else 'too many'} {small.name}; fewer, larger cards "
                   "shard less")
        return Comparison(w, large, small, large_tasks, small_tasks, n_large, n_small,
                          verdict, why)
    headroom = inp.settings.headroom
    mib = task_mib(est.total_bytes)
    k_large = per_card(fraction_milli(mib, usable_mib(large.memory_bytes, headroom),
                                      w.compute_share))
    k_small = per_card(fraction_milli(mib, usable_mib(small.memory_bytes, headroom),
                                      w.compute_share))
    if k_small >= 1 and 2 * k_small >= k_large:
        verdict = "two smaller"
        why = (f"the task ({need_gib}) fits a {small.name} with {headroom:.0%} headroom: two "
               f"hold {2 * k_small} at once, one {large.name} holds {k_large}")
    elif k_small >= 1:
        verdict = "one large"
        why = (f"one {large.name} packs {k_large} tasks, two {small.name} only "
               f"{2 * k_small}")
    else:
        verdict = "one large"
        why = (f"no choice: the task needs {need_gib}, more than a {small.name} offers with "
               f"{headroom:.0%} headroom ({gib(usable_mib(small.memory_bytes, headroom) * 2**20)})")
    return Comparison(w, large, small, k_large, 2 * k_small, None, None, verdict, why)


def make_plan(inp: PlanInput) -> Plan:
    """Plan the cards, pools, growth and power for ``inp``."""
    estimates = {(w.team, w.name): estimate(w, inp.settings)
                 for t in inp.teams for w in t.workloads}
    now, problems = _scenario(inp, "now", False, estimates)
    grown, grown_problems = _scenario(
        inp, f"after {inp.settings.horizon_months} months' growth", True, estimates)
    comparisons = tuple(compare(inp, t) for p in now.pools for t in p.tasks if not t.problem)
    unique = tuple(dict.fromkeys((*problems, *grown_problems)))
    return Plan(inp, now, grown, comparisons, unique)
