"""The :class:`Value` of a policy field (a converter from the raw YAML value to core units,
raising :class:`~jupyter_gpushare.policy_units.UnitError`, paired with the JSON Schema of what
it accepts and the range of its numbers) and the converters the policy's values use."""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..policy_units import (
    UnitError,
    parse_ratio,
)
from .bounds import (
    _CONTROL,
    _CONTROL_BUT_LINES,
    _NODE_NAME,
    MAX_DESCRIPTION,
    MAX_GPU_HOURS,
    MAX_IMAGE,
    MAX_TEXT,
    NODE_NAME_EXPECTED,
    Range,
    RangeError,
)
from .yamlread import show

MAX_HEADROOM = 0.9
SLUG = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")


@dataclass(frozen=True)
class Value:
    """A scalar (or list of scalars) field: its converter, the JSON Schema it accepts and
    the range of its numbers (checked after converting, and in the JSON Schema)."""

    convert: Callable[[object], Any]
    schema: dict[str, Any]
    expected: str = ""  # for the JSON Schema's description
    range: Range | None = None

    def __call__(self, raw: object) -> Any:
        result = self.convert(raw)
        if self.range is not None and result is not None:
            self.range.check(result)
        return result


def _one_line(text: str, limit: int = MAX_TEXT) -> str:
    if len(text) > limit:
        raise UnitError(f"a text of at most {limit} characters")
    if _CONTROL.search(text):
        raise UnitError("a text on one line, without control characters")
    return text


def _text(value: object) -> str:
    if isinstance(value, str) and value.strip():
        return _one_line(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return _one_line(str(value))  # e.g. a model name such as 4090
    raise UnitError("a non-empty text")


def _description(value: object) -> str:
    text = _text(value) if not isinstance(value, str) else value
    if len(text) > MAX_DESCRIPTION:
        raise UnitError(f"a text of at most {MAX_DESCRIPTION} characters")
    if _CONTROL_BUT_LINES.search(text):
        raise UnitError("a text without control characters")
    return text


def _image(value: object) -> str:
    text = _text(value)
    if any(c.isspace() for c in text) or len(text) > MAX_IMAGE:
        raise UnitError("a container image such as quay.io/jupyter/pytorch-notebook")
    return text


def _node_name(value: object) -> str:
    if isinstance(value, str) and _NODE_NAME.match(value):
        return value
    raise UnitError(NODE_NAME_EXPECTED)


def _whole(value: object) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise UnitError("a whole number")


def _number(value: object) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if isinstance(value, float) and not math.isfinite(value):
            raise UnitError("a finite number")
        if value < 0:
            raise UnitError("a number >= 0")
        try:
            return float(value)
        except OverflowError:  # an integer of hundreds of digits
            raise RangeError(
                f"{show(value)} is out of range 0..{MAX_GPU_HOURS:,} (GPU-hours)"
            ) from None
    raise UnitError("a number")


def _bool(value: object) -> bool:
    if isinstance(value, bool):
        return value
    raise UnitError("true or false")


def _names(value: object) -> tuple[str, ...]:
    items = [value] if isinstance(value, str) else value
    if isinstance(items, list) and all(
        isinstance(v, (str, int)) and not isinstance(v, bool) for v in items
    ):
        names = tuple(str(v) for v in items)
        for name in names:
            if not name.strip() or len(name) > MAX_TEXT or _CONTROL.search(name):
                raise UnitError(
                    f"names of 1 to {MAX_TEXT} characters on one line, without "
                    f"control characters (got {show(name)})"
                )
        return names
    raise UnitError("a list of names")


def _labels(value: object) -> tuple[tuple[str, str], ...]:
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        pairs = []
        for k, v in value.items():
            if isinstance(v, (dict, list)):
                raise UnitError("a mapping of label names to plain values")
            pairs.append((_one_line(k), _one_line(str(v))))
        return tuple(sorted(pairs))
    raise UnitError("a mapping of label names to values")


def _headroom(value: object) -> float:
    ratio = parse_ratio(value, "a fraction between 0 and 0.9 such as 20%, 0.2 or 1/5")
    if ratio > MAX_HEADROOM:
        raise UnitError("a fraction between 0 and 0.9 such as 20%, 0.2 or 1/5")
    return float(ratio)


def _slug(value: object) -> str:
    text = value if isinstance(value, str) else None
    if text is None or not SLUG.match(text):
        raise UnitError("lower-case letters, digits and '-', such as train-1gpu")
    return text


def positive(conv: Callable[[object], int], what: str) -> Callable[[object], int]:
    """``conv``, refusing results <= 0 with "<what> greater than 0"."""

    def check(value: object) -> int:
        result = conv(value)
        if result <= 0:
            raise UnitError(f"{what} greater than 0")
        return result

    return check


def choice(*options: str) -> Callable[[object], str]:
    """A converter accepting one of ``options`` (the nearest named when it is not one)."""

    def check(value: object) -> str:
        if isinstance(value, str) and value in options:
            return value
        hint = difflib.get_close_matches(str(value)[:MAX_TEXT], options, n=1)
        extra = f"; did you mean {hint[0]!r}?" if hint else ""
        raise UnitError("one of " + ", ".join(options) + extra)

    return check


def _quantity(pattern: str, minimum: float = 0, exclusive: bool = False) -> dict[str, Any]:
    bound = "exclusiveMinimum" if exclusive else "minimum"
    return {"anyOf": [{"type": "number", bound: minimum}, {"type": "string", "pattern": pattern}]}


def _vendor(value: object) -> str:
    if isinstance(value, str) and _VENDOR.match(value.strip().lower()):
        return value.strip().lower()
    raise UnitError("a vendor name such as nvidia, amd or metax")


def _whole_in(lo: int, hi: int, unit: str) -> Value:
    return Value(
        _whole,
        {"type": "integer", "minimum": lo, "maximum": hi},
        f"a whole number from {lo} to {hi}",
        Range(lo, hi, unit),
    )


_VENDOR = re.compile(r"^[a-z][a-z0-9-]{0,31}$")

SLURM_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"


def _slurm_name(value: object) -> str:
    if isinstance(value, str) and re.match(SLURM_NAME_PATTERN, value):
        return value
    raise UnitError("a Slurm name: letters, digits, '.', '_' or '-', such as gpu")
