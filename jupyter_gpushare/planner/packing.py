"""Cards per pool: whole cards for training, packed fractions with headroom for the rest.

Pure functions. A packed task is charged the way the broker charges it, so the plan is
what the policy will admit: ``fraction = max(ceil(memory MiB × 1000 / usable MiB),
compute)`` milli-units of a card, where ``usable = card MiB × (1 - headroom)``, and a card
holds grants whose fractions add up to at most 1000 (memory and compute both fit then).
Packing is best-fit decreasing over those fractions.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable
from dataclasses import dataclass

MIB = 1024 * 1024
UNIT = 1000


def usable_mib(card_bytes: int, headroom: float) -> int:
    """MiB of a card that grants may use (the policy's ``int(memory × (1 - headroom))``)."""
    return int((card_bytes // MIB) * (1.0 - headroom))


def task_mib(task_bytes: float) -> int:
    """A task's peak memory in whole MiB, rounded up."""
    return max(1, math.ceil(task_bytes / MIB - 1e-9))


def fraction_milli(memory_mib: int, usable: int, compute: float | None = None) -> int:
    """Milli-units the broker charges for ``memory_mib`` on a card with ``usable`` MiB."""
    milli = -(-memory_mib * UNIT // usable) if usable > 0 else UNIT + 1
    if compute is not None:
        milli = max(milli, int(round(compute * UNIT)))
    return max(1, milli)


@dataclass(frozen=True)
class Item:
    """``count`` identical packed tasks of ``milli`` each, labelled for the report."""

    label: str
    milli: int
    count: int


def pack(items: Iterable[Item]) -> list[list[tuple[str, int]]]:
    """Best-fit decreasing: each card is a list of (label, milli); sum per card <= 1000."""
    bins: list[list[tuple[str, int]]] = []
    free: list[tuple[int, int]] = []  # (free milli, bin index), sorted
    for item in sorted(items, key=lambda i: (-i.milli, i.label)):
        if item.milli > UNIT:
            raise ValueError(f"{item.label}: {item.milli} milli is more than one card")
        for _ in range(item.count):
            pos = bisect.bisect_left(free, (item.milli, -1))
            if pos < len(free):
                room, index = free.pop(pos)
                room -= item.milli
            else:
                index, room = len(bins), UNIT - item.milli
                bins.append([])
            bins[index].append((item.label, item.milli))
            bisect.insort(free, (room, index))
    return bins


def per_card(milli: int) -> int:
    """How many tasks of ``milli`` one card holds."""
    return UNIT // milli if 0 < milli <= UNIT else 0
