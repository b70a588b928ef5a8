"""The converters of the planning input's and catalogues' values: parameter counts, watts,
memory sizes, shares of a card, names; each refuses what it cannot read with a
:class:`~jupyter_gpushare.policy_units.UnitError` saying what it expected (the field's
reader adds the file, line and field)."""

from __future__ import annotations

import math
import re

from ..policy_units import UnitError, parse_memory_mib, parse_ratio
from .fields import text

__all__ = [
    "NAME",
    "compute_share",
    "headroom",
    "memory_bytes",
    "name",
    "param_count",
    "positive_number",
    "share",
    "watts",
]

_COUNT = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([kKmMbBtT]?)\s*$")
_COUNT_FACTORS = {"": 1.0, "k": 1e3, "m": 1e6, "b": 1e9, "t": 1e12}
_POWER = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(W|kW|MW)?\s*$", re.IGNORECASE)
_POWER_FACTORS = {"": 1.0, "w": 1.0, "kw": 1e3, "mw": 1e6}
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


def param_count(value: object) -> float:
    """7B, 6.74B, 350M, 1.5e9 or a plain number of parameters."""
    expected = "a parameter count such as 7B, 6.74B, 350M or 1.5e9"
    return _scaled_number(value, _COUNT, _COUNT_FACTORS, expected, plain_text=True)


def watts(value: object) -> float:
    """700W, 17kW, 0.7kW or a plain number of watts."""
    expected = "a power such as 700W, 17kW or a number of watts"
    return _scaled_number(value, _POWER, _POWER_FACTORS, expected)


def _scaled_number(
    value: object,
    pattern: re.Pattern[str],
    factors: dict[str, float],
    expected: str,
    *,
    plain_text: bool = False,
) -> float:
    """A finite number above 0: a number, or a text ``<number><suffix>`` matching
    ``pattern`` and scaled by the suffix's factor (``plain_text``: or any number as text,
    such as 1.5e9); otherwise :class:`UnitError` with ``expected``."""
    number: float | None = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number = _as_float(value)
    elif isinstance(value, str):
        match = pattern.match(value)
        if match:
            number = float(match.group(1)) * factors[(match.group(2) or "").lower()]
        if plain_text and (number is None or number <= 0):
            number = _as_float(value.strip())
    if number is None or not math.isfinite(number) or number <= 0:
        raise UnitError(expected)
    return number


def _as_float(value: object) -> float | None:
    """``float(value)``, or ``None`` for a text that is no number or an integer too large
    for a float."""
    try:
        return float(value)  # type: ignore[arg-type]
    except (ValueError, OverflowError):
        return None


def memory_bytes(value: object) -> int:
    """A memory size (policy units) in bytes."""
    mib = parse_memory_mib(value)
    if mib <= 0:
        raise UnitError("a memory size greater than 0 such as 8GiB")
    return mib * 1024 * 1024


def share(value: object) -> float:
    ratio = parse_ratio(value, "a share such as 20%, 0.2 or 1/5")
    return float(ratio)


def headroom(value: object) -> float:
    ratio = share(value)
    if ratio >= 0.9:
        raise UnitError("a share below 90% such as 20%")
    return ratio


def compute_share(value: object) -> float:
    ratio = share(value)
    if ratio <= 0 or ratio > 1:
        raise UnitError("a share of one card's compute, above 0 and at most 100%")
    return ratio


def name(value: object) -> str:
    text_value = text(value)
    if not NAME.match(text_value):
        raise UnitError("a name of letters, digits, '.', '_' and '-'")
    return text_value


def positive_number(value: object) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number = _as_float(value)
        if number is not None and math.isfinite(number) and number > 0:
            return number
    raise UnitError("a finite number greater than 0")
