"""The lower bound ``benchmarks/packing_bound.py`` prints is a bound (issue 29).

It says how far the packing figure could still fall: no placement can leave fewer GPUs
unallocated. A bound set too high would make the README's claim about the target false,
so it is checked against hand-solved cases and against every policy the simulator runs.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCH))

import alibaba_like  # noqa: E402
import packing_bound as pb  # noqa: E402
import packing_sim as sim  # noqa: E402
from packing_gpushare import GPUSharePolicy  # noqa: E402


def test_configurations_are_every_multiset_that_fits_one_gpu() -> None:
    assert sorted(pb.configurations([500, 300])) == [
        (0, 1), (0, 2), (0, 3), (1, 0), (1, 1), (2, 0),
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("fractions", "whole", "gpus", "best"),
    [
        ({810: 3, 190: 3}, 0, 3, 3000),  # each 810 with a 190: every GPU full
        ({810: 3}, 0, 3, 2430),  # nothing fills the gaps
        ({470: 3}, 0, 2, 1410),  # 470 + 470 and 470
        ({470: 5}, 0, 2, 1880),  # two pairs; the fifth fits nowhere
        ({500: 2}, 2, 2, 2000),  # two whole GPUs, or the two halves on one
        ({250: 3}, 3, 3, 3000),  # the whole ones take every GPU
    ],
)
def test_the_lp_bound_on_hand_solved_cases(
    fractions: dict[int, int], whole: int, gpus: int, best: int
) -> None:
    assert pb.max_allocatable(Counter(fractions), whole, gpus) == pytest.approx(best)


def _pod(k: int, num: int, milli: int) -> sim.PodSpec:
    return sim.PodSpec(f"p{k}", 1000, 1024, num, milli, "")


def test_each_pod_of_the_bin_is_charged_the_bound_of_the_next_checkpoint() -> None:
    """100 GPUs: 99 whole ones (arrived 99 %), then 500, 490 and 10 milli (the 100 % bin),
    then one more whole GPU (101 %). After the 500 at most 99.5 GPUs can be in use, after
    the 490 99.99, after the 10 all 100."""
    pods = [_pod(k, 1, 1000) for k in range(99)]
    pods += [_pod(99, 1, 500), _pod(100, 1, 490), _pod(101, 1, 10), _pod(102, 1, 1000)]
    every = pb.lower_bound(pods, 100_000, 100, checkpoints=3)
    assert every == pytest.approx((0.5 + 0.01 + 0.0) / 3)
    # one checkpoint at the end of the bin: every pod charged its bound (a looser one)
    assert pb.lower_bound(pods, 100_000, 100, checkpoints=1) == pytest.approx(0.0)


def test_the_references_on_hand_solved_cases() -> None:
    """One pool, best fit: the two 300s share a GPU, the 810 takes the other, and the 590
    that arrives at 100 % fits nowhere (29.5 % unallocated). One big node with 3 CPUs: the
    second pod's 2 CPUs are not left, the third's 0.5 are (25 %)."""
    fractions = [_pod(0, 1, 300), _pod(1, 1, 300), _pod(2, 1, 810), _pod(3, 1, 590)]
    assert pb.pool_best_fit(fractions, 2000, 2) == pytest.approx(29.5)
    cpu_bound = [
        sim.PodSpec("a", 2000, 0, 1, 1000, ""),
        sim.PodSpec("b", 2000, 0, 1, 500, ""),
        sim.PodSpec("c", 500, 0, 1, 500, ""),
    ]
    assert pb.big_node(cpu_bound, 2000, 3000) == pytest.approx(25.0)


@pytest.mark.parametrize("seed", [42, 43])
def test_no_policy_leaves_fewer_gpus_unallocated_than_the_bound(seed: int) -> None:
    """On a cluster and pods shaped like the FGD paper's (``alibaba_like``), every policy's
    figure at arrived 100 % is at or above the bound."""
    nodes, trace = alibaba_like.nodes(150), alibaba_like.pods(1600)
    [bound] = pb.bounds(nodes, trace, [seed])
    figures = {}
    factories = {**sim.BASELINES, "gpushare": GPUSharePolicy}
    for name in ("bestfit", "fgd", "gpushare"):
        run = sim.simulate(nodes, trace, factories[name], seed, name)
        figures[name] = 100.0 - run.alloc_pct[100]
    assert all(f >= bound.lower_bound - 1e-9 for f in figures.values()), (bound, figures)
    # and it is not vacuous: within a few points of the best policy
    assert bound.lower_bound > min(figures.values()) - 3.0, (bound, figures)
