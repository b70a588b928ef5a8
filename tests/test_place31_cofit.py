"""Which fractions belong together on a GPU, learned from the mix asked for (issue 29).

:mod:`jupyter_gpushare.core.cofit` packs a batch of the learned mix offline (best fit
decreasing) and placement prefers a GPU on which the new fraction takes a step of one of
those packings. On the FGD paper's default trace this took the unallocated share at
arrived 100 % from 4.11 % to 3.88 % (seeds 42-51, ``benchmarks/packing.py``).
"""

from __future__ import annotations

from collections import Counter

import alibaba_like
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_placement import grant_for, make_request, make_state

import jupyter_gpushare.core.packscan as packscan
from jupyter_gpushare.core.cofit import best_fit_decreasing, fill_step, good_steps
from jupyter_gpushare.core.model import GPUSlice, Placement
from jupyter_gpushare.core.placement import place


def _one_by_one(counts: dict[int, int]) -> Counter[tuple[int, ...]]:
    """Best fit decreasing as the textbook states it: one fraction at a time, largest
    first, into the fullest GPU it fits (ties: the larger content), else a new GPU."""
    gpus: list[list[int]] = []
    for milli in sorted((m for m, n in counts.items() for _ in range(n)), reverse=True):
        fits = [g for g in gpus if sum(g) + milli <= 1000]
        if fits:
            max(fits, key=lambda g: (sum(g), tuple(g))).append(milli)
        else:
            gpus.append([milli])
    return Counter(tuple(g) for g in gpus)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.integers(1, 999), st.integers(1, 40), min_size=1, max_size=8))
def test_grouped_best_fit_decreasing_packs_as_one_fraction_at_a_time(
    counts: dict[int, int],
) -> None:
    assert set(best_fit_decreasing(counts)) == set(_one_by_one(counts))


def test_the_steps_depend_on_how_often_each_size_is_asked_for() -> None:
    # mostly 470s: they pair (940) and a 320 waits for other 320s, not beside a 470
    steps = good_steps([(470, 10.0), (320, 1.0)], batch=22)  # 20 and 2
    assert fill_step(0, 470) in steps and fill_step(470, 940) in steps
    assert fill_step(0, 320) in steps and fill_step(320, 640) in steps
    assert fill_step(470, 790) not in steps
    # mostly 320s: the lone 470 takes one of them (an odd 470 out would too: the batch
    # is packed as it is, leftovers included)
    steps = good_steps([(470, 1.0), (320, 20.0)], batch=21)
    assert fill_step(470, 790) in steps
    assert fill_step(470, 940) not in steps
    # the rare small fractions fill the gaps of the 810s (nothing else fits there)
    steps = good_steps([(810, 7.0), (650, 4.0), (160, 5.0)], batch=16)
    assert fill_step(810, 970) in steps and fill_step(0, 160) in steps
    assert fill_step(650, 810) not in steps
    assert good_steps([]) == frozenset() and good_steps([(1000, 3.0)]) == frozenset()


def _one_node(mix: dict[int, int], held: list[int]) -> tuple:  # type: ignore[type-arg]
    """A node of ``len(held)`` GPUs holding ``held`` milli each, its pool having learned
    ``mix`` (fraction -> requests seen)."""
    state = make_state([(len(held), "T4", 96000, 262144)], 0.0)
    i = 0
    for milli, n in mix.items():
        for _ in range(n):
            place(state, make_request(i, "fraction", milli, 1000, 1024, ()))  # learned only
            i += 1
    for k, milli in enumerate(held):
        request = make_request(i, "fraction", milli, 1000, 1024, ())
        on_gpu_k = Placement("n0", (GPUSlice(f"n0-g{k}", milli * 16, milli),))
        state.apply(grant_for(i, request, on_gpu_k))
        i += 1
    return state, i


def test_a_370_goes_beside_a_370_where_the_mix_pairs_them_not_beside_a_470() -> None:
    """Mostly 470s and 370s: they pair with their own size (940, 740); fragmentation alone
    puts the 370 beside the 470 (840, the tighter fit) and strands the other GPU's 630."""
    state, i = _one_node({320: 8, 370: 10, 470: 12}, [470, 370])
    placement = place(state, make_request(i, "fraction", 370, 1000, 1024, ()), observe=False)
    assert placement is not None and placement.slices[0].gpu_uuid == "n0-g1"


def test_without_the_preference_fragmentation_alone_chooses_the_other_gpu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The case above decides something: with no penalty the 370 goes beside the 470."""
    monkeypatch.setattr(packscan, "COFIT_PENALTY", 0.0)
    state, i = _one_node({320: 8, 370: 10, 470: 12}, [470, 370])
    placement = place(state, make_request(i, "fraction", 370, 1000, 1024, ()), observe=False)
    assert placement is not None and placement.slices[0].gpu_uuid == "n0-g0"


def test_small_fractions_are_not_steered() -> None:
    """Below ``COFIT_MIN_MILLI`` a fraction goes where fragmentation alone puts it: a 160
    beside the 650, though only the rare small fractions fill the gap beside an 810."""
    assert good_steps([(810, 7.0), (650, 4.0), (160, 5.0)], batch=16) >= {fill_step(810, 970)}
    state, i = _one_node({810: 7, 650: 4, 160: 5}, [810, 650])
    placement = place(state, make_request(i, "fraction", 160, 1000, 1024, ()), observe=False)
    assert placement is not None and placement.slices[0].gpu_uuid == "n0-g1"


def test_on_a_trace_shaped_like_alibabas_the_preference_leaves_fewer_gpus_unallocated(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """400 nodes of 8 GPUs, 4,000 pods in about the FGD paper's default mix, the benchmark's
    replay (seeds 42-47), with and without the preference. (On the paper's own trace: 3.88
    against 4.11 %, ``benchmarks/packing.py --seeds 42-51``.)"""
    import packing_sim as sim
    from packing_gpushare import GPUSharePolicy

    cluster, trace = alibaba_like.nodes(400), alibaba_like.pods(4000)

    def unallocated() -> float:
        runs = [sim.simulate(cluster, trace, GPUSharePolicy, s, "gpushare") for s in range(42, 48)]
        return sum(100.0 - run.alloc_pct[100] for run in runs) / len(runs)

    with_it = unallocated()
    monkeypatch.setattr(packscan, "COFIT_PENALTY", 0.0)
    without = unallocated()
    assert with_it < without - 0.1, (with_it, without)
