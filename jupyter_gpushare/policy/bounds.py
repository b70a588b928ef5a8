"""The bounds of the policy file's values: the range of every number and the pattern of
every name, chosen so that every engine the policy is exported to accepts them (Slurm,
Kubernetes, YTsaurus). :mod:`.schema` attaches them to its fields; ``docs/policy-limits.md``
lists them."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from fractions import Fraction

from ..policy_units import UnitError
from .yamlread import describe, show

# ------------------------------------------------------------------------ ranges
# Every number of the policy has a range that every engine it is exported to can store
# (Slurm keeps priorities and grace times in 32 bits, Kubernetes quantities and priority
# values in int32/int64, YTsaurus GPU counts in int64) and that no real cluster exceeds.

YEAR_S = 365 * 86400
MAX_GPU_UNITS = 1_000_000
"""Most GPU units a quota (guarantee, borrow limit, per-user cap) may name."""
MAX_GPU_HOURS = 1_000_000_000
"""Most GPU-hours a month's budget may name (a million GPUs for 1,000 hours)."""
MAX_MEMORY_MIB = 1024**3
"""1 PiB: the most memory a node, GPU or profile may name."""
MAX_CPU_CORES = 65_535
"""Slurm's most CPUs per node (16 bits)."""
MAX_PRIORITY = 1_000_000
"""Highest priority value (Kubernetes' user priority classes stop at 10^9; Slurm at 2^32)."""
MAX_GPUS_PER_NODE = 1024
MAX_NODES = 10_000
"""Most nodes an inventory may declare or simulate."""
MAX_DEVICES = 100_000
"""Most GPU devices an inventory may declare or simulate, over all nodes."""
MAX_SHARDS_PER_GPU = 1024
MAX_TEXT = 256
"""Longest one-line text (a model, a display name, a reference); a description may be
:data:`MAX_DESCRIPTION` long."""
MAX_DESCRIPTION = 4096
MAX_IMAGE = 1024


class RangeError(UnitError):
    """A number outside its field's range; the message is the whole sentence:
    ``<value> is out of range <lo>..<hi> (<unit>)``."""


def _amount(value: int | float, scale: int) -> str:
    """``value`` (core units) in the unit a range is shown in (``value / scale``)."""
    exact = Fraction(value) / scale
    if exact.denominator == 1:
        return show(int(exact))
    whole = exact.numerator // exact.denominator
    return show(whole) + "+" if abs(whole) >= 10**15 else f"{float(exact):.12g}"


@dataclass(frozen=True)
class Range:
    """The smallest and largest value a field takes, in the core's units (``scale`` of them
    make one ``unit``: 1000 milli-units are one GPU unit)."""

    lo: int | float
    hi: int | float
    unit: str
    scale: int = 1

    def check(self, value: int | float) -> None:
        if isinstance(value, float) and not math.isfinite(value):
            raise UnitError("a finite number")
        if not self.lo <= value <= self.hi:
            raise RangeError(f"{_amount(value, self.scale)} is out of range "
                             f"{_amount(self.lo, self.scale)}..{_amount(self.hi, self.scale)} "
                             f"({self.unit})")

    @property
    def shown_hi(self) -> int | float:
        """The upper bound in the unit a plain number is written in (for the JSON Schema)."""
        exact = Fraction(self.hi) / self.scale
        return int(exact) if exact.denominator == 1 else float(exact)


# ---------------------------------------------------------------------- names
# Names become Slurm accounts, QOS and partitions, Kubernetes object names and labels
# (through kube_names.dns_label, lower-cased) and YTsaurus pool names; this pattern is
# what all of them accept. Two names that differ only in case are refused (they would be
# one name in Slurm and Kubernetes).

NAME_PATTERN = r"^[A-Za-z0-9]([A-Za-z0-9_-]{0,61}[A-Za-z0-9])?$"
NAME_EXPECTED = ("a name of 1 to 63 letters, digits, '-' or '_' that starts and ends with a "
                 "letter or digit (Slurm, Kubernetes and YTsaurus all accept it)")
NODE_NAME_PATTERN = r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,251}[A-Za-z0-9])?$"
NODE_NAME_EXPECTED = "a host name: letters, digits, '.', '-' or '_', at most 253"
_NAME = re.compile(NAME_PATTERN)
_NODE_NAME = re.compile(NODE_NAME_PATTERN)
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_CONTROL_BUT_LINES = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029]")
ONE_LINE_PATTERN = r"^[^\x00-\x1f\x7f-\x9f\u2028\u2029]*$"


def name_problem(name: object) -> str | None:
    """Why ``name`` (of a pool, team or priority class) is not a valid name, or ``None``."""
    if isinstance(name, str) and _NAME.match(name):
        return None
    return f"got name {describe(name)} (expected {NAME_EXPECTED})"
