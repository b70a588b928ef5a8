"""Issue 23: the planner reserves the runtime reserve (and activations) on EVERY card of a
multi-card task, not once for the task.

A task split over n cards holds on each card its share of the model states plus the whole
reserve (CUDA/ROCm context, allocator slack) and its own micro-batch's activations. The
plausible bug: counting the reserve once for the task (sharding it like the model states),
which under-sizes each card and, at the boundary, gives one card too few.
"""

from __future__ import annotations

from pathlib import Path

from jupyter_gpushare.planner import make_plan, read_plan_file
from jupyter_gpushare.planner.memory import Component, Estimate, _reserve, cards_for
from jupyter_gpushare.planner.model import Settings

DATA = Path(__file__).parent / "data" / "planner"
GIB = 1024**3
MIB = 1024**2
CARD = 80 * GIB
ACT = 822_083_584  # activations of org1's fine-tune (checkpointing), per card


def an_estimate(shardable: float, reserve_gib: int = 1) -> Estimate:
    settings = Settings(runtime_reserve_bytes=reserve_gib * GIB)
    return Estimate((
        Component("model states", shardable, "given"),
        Component("activations", ACT, "given", shardable=False),
        _reserve(settings),
    ), ())


def test_every_card_holds_the_whole_reserve() -> None:
    est = an_estimate(100 * GIB)
    for n in (1, 2, 4, 8):
        # each card: its share of the states + the reserve + its activations, whatever n
        assert est.per_card_bytes(n) == 100 * GIB / n + ACT + GIB
    # split over 4 cards the task holds 4 reserves, not 1
    assert 4 * est.per_card_bytes(4) == 100 * GIB + 4 * (ACT + GIB)


def test_cards_per_task_at_the_exact_boundary() -> None:
    room = CARD - ACT - GIB  # what one card has for the states once reserve and batch are in
    assert cards_for(an_estimate(3 * room), CARD) == 3  # exactly three cards full
    assert cards_for(an_estimate(3 * room + 1), CARD) == 4  # one byte more: a fourth card
    # a larger reserve per card needs more cards for the same states
    assert cards_for(an_estimate(3 * room, reserve_gib=2), CARD) == 4
    # one card when everything, the single reserve included, fits it
    assert cards_for(an_estimate(CARD - ACT - GIB), CARD) == 1
    assert cards_for(an_estimate(CARD - ACT - GIB + 1), CARD) == 2


def test_org1_full_fine_tune_per_card_memory_counts_the_reserve_on_each_card() -> None:
    plan = make_plan(read_plan_file(DATA / "org1-finetune-7b.yaml"))
    alpha = next(t for p in plan.now.pools for t in p.tasks
                 if (t.workload.team, t.workload.name) == ("alpha", "full-ft"))
    assert alpha.whole_cards == 2
    # 107.84e9 B of states / 2 = 53.92e9 B per card + 822,083,584 B activations + 1 GiB
    # reserve = 55,815,825,408 B = 53,230.12 MiB -> 53,231 MiB on EACH of the 2 cards
    # (the reserve counted once for the task would give 52,719 MiB)
    assert alpha.memory_mib == 53_231
