"""YAML with line numbers: mappings and lists that remember where each item was written."""

from __future__ import annotations

from typing import Any

import yaml

from .issues import Collector


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


def _construct_map(loader: _LineLoader, node: yaml.MappingNode) -> YMap:
    loader.flatten_mapping(node)
    result = YMap()
    result.line = node.start_mark.line + 1
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        try:
            hash(key)
        except TypeError:
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping", node.start_mark,
                "found an unhashable key", key_node.start_mark,
            ) from None
        if key in result:
            loader.duplicates.append((key_node.start_mark.line + 1, str(key)))
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


def describe(value: object) -> str:
    """A value as an error message names it."""
    if value is None:
        return "nothing"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return repr(value)


def read_root(ctx: Collector, text: str) -> YMap | None:
    """The top mapping of a policy text, or ``None`` (with the error reported)."""
    loader = _LineLoader(text)
    try:
        data = loader.get_single_data()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else 0
        problem = " ".join(str(p) for p in (exc.context, exc.problem) if p)
        ctx.error(line, "", f"malformed YAML: {problem or exc}")
        return None
    except yaml.YAMLError as exc:
        ctx.error(0, "", f"malformed YAML: {exc}")
        return None
    finally:
        loader.dispose()
    for line, key in loader.duplicates:
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
