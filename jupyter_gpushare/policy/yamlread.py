"""YAML with line numbers: mappings and lists that remember where each item was written.

The reader is bounded, because a policy file may come from anyone with write access to it:
a document of at most :data:`MAX_CHARS` characters, nested at most :data:`MAX_DEPTH` deep,
whose aliases expand to at most :data:`MAX_NODES` values ("billion laughs"). Whatever the
text, :func:`read_root` reports a ``FILE:LINE`` error and never raises: a value that
cannot be built (an integer of 5,000 digits, a date of month 13) names its line too.
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.events import (
    AliasEvent,
    CollectionEndEvent,
    CollectionStartEvent,
    Event,
    NodeEvent,
    ScalarEvent,
)

from .issues import Collector

MAX_CHARS = 8 * 1024 * 1024
"""The longest policy text read (characters): a large cluster's file is well under 1 MiB."""
MAX_DEPTH = 32
"""The deepest nesting of mappings and lists (the policy itself needs 6)."""
MAX_NODES = 1_000_000
"""The most values the document may hold once every alias is expanded."""
SHOWN_CHARS = 64
"""Characters of a value that an error message quotes (then "… (N characters)")."""


def _mark(event: Event) -> yaml.error.Mark | None:
    mark = event.start_mark
    return mark if isinstance(mark, yaml.error.Mark) else None


class BoundsError(yaml.MarkedYAMLError):
    """The text passes a bound of the reader (depth, expanded size)."""


class YMap(dict):  # type: ignore[type-arg]
    """A YAML mapping that remembers the (1-based) line of itself, its keys and values."""

    line: int = 0

    def __init__(self) -> None:
        super().__init__()
        self.key_lines: dict[Any, int] = {}
        self.value_lines: dict[Any, int] = {}


class YList(list):  # type: ignore[type-arg]
    """A YAML sequence that remembers the line of itself and of each item."""

    line: int = 0

    def __init__(self) -> None:
        super().__init__()
        self.item_lines: list[int] = []


class _LineLoader(yaml.SafeLoader):
    """SafeLoader whose mappings and sequences carry line numbers; duplicate keys are noted."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.duplicates: list[tuple[int, str]] = []
        self._open: list[list[Any]] = [[None, 0]]  # [anchor, values so far] per open level
        self._sizes: dict[str, int] = {}  # anchor -> values it stands for, aliases expanded

    def get_event(self) -> Event:
        """The parser's next event, counted: too deep or too large raises :class:`BoundsError`
        before the (recursive) composer goes any deeper."""
        event = super().get_event()
        if isinstance(event, CollectionStartEvent):
            if len(self._open) > MAX_DEPTH:
                raise BoundsError(None, None, f"nested more than {MAX_DEPTH} levels deep "
                                  "(a policy needs about 6)", _mark(event))
            self._open.append([event.anchor, 0])
        elif isinstance(event, CollectionEndEvent) and len(self._open) > 1:
            anchor, size = self._open.pop()
            self._count(event, anchor, size + 1)
        elif isinstance(event, ScalarEvent):
            self._count(event, event.anchor, 1)
        elif isinstance(event, AliasEvent):
            self._count(event, None, self._sizes.get(event.anchor or "", 1))
        return event

    def _count(self, event: NodeEvent | CollectionEndEvent, anchor: str | None,
               size: int) -> None:
        if anchor:
            self._sizes[anchor] = size
        self._open[-1][1] += size
        if self._open[-1][1] > MAX_NODES:
            raise BoundsError(None, None, f"the document expands to more than {MAX_NODES:,} "
                              "values (aliases repeat what they name)", _mark(event))

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        """A value, or a ConstructorError that names its line (a 5,000-digit integer or a
        date of month 13 raise ValueError without one)."""
        try:
            return super().construct_object(node, deep)
        except (ValueError, OverflowError, TypeError, ArithmeticError) as exc:
            raise yaml.constructor.ConstructorError(
                None, None, f"cannot read this value ({type(exc).__name__}: {shorten(str(exc))})",
                node.start_mark) from None


def _construct_map(loader: _LineLoader, node: yaml.MappingNode) -> YMap:
    explicit = sum(1 for key, _ in node.value if key.tag != "tag:yaml.org,2002:merge")
    loader.flatten_mapping(node)  # merged pairs (`<<: *base`) first, then the explicit ones
    merged = len(node.value) - explicit
    written: set[Any] = set()
    result = YMap()
    result.line = node.start_mark.line + 1
    for index, (key_node, value_node) in enumerate(node.value):
        key = loader.construct_object(key_node, deep=True)
        try:
            hash(key)
        except TypeError:
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping", node.start_mark,
                "found an unhashable key", key_node.start_mark,
            ) from None
        if index >= merged:  # an explicit key overrides a merged one: only twice written is
            if key in written:  # a duplicate
                loader.duplicates.append((key_node.start_mark.line + 1, shorten(str(key))))
            written.add(key)
        result[key] = loader.construct_object(value_node, deep=True)
        result.key_lines[key] = key_node.start_mark.line + 1
        result.value_lines[key] = value_node.start_mark.line + 1
    return result


def _construct_seq(loader: _LineLoader, node: yaml.SequenceNode) -> YList:
    result = YList()
    result.line = node.start_mark.line + 1
    for item in node.value:
        result.append(loader.construct_object(item, deep=True))
        result.item_lines.append(item.start_mark.line + 1)
    return result


_LineLoader.add_constructor("tag:yaml.org,2002:map", _construct_map)
_LineLoader.add_constructor("tag:yaml.org,2002:seq", _construct_seq)


def shorten(text: str, limit: int = SHOWN_CHARS) -> str:
    """``text``, cut to its first ``limit`` characters + "… (N characters)" if longer."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text):,} characters)"


def show(value: object) -> str:
    """A scalar as a message quotes it: ``repr``, shortened (a huge integer too)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**18:
        digits = str(abs(value))  # < 4,300 digits: the reader refuses longer integers
        sign = "-" if value < 0 else ""
        return f"{sign}{digits[0]}.{digits[1:4]}e+{len(digits) - 1}"
    return shorten(repr(value))


def describe(value: object) -> str:
    """A value as an error message names it."""
    if value is None:
        return "nothing"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return show(value)


def _line_at(text: str, position: int) -> int:
    return text.count("\n", 0, max(0, position)) + 1


def read_root(ctx: Collector, text: str) -> YMap | None:
    """The top mapping of a policy text, or ``None`` (with the error reported).

    Never raises for any text: every failure of the YAML reader is one ``FILE:LINE`` error.
    """
    if len(text) > MAX_CHARS:
        ctx.error(1, "", f"the file is {len(text):,} characters long (at most {MAX_CHARS:,} "
                  "are read)")
        return None
    loader: _LineLoader | None = None
    try:
        loader = _LineLoader(text)  # checks that every character is printable
        data = loader.get_single_data()
    except BoundsError as exc:
        mark = exc.problem_mark
        ctx.error(mark.line + 1 if mark else 1, "", str(exc.problem))
        return None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else 1
        problem = " ".join(str(p) for p in (exc.context, exc.problem) if p)
        ctx.error(line, "", f"malformed YAML: {shorten(problem or str(exc), 200)}")
        return None
    except yaml.reader.ReaderError as exc:
        what = (f"byte {exc.character!r}" if isinstance(exc.character, bytes)
                else f"character U+{exc.character:04X}")
        ctx.error(_line_at(text, exc.position), "", f"malformed YAML: {what} is not "
                  f"allowed ({exc.reason})")
        return None
    except yaml.YAMLError as exc:
        ctx.error(1, "", f"malformed YAML: {shorten(str(exc), 200)}")
        return None
    except RecursionError:  # not expected past the depth bound; never a traceback
        ctx.error(1, "", f"nested too deep to read (at most {MAX_DEPTH} levels)")
        return None
    finally:
        if loader is not None:
            loader.dispose()
    for line, key in loader.duplicates:  # type: ignore[union-attr]
        ctx.error(line, key, "duplicate key (each key may appear once in a mapping)")
    if data is None:
        ctx.error(1, "", "the policy file is empty (expected inventory, pools, priority_classes, "
                  "teams and profiles)")
        return None
    if not isinstance(data, YMap):
        ctx.error(1, "", f"got {describe(data)} at the top (expected a mapping with inventory, "
                  "pools, priority_classes, teams and profiles)")
        return None
    return data
