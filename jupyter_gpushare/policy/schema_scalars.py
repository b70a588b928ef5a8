"""Every kind of scalar value a policy file holds (texts, names, counts, memory sizes, CPU
counts, durations, GPU units, fractions, modes, ...) as a :class:`~.schema_value.Value`, and
the patterns of the unit texts their JSON Schema accepts."""

from __future__ import annotations

from typing import Any

from ..core.model import UNIT, SharingMode
from ..policy_units import (
    parse_cpu_milli,
    parse_duration_s,
    parse_fraction_milli,
    parse_memory_mib,
    parse_units_milli,
)
from .bounds import (
    MAX_CPU_CORES,
    MAX_DESCRIPTION,
    MAX_GPU_HOURS,
    MAX_GPU_UNITS,
    MAX_GPUS_PER_NODE,
    MAX_IMAGE,
    MAX_MEMORY_MIB,
    MAX_NODES,
    MAX_PRIORITY,
    MAX_SHARDS_PER_GPU,
    MAX_TEXT,
    NODE_NAME_EXPECTED,
    NODE_NAME_PATTERN,
    ONE_LINE_PATTERN,
    YEAR_S,
    Range,
)
from .schema_value import (
    MAX_HEADROOM,
    SLUG,
    SLURM_NAME_PATTERN,
    Value,
    _bool,
    _description,
    _headroom,
    _image,
    _labels,
    _names,
    _node_name,
    _number,
    _quantity,
    _slug,
    _slurm_name,
    _text,
    _vendor,
    _whole,
    _whole_in,
    choice,
    positive,
)

INVENTORY_SOURCES = ("static", "simulated", "nvml", "kubernetes")
DISCOVERED_SOURCES = ("nvml", "kubernetes")

# ------------------------------------------------------------- patterns of unit texts
# These match exactly the texts that the parsers of policy_units accept (a property test
# compares them), so an editor flags what check-policy would.
_NUM = r"\d+(?:\.\d*)?|\.\d+"
MEMORY_PATTERN = rf"^\s*(?:{_NUM})\s*(?:[KkMmGgTt][Ii]?[Bb]?)?\s*$"
CPU_PATTERN = rf"^\s*(?:{_NUM})\s*m?\s*$"
_DIGITS_SPACED = r"\d(?: *\d)*"
_DURATION_PART = rf"{_DIGITS_SPACED}(?: *\.(?: *\d)*)?\s*[wdhmsWDHMS]"
DURATION_PATTERN = rf"^\s*(?:{_DURATION_PART} *)+\s*$"
_INT = r"\d+(?:_\d+)*"
_DECIMAL = rf"(?:{_INT}(?:\.(?:{_INT})?)?|\.{_INT})(?:[eE][-+]?{_INT})?"
_QUOTIENT = rf"{_INT}/(?![0_]*(?:\s|%|$)){_INT}"
RATIO_PATTERN = rf"^\s*\+?(?:{_QUOTIENT}|{_DECIMAL})\s*(?:%\s*)?$"


VENDOR = Value(
    _vendor,
    {"type": "string", "pattern": "^[A-Za-z][A-Za-z0-9-]{0,31}$"},
    "a vendor name such as nvidia, amd or metax",
)
_TEXT_SCHEMA: dict[str, Any] = {
    "anyOf": [{"type": "string", "pattern": r"\S", "maxLength": MAX_TEXT}, {"type": "number"}]
}
TEXT = Value(_text, _TEXT_SCHEMA, "a non-empty text on one line")
DESCRIPTION = Value(
    _description,
    {"anyOf": [{"type": "string", "maxLength": MAX_DESCRIPTION}, {"type": "number"}]},
    "a text (several lines allowed)",
)
IMAGE = Value(
    _image, {"type": "string", "pattern": r"^\S+$", "maxLength": MAX_IMAGE}, "a container image"
)
NODE_NAME = Value(_node_name, {"type": "string", "pattern": NODE_NAME_PATTERN}, NODE_NAME_EXPECTED)
PRIORITY_VALUE = _whole_in(0, MAX_PRIORITY, "priority value")
GPU_COUNT = _whole_in(1, MAX_GPUS_PER_NODE, "GPUs")
GPUS_PER_NODE = _whole_in(0, MAX_GPUS_PER_NODE, "GPUs")
NODE_COUNT = _whole_in(1, MAX_NODES, "nodes")
SHARDS = Value(
    positive(_whole, "a whole number"),
    {"type": "integer", "minimum": 1, "maximum": MAX_SHARDS_PER_GPU},
    "a whole number greater than 0",
    Range(1, MAX_SHARDS_PER_GPU, "shards per GPU"),
)
GPU_HOURS = Value(
    _number,
    {"type": "number", "minimum": 0, "maximum": MAX_GPU_HOURS},
    "GPU-hours",
    Range(0, MAX_GPU_HOURS, "GPU-hours"),
)
BOOL = Value(_bool, {"type": "boolean"}, "true or false")
NAMES = Value(
    _names,
    {
        "anyOf": [
            {"type": "string", "pattern": ONE_LINE_PATTERN, "maxLength": MAX_TEXT},
            {
                "type": "array",
                "items": {
                    "anyOf": [
                        {"type": "string", "pattern": ONE_LINE_PATTERN, "maxLength": MAX_TEXT},
                        {"type": "integer"},
                    ]
                },
            },
        ]
    },
    "a name or a list of names",
)
LABELS = Value(
    _labels,
    {"type": "object", "additionalProperties": {"type": ["string", "number", "boolean", "null"]}},
    "a mapping of label names to values",
)
SLUG_VALUE = Value(
    _slug, {"type": "string", "pattern": SLUG.pattern}, "lower-case letters, digits and '-'"
)
_MEMORY_RANGE = Range(1, MAX_MEMORY_MIB, "MiB")
MEMORY = Value(
    positive(parse_memory_mib, "a memory size"),
    _quantity(MEMORY_PATTERN, exclusive=True),
    "a memory size such as 80GiB",
    _MEMORY_RANGE,
)
CPU = Value(
    positive(parse_cpu_milli, "a CPU count"),
    _quantity(CPU_PATTERN, exclusive=True),
    "a CPU count such as 4, 0.5 or 500m",
    Range(1, MAX_CPU_CORES * 1000, "CPU cores", 1000),
)
GRACE = Value(
    parse_duration_s,
    _quantity(DURATION_PATTERN),
    "a duration such as 30s",
    Range(0, 7 * 86400, "seconds"),
)
DURATION = Value(
    parse_duration_s,
    _quantity(DURATION_PATTERN),
    "a duration such as 8h or 90s",
    Range(0, YEAR_S, "seconds"),
)
POSITIVE_DURATION = Value(
    positive(parse_duration_s, "a duration"),
    _quantity(DURATION_PATTERN, exclusive=True),
    "a duration such as 8h",
    Range(1, YEAR_S, "seconds"),
)
_UNITS_RANGE = Range(0, MAX_GPU_UNITS * UNIT, "GPU units", UNIT)
FRACTION = Value(
    positive(parse_fraction_milli, "a fraction"),
    _quantity(RATIO_PATTERN, exclusive=True),
    "a fraction such as 1/4 or 25%",
    _UNITS_RANGE,
)
DEVICE_SHARE = Value(
    positive(parse_fraction_milli, "a fraction"),
    {
        "anyOf": [
            {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
            {"type": "string", "pattern": RATIO_PATTERN},
        ]
    },
    "a fraction of one GPU, at most 1",
    _UNITS_RANGE,
)
UNITS = Value(
    parse_units_milli, _quantity(RATIO_PATTERN), "GPU units such as 4, 0.5 or 1/2", _UNITS_RANGE
)
POSITIVE_UNITS = Value(
    positive(parse_units_milli, "GPU units"),
    _quantity(RATIO_PATTERN, exclusive=True),
    "GPU units greater than 0",
    _UNITS_RANGE,
)
HEADROOM = Value(
    _headroom,
    {
        "anyOf": [
            {"type": "number", "minimum": 0, "maximum": MAX_HEADROOM},
            {"type": "string", "pattern": RATIO_PATTERN},
        ]
    },
    "a fraction between 0 and 0.9",
)
MODE = Value(
    choice(*(m.value for m in SharingMode)),
    {"enum": [m.value for m in SharingMode]},
    "a sharing mode",
)
SOURCE = Value(choice(*INVENTORY_SOURCES), {"enum": list(INVENTORY_SOURCES)}, "an inventory source")


SLURM_NAME = Value(
    _slurm_name, {"type": "string", "pattern": SLURM_NAME_PATTERN}, "a Slurm partition name"
)
OPTIONS = Value(lambda v: v, {"type": "object"}, "options for the discovery adapter")
