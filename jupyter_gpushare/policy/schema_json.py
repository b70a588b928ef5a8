"""The policy schema's tree (sections, keys, values) as JSON Schema (draft 2020-12), for
editors; :func:`~.schema.json_schema` gives the whole file's."""

from __future__ import annotations

from typing import Any

from .bounds import NAME_PATTERN
from .schema_shapes import ListOf, MapOf, Section, Shape
from .schema_value import Value


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    # the loader reads `key:` (left empty) as absent, so an optional key may be null
    return {
        "anyOf": [schema, {"type": "null"}],
        **({"description": schema["description"]} if "description" in schema else {}),
    }


def _bounded(schema: dict[str, Any], hi: int | float) -> dict[str, Any]:
    """``schema`` with ``maximum: hi`` on its number branches (where none is set)."""
    out = dict(schema)
    if out.get("type") in ("number", "integer") and "maximum" not in out:
        out["maximum"] = hi
    if "anyOf" in out:
        out["anyOf"] = [_bounded(option, hi) for option in out["anyOf"]]
    return out


def _shape_schema(shape: Shape) -> dict[str, Any]:
    if isinstance(shape, Value):
        if shape.range is not None:
            return _bounded(shape.schema, shape.range.shown_hi)
        return dict(shape.schema)
    if isinstance(shape, Section):
        return _section_schema(shape)
    if isinstance(shape, MapOf):
        item = _section_schema(shape.item)
        if not any(k.required for k in shape.item.keys):
            item = {"anyOf": [item, {"type": "null"}]}  # `name:` alone is an empty entry
        return {
            "type": "object",
            "additionalProperties": item,
            "propertyNames": {"pattern": NAME_PATTERN},
        }
    if isinstance(shape, ListOf):
        return {"type": "array", "items": _section_schema(shape.item)}
    return {"anyOf": [_shape_schema(option) for option in shape.options]}


def _section_schema(section: Section) -> dict[str, Any]:
    properties: dict[str, Any] = {}
    for key in section.keys:
        schema = _shape_schema(key.shape)
        if key.help:
            schema["description"] = key.help
        if key.default is not None:
            schema["default"] = key.default
        properties[key.name] = schema if key.required else _nullable(schema)
    out: dict[str, Any] = {
        "type": "object",
        "title": section.title,
        "properties": properties,
        "additionalProperties": False,
    }
    required = [k.name for k in section.keys if k.required]
    if required:
        out["required"] = required
    if section.description:
        out["description"] = section.description
    return out
