"""Line-aware reading of one mapping against its :class:`~.schema.Section`."""

from __future__ import annotations

import builtins
import difflib
import re
from collections.abc import Iterable
from typing import Any

from ..policy_units import UnitError
from .bounds import RangeError, name_problem
from .issues import Collector
from .schema import MapOf, Section, Value
from .yamlread import YList, YMap, describe, show

_PLAIN_KEY = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_LISTED = 30  # names an "unknown ..." message lists


def join(path: str, key: object) -> str:
    """``path.key`` (or ``key`` at the top); a key that is not a plain name is quoted and
    shortened, so that a message stays one readable line whatever the file holds."""
    text = key if isinstance(key, str) and _PLAIN_KEY.match(key) else show(key)
    return f"{path}.{text}" if path else text


def as_map(ctx: Collector, value: object, line: int, path: str) -> YMap | None:
    if isinstance(value, YMap):
        return value
    ctx.error(line, path, f"got {describe(value)} (expected a mapping of keys to values)")
    return None


def as_list(ctx: Collector, value: object, line: int, path: str) -> YList | None:
    if isinstance(value, YList):
        return value
    ctx.error(line, path, f"got {describe(value)} (expected a list)")
    return None


def unknown_ref(kind: str, name: str, known: Iterable[str]) -> str:
    """"unknown <kind> 'x' (expected one of: ...); did you mean 'y'?"."""
    names = sorted(known)
    shown = [n if _PLAIN_KEY.match(n) else show(n) for n in names[:_LISTED]]
    more = f" and {len(names) - _LISTED} more" if len(names) > _LISTED else ""
    listed = ", ".join(shown) + more if names else "none are defined"
    hint = difflib.get_close_matches(name[:64], names, n=1)
    extra = f"; did you mean {show(hint[0])}?" if hint else ""
    return f"unknown {kind} {show(name)} (expected one of: {listed}){extra}"


_MISSING = object()


class Fields:
    """Typed, line-aware access to the keys of one mapping; reports unknown keys.

    Every key is read with the :class:`~.schema.Value` its section declares, so the
    loader and the JSON Schema cannot drift apart.
    """

    def __init__(self, ctx: Collector, data: YMap, path: str, section: Section):
        self.ctx, self.data, self.path, self.section = ctx, data, path, section
        allowed = section.names
        for key in data:
            if key not in allowed:
                self._unknown(key, allowed)

    def _unknown(self, key: object, allowed: tuple[str, ...]) -> None:
        hint = difflib.get_close_matches(str(key)[:64], allowed, n=1)
        expected = f"did you mean {hint[0]!r}?" if hint else "expected one of " + ", ".join(
            allowed
        )
        self.ctx.error(self.key_line(key), join(self.path, key), f"unknown key ({expected})")

    def key_line(self, key: object) -> int:
        return self.data.key_lines.get(key, self.data.line)

    def line(self, key: object) -> int:
        return self.data.value_lines.get(key, self.data.line)

    def missing(self, key: str) -> None:
        if key in self.data:  # written but left empty
            self.ctx.error(self.key_line(key), join(self.path, key), "required field is empty")
        else:
            self.ctx.error(self.data.line, join(self.path, key), "required field is missing")

    def has(self, key: str) -> bool:
        return key in self.data and self.data[key] is not None

    def get(self, key: str, *, required: bool | None = None, default: Any = _MISSING) -> Any:
        """The value of ``key`` converted by its declared :class:`Value`.

        A missing key is reported when it is required (``required`` overrides the
        section's say) and gives ``default``; a bad value is reported and gives
        ``default`` too. Without ``default`` a missing or bad value is ``None``.
        """
        spec = self.section.key(key)
        assert isinstance(spec.shape, Value), f"{key} is not a plain value"
        fallback = None if default is _MISSING else default
        if not self.has(key):
            if spec.required if required is None else required:
                self.missing(key)
            return fallback
        value = self.data[key]
        try:
            return spec.shape(value)
        except RangeError as exc:  # "<value> is out of range <lo>..<hi> (<unit>)"
            self.ctx.error(self.line(key), join(self.path, key), str(exc))
            return fallback
        except UnitError as exc:
            self.ctx.error(self.line(key), join(self.path, key), f"got {describe(value)} "
                           f"(expected {exc})")
            return fallback

    def _required(self, key: str, override: bool | None) -> bool:
        if override is not None:
            return override
        return key in self.section.names and self.section.key(key).required

    def map(self, key: str, *, required: bool | None = None) -> YMap | None:
        if not self.has(key):
            if self._required(key, required):
                self.missing(key)
            return None
        return as_map(self.ctx, self.data[key], self.line(key), join(self.path, key))

    def list(self, key: str, *, required: bool | None = None) -> YList | None:
        if not self.has(key):
            if self._required(key, required):
                self.missing(key)
            return None
        return as_list(self.ctx, self.data[key], self.line(key), join(self.path, key))

    def entries(self, key: str) -> builtins.list[tuple[str, Fields, int, str]]:
        """Items of a mapping-of-sections key (pools, teams, ...): (name, fields, line, path).

        Names are checked here (:data:`~.bounds.NAME_PATTERN`, and no two that differ only
        in case); each body is read against the key's item section.
        """
        shape = self.section.key(key).shape
        assert isinstance(shape, MapOf), f"{key} is not a mapping of sections"
        section = self.map(key, required=False)  # a missing section is the caller's to report
        if section is None:
            return []
        out = []
        folded: dict[str, str] = {}
        for name, body in section.items():
            path = join(join(self.path, key), name)
            line = section.key_lines.get(name, section.line)
            problem = name_problem(name)
            if problem is not None:
                self.ctx.error(line, path, problem)
                continue
            if name.lower() in folded:
                self.ctx.error(line, path, f"differs from {folded[name.lower()]!r} only in case "
                               "(Slurm and Kubernetes names are lower case: they would be one)")
                continue
            folded[name.lower()] = name
            if body is None:
                body = YMap()
                body.line = line
            mapping = as_map(self.ctx, body, section.value_lines.get(name, line), path)
            if mapping is not None:
                out.append((name, Fields(self.ctx, mapping, path, shape.item), line, path))
        return out

    def names(self, key: str) -> set[str]:
        """The names declared under a mapping key, valid or not (for reference checks)."""
        raw = self.data.get(key)
        if not isinstance(raw, YMap):
            return set()
        return {n for n in raw if isinstance(n, str) and n}
