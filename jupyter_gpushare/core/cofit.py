"""Which fractions belong together on one GPU, learned from the mix of fractions asked for.

Best fit puts a fraction on the fullest GPU it fits. On Alibaba's trace that pairs sizes
whose gap no later request fills (a 320 beside a 470 leaves 210, which only the rare
50-160 requests fit), while the same GPUs could have held 470 + 470 (+ 50) and 650 + 320.
Which sizes belong together depends on how often each is asked for, not on sums alone.

:func:`good_steps` packs a batch of the learned mix (each size in proportion to how often
it is asked for) offline, best fit decreasing, and returns every *step* a GPU takes on the
way to one of those packings: from the amount some of a packed GPU's fractions hold to
that amount plus one more of its fractions (:func:`fill_step`). Placement then prefers a
GPU on which the new fraction takes such a step, or fills the GPU exactly; any other
choice is charged ``COFIT_PENALTY`` (:mod:`.packscan`), and fragmentation and position
decide among the rest. It is a preference, not a rule: every GPU with room may be chosen.

Pure Python, no I/O; a batch is packed by groups of GPUs of the same content (well under a
millisecond for Alibaba's mix).
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterable

from .model import UNIT

BATCH = 1000
"""Fractions in the batch packed offline (each size asked for at least once)."""

COFIT_PENALTY = 1000.0
"""Milli-units of fragmentation charged for a fraction placed so that its GPU takes a step
none of the learned packings takes: a whole GPU's worth, more than any gradient of one
fraction, so the preference comes first (measured: a penalty of 240 kept half the gain)."""


COFIT_MIN_MILLI = 200
"""Fractions smaller than this are not steered: they fit the gaps most GPUs are left with,
and their learned steps are rare (beside an 810, say), so steering them made a scan read
thousands of nodes (decisions of 10-47 ms at ``--scale 10``) and gained nothing measurable
(the default trace's 3.88 % either way, seeds 42-51)."""


def fill_step(held: int, after: int) -> int:
    """One number for a GPU's step from ``held`` milli in use to ``after`` (both 0..UNIT)."""
    return held * (UNIT + 1) + after


def good_steps(sizes: Iterable[tuple[int, float]], batch: int = BATCH) -> frozenset[int]:
    """The steps (:func:`fill_step`) a GPU takes on the way to a best-fit-decreasing
    packing of the mix.

    ``sizes``: (per-GPU milli, how often asked) of the fractions (whole GPUs and sizes
    outside 1..UNIT-1 are ignored; the weights need not sum to 1). Every subset of a packed
    GPU's fractions is a way there, so each step from the sum of a subset to that sum plus
    one fraction outside it counts. Empty mix: no step.
    """
    weights: dict[int, float] = {}
    for milli, weight in sizes:
        if 0 < milli < UNIT and weight > 0:
            weights[milli] = weights.get(milli, 0.0) + weight
    total = sum(weights.values())
    if not total:
        return frozenset()
    counts = {m: max(1, round(w / total * batch)) for m, w in weights.items()}
    steps: set[int] = set()
    for content in best_fit_decreasing(counts):
        slots = range(len(content))
        for r in range(len(content)):
            for part in itertools.combinations(slots, r):
                held = sum(content[i] for i in part)
                steps.update(fill_step(held, held + content[i]) for i in slots if i not in part)
    return frozenset(steps)


def best_fit_decreasing(counts: dict[int, int]) -> list[tuple[int, ...]]:
    """The distinct GPU contents (fractions, largest first) of a best-fit-decreasing
    packing of ``counts`` fractions (per-GPU milli -> how many).

    Each fraction, largest first, goes to the fullest GPU it fits (ties: the larger
    content), else to an empty one. GPUs of the same content are one group, so a step
    moves many at once: when the fullest GPU that fits takes one fraction of the size
    only, every GPU of its group takes one; when it takes ``k`` > 1, the next ones go to
    that same GPU (it is then the fullest that fits), so one GPU takes up to ``k``.
    """
    groups: Counter[tuple[int, ...]] = Counter()  # content -> GPUs holding it
    for milli in sorted(counts, reverse=True):
        left = counts[milli]
        while left:
            fits = [c for c, n in groups.items() if n and sum(c) + milli <= UNIT]
            fullest = max(fits, key=lambda c: (sum(c), c)) if fits else ()
            room = (UNIT - sum(fullest)) // milli
            if room == 1:
                moved = min(left, groups[fullest]) if fullest else left
                took: tuple[int, ...] = (milli,)
            else:
                moved, took = 1, (milli,) * min(left, room)
            if fullest:
                groups[fullest] -= moved
            groups[(*fullest, *took)] += moved
            left -= moved * len(took)
    return [c for c, n in groups.items() if n]
