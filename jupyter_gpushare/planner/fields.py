"""Line-aware reading of the planning input's mappings (the policy's YAML reader underneath).

The YAML itself is read by the policy package's loader, which remembers the line of every
key, value and list item (:class:`~jupyter_gpushare.policy.YMap`, ``YList``); the issues
are the policy's :class:`~jupyter_gpushare.policy.PolicyIssue`, so a planning input fails
exactly the way a policy file does. What is here is the small typed-access layer the
planner's sections need (the policy's own is driven by the policy schema).
"""

from __future__ import annotations

import builtins
import difflib
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import yaml

from ..policy import YList, YMap
from ..policy.fields import as_list, as_map, join, unknown_ref
from ..policy.issues import Collector
from ..policy.schema_value import _bool as boolean
from ..policy.schema_value import _text as text
from ..policy.schema_value import _whole as whole
from ..policy.schema_value import choice, positive
from ..policy.yamlread import _construct_map, _construct_seq, _LineLoader, describe
from ..policy_units import UnitError

if getattr(yaml, "__with_libyaml__", False):

    class _FastLineLoader(yaml.CSafeLoader):  # type: ignore[misc,name-defined]
        """The policy's line-remembering constructors on libyaml's parser (same nodes and
        marks, several times faster on large planning inputs)."""

        def __init__(self, stream: str) -> None:
            super().__init__(stream)
            self.duplicates: list[tuple[int, str]] = []

    _FastLineLoader.add_constructor("tag:yaml.org,2002:map", _construct_map)
    _FastLineLoader.add_constructor("tag:yaml.org,2002:seq", _construct_seq)
    LineLoader: type = _FastLineLoader
else:  # pragma: no cover - PyYAML built without libyaml
    LineLoader = _LineLoader

T = TypeVar("T")

__all__ = [
    "Ctx",
    "Converter",
    "Fields",
    "as_map",
    "boolean",
    "choice",
    "describe",
    "join",
    "positive",
    "read_root",
    "text",
    "unknown_ref",
    "whole",
]

Ctx = Collector
"""Collects the issues of one file (the policy loader's collector)."""


def read_root(ctx: Ctx, yaml_text: str, expected: str) -> YMap | None:
    """The top mapping of a YAML text (with every key's line), or ``None`` with the error."""
    loader = LineLoader(yaml_text)
    try:
        data = loader.get_single_data()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = " ".join(str(p) for p in (exc.context, exc.problem) if p)
        ctx.error(mark.line + 1 if mark else 0, "", f"malformed YAML: {problem or exc}")
        return None
    except yaml.YAMLError as exc:
        ctx.error(0, "", f"malformed YAML: {exc}")
        return None
    finally:
        loader.dispose()
    for line, key in loader.duplicates:
        ctx.error(line, key, "duplicate key (each key may appear once in a mapping)")
    if not isinstance(data, YMap):
        ctx.error(1, "", f"got {describe(data)} at the top (expected a mapping with {expected})")
        return None
    return data


class Fields:
    """Typed, line-aware access to the keys of one mapping; reports unknown keys."""

    def __init__(self, ctx: Ctx, data: YMap, path: str, allowed: Iterable[str]):
        self.ctx, self.data, self.path = ctx, data, path
        names = tuple(allowed)
        for key in data:
            if key not in names:
                hint = difflib.get_close_matches(str(key), names, n=1)
                expected = (
                    f"did you mean {hint[0]!r}?" if hint else "expected one of " + ", ".join(names)
                )
                ctx.error(self.key_line(key), join(path, key), f"unknown key ({expected})")

    def key_line(self, key: object) -> int:
        return self.data.key_lines.get(key, self.data.line)

    def line(self, key: object) -> int:
        return self.data.value_lines.get(key, self.data.line)

    def missing(self, key: str) -> None:
        if key in self.data:
            self.ctx.error(self.key_line(key), join(self.path, key), "required field is empty")
        else:
            self.ctx.error(self.data.line, join(self.path, key), "required field is missing")

    def has(self, key: str) -> bool:
        return key in self.data and self.data[key] is not None

    def get(
        self,
        key: str,
        conv: Callable[[object], T],
        *,
        required: bool = False,
        default: T | None = None,
    ) -> T | None:
        """The converted value of ``key``; a missing or bad value is reported, gives default."""
        if not self.has(key):
            if required:
                self.missing(key)
            return default
        value = self.data[key]
        try:
            return conv(value)
        except UnitError as exc:
            self.ctx.error(
                self.line(key), join(self.path, key), f"got {describe(value)} (expected {exc})"
            )
            return default

    def map(self, key: str, *, required: bool = False) -> YMap | None:
        if not self.has(key):
            if required:
                self.missing(key)
            return None
        return as_map(self.ctx, self.data[key], self.line(key), join(self.path, key))

    def list(self, key: str, *, required: bool = False) -> YList | None:
        if not self.has(key):
            if required:
                self.missing(key)
            return None
        return as_list(self.ctx, self.data[key], self.line(key), join(self.path, key))

    def entries(self, key: str) -> builtins.list[tuple[str, YMap, int, str]]:
        """Items of a mapping of mappings: (name, body, key line, path)."""
        section = self.map(key)
        if section is None:
            return []
        out = []
        for name, body in section.items():
            path = join(join(self.path, key), name)
            line = section.key_lines.get(name, section.line)
            if not isinstance(name, str) or not name:
                self.ctx.error(line, path, f"got name {describe(name)} (expected a text name)")
                continue
            if body is None:
                body = YMap()
                body.line = line
            mapping = as_map(self.ctx, body, section.value_lines.get(name, line), path)
            if mapping is not None:
                out.append((name, mapping, line, path))
        return out


# --------------------------------------------------------------------- converters
# text, whole, boolean, positive and choice are the policy's own converters (imported above)

Converter = Callable[[object], Any]
