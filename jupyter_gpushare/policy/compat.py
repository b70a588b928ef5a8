"""The helpers of the one-module ``policy.py``, for readers built on them (the planner).

New code reads a mapping with :class:`~.fields.Fields` against a :class:`~.schema.Section`;
these keep the older call style (a tuple of allowed keys, a converter per call) working.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from ..policy_units import UnitError
from .fields import Fields, as_map, join, unknown_ref
from .issues import Collector
from .schema import Key, Section, Value, _bool, _choice, _text, _whole, positive
from .yamlread import YMap, _LineLoader, describe

T = TypeVar("T")

_Ctx = Collector
_as_map = as_map
_str = _text
_int = _whole
_positive = positive
_unknown_ref = unknown_ref
_ANY = Value(lambda v: v, {})


class _Fields(Fields):
    """:class:`Fields` over a tuple of allowed keys, with the converter given per call."""

    def __init__(self, ctx: Collector, data: YMap, path: str, allowed: Iterable[str]):
        section = Section(path or "mapping", tuple(Key(name, _ANY) for name in allowed))
        super().__init__(ctx, data, path, section)

    def get(self, key: str, conv: Callable[[object], T] | None = None, *,  # type: ignore[override]
            required: bool | None = False, default: Any = None) -> Any:
        if not self.has(key):
            if required:
                self.missing(key)
            return default
        value = self.data[key]
        try:
            return conv(value) if conv is not None else value
        except UnitError as exc:
            self.ctx.error(self.line(key), join(self.path, key), f"got {describe(value)} "
                           f"(expected {exc})")
            return default


def _entries(ctx: Collector, fields: Fields, key: str) -> list[tuple[str, YMap, int, str]]:
    """Items of a mapping-of-mappings section: (name, body, key line, path)."""
    section = fields.map(key, required=False)
    if section is None:
        return []
    out = []
    for name, body in section.items():
        path = join(key, name)  # as before: callers prefix nested paths themselves
        line = section.key_lines.get(name, section.line)
        if not isinstance(name, str) or not name:
            ctx.error(line, path, f"got name {describe(name)} (expected a text name)")
            continue
        if body is None:
            body = YMap()
            body.line = line
        mapping = as_map(ctx, body, section.value_lines.get(name, line), path)
        if mapping is not None:
            out.append((name, mapping, line, path))
    return out


__all__ = ["_Ctx", "_Fields", "_LineLoader", "_as_map", "_bool", "_choice", "_entries", "_int",
           "_positive", "_str", "_unknown_ref"]
