"""Readable quantities in the policy file: memory, CPU, durations, fractions.

Each parser takes the raw YAML value and returns an integer in the core's units,
or raises :class:`UnitError` whose message says what was expected. They are
pure functions so that other adapters (the spawn form, the CLI) can reuse them.

* memory -> MiB: ``80GiB``, ``81920MiB``, ``512Mi``, ``1.5Ti``; decimal units
  (``16G``, ``500MB``) follow Kubernetes (powers of 1000); a plain number is MiB.
* CPU -> milli-cores: ``4``, ``0.5``, ``"2.5"``, ``500m``.
* duration -> seconds: ``8h``, ``30m``, ``90s``, ``1d``, ``1h30m``; a plain number is seconds.
* fraction -> milli (1000 = one): ``0.25``, ``1/4``, ``25%``, ``1``.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from fractions import Fraction

from .core.model import UNIT


class UnitError(ValueError):
    """A value that could not be read; the message says what was expected."""


_MIB = 1024 * 1024
_MEMORY_FACTORS: dict[str, float] = {
    "": _MIB,  # plain number: MiB
    "ki": 1024, "kib": 1024,
    "mi": _MIB, "mib": _MIB,
    "gi": 1024**3, "gib": 1024**3,
    "ti": 1024**4, "tib": 1024**4,
    "k": 1e3, "kb": 1e3,
    "m": 1e6, "mb": 1e6,
    "g": 1e9, "gb": 1e9,
    "t": 1e12, "tb": 1e12,
}
_NUMBER_UNIT = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z]*)\s*$")
MEMORY_EXPECTED = "a memory size such as 80GiB, 81920MiB, 512Mi or a number of MiB"
CPU_EXPECTED = "a CPU count such as 4, 0.5 or 500m"
DURATION_EXPECTED = "a duration such as 8h, 30m, 90s, 1h30m or a number of seconds"
FRACTION_EXPECTED = "a fraction such as 0.25, 1/4 or 25%"
UNITS_EXPECTED = "a number of GPU units such as 4, 0.5 or 1/2"


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _finite(parse: Callable[[object], int], expected: str) -> Callable[[object], int]:
    """``parse``, with an infinite or enormous value refused as ``expected`` (no crash)."""
    @functools.wraps(parse)
    def guarded(value: object) -> int:
        try:
            return parse(value)
        except (OverflowError, ValueError) as exc:
            if isinstance(exc, UnitError):
                raise
            raise UnitError(expected + ", of a sensible size") from None

    return guarded


def _parse_memory_mib(value: object) -> int:
    """Memory size to whole MiB (rounded to nearest, at least 1 for a non-zero size)."""
    if _is_number(value):
        if value < 0:  # type: ignore[operator]
            raise UnitError(MEMORY_EXPECTED + ", not negative")
        return int(round(value))  # type: ignore[call-overload, no-any-return]
    if not isinstance(value, str):
        raise UnitError(MEMORY_EXPECTED)
    match = _NUMBER_UNIT.match(value)
    if not match or match.group(2).lower() not in _MEMORY_FACTORS:
        raise UnitError(MEMORY_EXPECTED)
    number = float(match.group(1))
    mib = number * _MEMORY_FACTORS[match.group(2).lower()] / _MIB
    return max(int(round(mib)), 1 if number > 0 else 0)


def _parse_cpu_milli(value: object) -> int:
    """CPU cores to milli-cores."""
    if _is_number(value):
        if value < 0:  # type: ignore[operator]
            raise UnitError(CPU_EXPECTED + ", not negative")
        return int(round(value * 1000))  # type: ignore[operator]
    if not isinstance(value, str):
        raise UnitError(CPU_EXPECTED)
    match = _NUMBER_UNIT.match(value)
    if not match or match.group(2) not in ("", "m"):
        raise UnitError(CPU_EXPECTED)
    number = float(match.group(1))
    return int(round(number)) if match.group(2) == "m" else int(round(number * 1000))


_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?)\s*(w|d|h|m|s)")
_DURATION_SECONDS = {"w": 604800, "d": 86400, "h": 3600, "m": 60, "s": 1}


def _parse_duration_s(value: object) -> int:
    """Duration to whole seconds."""
    if _is_number(value):
        if value < 0:  # type: ignore[operator]
            raise UnitError(DURATION_EXPECTED + ", not negative")
        return int(round(value))  # type: ignore[call-overload, no-any-return]
    if not isinstance(value, str):
        raise UnitError(DURATION_EXPECTED)
    text = value.strip().lower().replace(" ", "")
    if not text or _DURATION_PART.sub("", text):
        raise UnitError(DURATION_EXPECTED)
    total = sum(float(n) * _DURATION_SECONDS[u] for n, u in _DURATION_PART.findall(text))
    return int(round(total))


parse_memory_mib = _finite(_parse_memory_mib, MEMORY_EXPECTED)
parse_cpu_milli = _finite(_parse_cpu_milli, CPU_EXPECTED)
parse_duration_s = _finite(_parse_duration_s, DURATION_EXPECTED)


def parse_ratio(value: object, expected: str = FRACTION_EXPECTED) -> Fraction:
    """A non-negative ratio written as a number, ``a/b`` or ``p%``, exactly."""
    if _is_number(value):
        try:
            ratio = Fraction(str(value))
        except ValueError:  # inf, nan
            raise UnitError(expected) from None
    elif isinstance(value, str):
        text = value.strip()
        number = text[:-1].strip() if text.endswith("%") else text
        if number.startswith("-"):
            raise UnitError(expected + ", not negative")
        try:
            # Fraction() reads "0.25" and "1/4"
            ratio = Fraction(number) / 100 if text.endswith("%") else Fraction(number)
        except (ValueError, ZeroDivisionError):
            raise UnitError(expected) from None
    else:
        raise UnitError(expected)
    if ratio < 0:
        raise UnitError(expected + ", not negative")
    return ratio


def parse_fraction_milli(value: object) -> int:
    """A fraction of one GPU to milli-units (rounded to nearest, at least 1 if non-zero)."""
    ratio = parse_ratio(value)
    milli = int(round(ratio * UNIT))
    return max(milli, 1) if ratio > 0 else 0


def parse_units_milli(value: object) -> int:
    """GPU units (quotas) to milli-units; negative values are rejected."""
    ratio = parse_ratio(value, UNITS_EXPECTED)
    return int(round(ratio * UNIT))


def format_mib(mib: int) -> str:
    """MiB as a short readable size (``141 GiB``, ``512 MiB``)."""
    if mib >= 1024 and mib % 1024 == 0:
        return f"{mib // 1024} GiB"
    if mib >= 10240:
        return f"{mib / 1024:.1f} GiB"
    return f"{mib} MiB"


def format_duration(seconds: int) -> str:
    """Seconds as ``2h``, ``1h30m``, ``90s``."""
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size:
            parts.append(f"{seconds // size}{unit}")
            seconds %= size
    return "".join(parts) or "0s"


def format_units(milli: int) -> str:
    """Milli-units as GPU units (``4``, ``0.25``; ``1.000e+397`` for a number too large to
    divide as a float)."""
    try:
        return f"{milli / UNIT:g}"
    except OverflowError:
        digits = str(abs(milli // UNIT))
        return f"{'-' if milli < 0 else ''}{digits[0]}.{digits[1:4]}e+{len(digits) - 1}"
