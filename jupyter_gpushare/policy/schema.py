"""The schema of every section of the policy file, as data.

One definition serves two readers: the loader (:mod:`.fields` checks each mapping's keys,
converts each value with the :class:`Value` named here and reports what it expected), and
:func:`json_schema`, which turns the same tree into a JSON Schema for editors
(``jupyter-gpushare policy-schema``). A :class:`Value` pairs a converter (raw YAML value ->
core units, raising :class:`~jupyter_gpushare.policy_units.UnitError`) with the JSON Schema
of what it accepts. Rules that need more than one value (references between sections, fit
on the hardware) are not expressible here; :mod:`.crossref` and the section readers check
them.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from ..core.model import UNIT, SharingMode
from ..policy_units import (
    UnitError,
    parse_cpu_milli,
    parse_duration_s,
    parse_fraction_milli,
    parse_memory_mib,
    parse_ratio,
    parse_units_milli,
)
from .bounds import (
    _CONTROL,
    _CONTROL_BUT_LINES,
    _NODE_NAME,
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
    NAME_PATTERN,
    NODE_NAME_EXPECTED,
    NODE_NAME_PATTERN,
    ONE_LINE_PATTERN,
    YEAR_S,
    Range,
    RangeError,
)
from .kube_override import EXPECTED as _OVERRIDE_EXPECTED
from .kube_override import OVERRIDE_SCHEMA, kubespawner_override
from .yamlread import show

INVENTORY_SOURCES = ("static", "simulated", "nvml", "kubernetes")
DISCOVERED_SOURCES = ("nvml", "kubernetes")
MAX_HEADROOM = 0.9
SLUG = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
SCHEMA_ID = "urn:jupyter-gpushare:policy"

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


# ------------------------------------------------------------------------ values


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
            raise RangeError(f"{show(value)} is out of range 0..{MAX_GPU_HOURS:,} "
                             "(GPU-hours)") from None
    raise UnitError("a number")


def _bool(value: object) -> bool:
    if isinstance(value, bool):
        return value
    raise UnitError("true or false")


def _names(value: object) -> tuple[str, ...]:
    items = [value] if isinstance(value, str) else value
    if isinstance(items, list) and all(isinstance(v, (str, int)) and not isinstance(v, bool)
                                       for v in items):
        names = tuple(str(v) for v in items)
        for name in names:
            if not name.strip() or len(name) > MAX_TEXT or _CONTROL.search(name):
                raise UnitError(f"names of 1 to {MAX_TEXT} characters on one line, without "
                                f"control characters (got {show(name)})")
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


def _choice(*options: str) -> Callable[[object], str]:
    def check(value: object) -> str:
        if isinstance(value, str) and value in options:
            return value
        hint = difflib.get_close_matches(str(value)[:MAX_TEXT], options, n=1)
        extra = f"; did you mean {hint[0]!r}?" if hint else ""
        raise UnitError("one of " + ", ".join(options) + extra)

    return check


def _quantity(pattern: str, minimum: float = 0, exclusive: bool = False) -> dict[str, Any]:
    bound = "exclusiveMinimum" if exclusive else "minimum"
    return {"anyOf": [{"type": "number", bound: minimum},
                      {"type": "string", "pattern": pattern}]}


def _vendor(value: object) -> str:
    if isinstance(value, str) and _VENDOR.match(value.strip().lower()):
        return value.strip().lower()
    raise UnitError("a vendor name such as nvidia, amd or metax")


def _whole_in(lo: int, hi: int, unit: str) -> Value:
    return Value(_whole, {"type": "integer", "minimum": lo, "maximum": hi},
                 f"a whole number from {lo} to {hi}", Range(lo, hi, unit))


_VENDOR = re.compile(r"^[a-z][a-z0-9-]{0,31}$")
VENDOR = Value(_vendor, {"type": "string", "pattern": "^[A-Za-z][A-Za-z0-9-]{0,31}$"},
               "a vendor name such as nvidia, amd or metax")
_TEXT_SCHEMA: dict[str, Any] = {"anyOf": [
    {"type": "string", "pattern": r"\S", "maxLength": MAX_TEXT}, {"type": "number"}]}
TEXT = Value(_text, _TEXT_SCHEMA, "a non-empty text on one line")
DESCRIPTION = Value(_description, {"anyOf": [
    {"type": "string", "maxLength": MAX_DESCRIPTION}, {"type": "number"}]},
    "a text (several lines allowed)")
IMAGE = Value(_image, {"type": "string", "pattern": r"^\S+$", "maxLength": MAX_IMAGE},
              "a container image")
NODE_NAME = Value(_node_name, {"type": "string", "pattern": NODE_NAME_PATTERN},
                  NODE_NAME_EXPECTED)
PRIORITY_VALUE = _whole_in(0, MAX_PRIORITY, "priority value")
GPU_COUNT = _whole_in(1, MAX_GPUS_PER_NODE, "GPUs")
GPUS_PER_NODE = _whole_in(0, MAX_GPUS_PER_NODE, "GPUs")
NODE_COUNT = _whole_in(1, MAX_NODES, "nodes")
SHARDS = Value(positive(_whole, "a whole number"), {"type": "integer", "minimum": 1,
               "maximum": MAX_SHARDS_PER_GPU}, "a whole number greater than 0",
               Range(1, MAX_SHARDS_PER_GPU, "shards per GPU"))
GPU_HOURS = Value(_number, {"type": "number", "minimum": 0, "maximum": MAX_GPU_HOURS},
                  "GPU-hours", Range(0, MAX_GPU_HOURS, "GPU-hours"))
BOOL = Value(_bool, {"type": "boolean"}, "true or false")
NAMES = Value(_names, {"anyOf": [
    {"type": "string", "pattern": ONE_LINE_PATTERN, "maxLength": MAX_TEXT},
    {"type": "array", "items": {"anyOf": [
        {"type": "string", "pattern": ONE_LINE_PATTERN, "maxLength": MAX_TEXT},
        {"type": "integer"}]}}]}, "a name or a list of names")
LABELS = Value(_labels, {"type": "object", "additionalProperties": {
    "type": ["string", "number", "boolean", "null"]}}, "a mapping of label names to values")
SLUG_VALUE = Value(_slug, {"type": "string", "pattern": SLUG.pattern},
                   "lower-case letters, digits and '-'")
_MEMORY_RANGE = Range(1, MAX_MEMORY_MIB, "MiB")
MEMORY = Value(positive(parse_memory_mib, "a memory size"),
               _quantity(MEMORY_PATTERN, exclusive=True), "a memory size such as 80GiB",
               _MEMORY_RANGE)
CPU = Value(positive(parse_cpu_milli, "a CPU count"), _quantity(CPU_PATTERN, exclusive=True),
            "a CPU count such as 4, 0.5 or 500m", Range(1, MAX_CPU_CORES * 1000, "CPU cores",
                                                       1000))
GRACE = Value(parse_duration_s, _quantity(DURATION_PATTERN), "a duration such as 30s",
              Range(0, 7 * 86400, "seconds"))
DURATION = Value(parse_duration_s, _quantity(DURATION_PATTERN), "a duration such as 8h or 90s",
                 Range(0, YEAR_S, "seconds"))
POSITIVE_DURATION = Value(positive(parse_duration_s, "a duration"),
                          _quantity(DURATION_PATTERN, exclusive=True), "a duration such as 8h",
                          Range(1, YEAR_S, "seconds"))
_UNITS_RANGE = Range(0, MAX_GPU_UNITS * UNIT, "GPU units", UNIT)
FRACTION = Value(positive(parse_fraction_milli, "a fraction"),
                 _quantity(RATIO_PATTERN, exclusive=True), "a fraction such as 1/4 or 25%",
                 _UNITS_RANGE)
DEVICE_SHARE = Value(positive(parse_fraction_milli, "a fraction"), {"anyOf": [
    {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
    {"type": "string", "pattern": RATIO_PATTERN}]}, "a fraction of one GPU, at most 1",
    _UNITS_RANGE)
UNITS = Value(parse_units_milli, _quantity(RATIO_PATTERN), "GPU units such as 4, 0.5 or 1/2",
              _UNITS_RANGE)
POSITIVE_UNITS = Value(positive(parse_units_milli, "GPU units"),
                       _quantity(RATIO_PATTERN, exclusive=True), "GPU units greater than 0",
                       _UNITS_RANGE)
HEADROOM = Value(_headroom, {"anyOf": [{"type": "number", "minimum": 0, "maximum": MAX_HEADROOM},
                                       {"type": "string", "pattern": RATIO_PATTERN}]},
                 "a fraction between 0 and 0.9")
MODE = Value(_choice(*(m.value for m in SharingMode)),
             {"enum": [m.value for m in SharingMode]}, "a sharing mode")
SOURCE = Value(_choice(*INVENTORY_SOURCES), {"enum": list(INVENTORY_SOURCES)},
               "an inventory source")
SLURM_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"


def _slurm_name(value: object) -> str:
    if isinstance(value, str) and re.match(SLURM_NAME_PATTERN, value):
        return value
    raise UnitError("a Slurm name: letters, digits, '.', '_' or '-', such as gpu")


SLURM_NAME = Value(_slurm_name, {"type": "string", "pattern": SLURM_NAME_PATTERN},
                   "a Slurm partition name")
OPTIONS = Value(lambda v: v, {"type": "object"}, "options for the discovery adapter")


# ---------------------------------------------------------------------- structure


@dataclass(frozen=True)
class Section:
    """A mapping with a fixed set of keys."""

    title: str
    keys: tuple[Key, ...]
    description: str = ""
    _by_name: dict[str, Key] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        self._by_name.update({k.name: k for k in self.keys})

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(k.name for k in self.keys)

    def key(self, name: str) -> Key:
        return self._by_name[name]


@dataclass(frozen=True)
class MapOf:
    """A mapping of names (of pools, teams, ...) to sections of one kind; each name must
    match :data:`NAME_PATTERN`."""

    item: Section
    description: str = ""


@dataclass(frozen=True)
class ListOf:
    """A list of sections of one kind."""

    item: Section
    description: str = ""


@dataclass(frozen=True)
class Either:
    """One of several shapes (e.g. ``gpu: 2``, ``gpu: 1/4`` or ``gpu: {fraction: ...}``)."""

    options: tuple[Shape, ...]
    description: str = ""


Shape: TypeAlias = Value | Section | MapOf | ListOf | Either


@dataclass(frozen=True)
class Key:
    """One key of a section: its shape, whether it must be there, its help text."""

    name: str
    shape: Shape
    help: str = ""
    required: bool = False
    default: object = None


def _k(name: str, shape: Shape, help: str = "", *, required: bool = False,
       default: object = None) -> Key:
    return Key(name, shape, help, required, default)


GPUS = Section("GPUs of a node", (
    _k("model", TEXT, "GPU model, e.g. H100", required=True),
    _k("memory", MEMORY, "memory of one GPU, e.g. 80GiB", required=True),
    _k("count", GPU_COUNT, "how many such GPUs", default=1),
    _k("units", DEVICE_SHARE, "share of a card each device is (MIG: 1/7)", default=1),
    _k("uuids", NAMES, "the real GPU uuids, one per GPU"),
    _k("vendor", VENDOR, "who makes the card: nvidia, amd, metax, ... (shown with the model)"),
))
NODE = Section("A node", (
    _k("name", NODE_NAME, "node name (its host name)", required=True),
    _k("pool", TEXT, "the pool it belongs to", required=True),
    _k("cpu", CPU, "CPU cores", required=True),
    _k("memory", MEMORY, "RAM", required=True),
    _k("labels", LABELS, "node labels"),
    _k("gpus", ListOf(GPUS), "its GPUs"),
))
SIMULATED = Section("A group of identical simulated nodes", (
    _k("pool", TEXT, "the pool", required=True),
    _k("nodes", NODE_COUNT, "how many nodes", default=1),
    _k("gpus_per_node", GPUS_PER_NODE, "GPUs per node", default=8),
    _k("model", TEXT, "GPU model", default="Simulated GPU"),
    _k("gpu_memory", MEMORY, "memory of one GPU", default="80GiB"),
    _k("cpu", CPU, "CPU cores per node", default=32),
    _k("memory", MEMORY, "RAM per node", default="256GiB"),
    _k("name", NODE_NAME, "node name prefix (default sim-<pool>)"),
    _k("labels", LABELS, "node labels"),
))
INVENTORY = Section("Which machines and GPUs there are", (
    _k("source", SOURCE, "static, simulated, nvml or kubernetes"),
    _k("nodes", ListOf(NODE), "the nodes (static or simulated)"),
    _k("simulated", Either((SIMULATED, ListOf(SIMULATED))), "generated simulated nodes"),
    _k("discovery", OPTIONS, "options for nvml / kubernetes discovery"),
))
POOL = Section("A pool of nodes with one sharing mode", (
    _k("mode", MODE, "exclusive, shared, mig or debug", required=True),
    _k("memory_headroom", HEADROOM, "share of each GPU's memory kept free", default="20%"),
    _k("description", DESCRIPTION, "shown to users"),
))
PRIORITY_CLASS = Section("A priority class", (
    _k("value", PRIORITY_VALUE, "higher wins", required=True),
    _k("preemptible", BOOL, "may be stopped for higher-priority work", default=False),
    _k("grace_period", GRACE, "time between the stop signal and the kill", default="30s"),
    _k("checkpoint_required_after", DURATION,
       "longer preemptible jobs must declare checkpointing"),
    _k("description", DESCRIPTION, "shown to users"),
))
QUOTA = Section("A team's quota in one pool, in GPU units", (
    _k("guaranteed", UNITS, "never taken away from the team", required=True),
    _k("borrow_limit", UNITS, "how far above the guarantee it may borrow", default=0),
    _k("gpu_hours_per_month", GPU_HOURS, "budget of GPU-hours per month"),
    _k("per_user_cap", POSITIVE_UNITS, "most GPU units one member may hold"),
    _k("explicit_requests", BOOL, "members may send explicit GPU asks (no profile) here",
       default=False),
))
TEAM = Section("A team: JupyterHub groups that share quotas", (
    _k("groups", NAMES, "JupyterHub groups of its members (default: the team's name)"),
    _k("admins", NAMES, "users who see the team's usage"),
    _k("quotas", MapOf(QUOTA), "quota per pool"),
    _k("priorities", NAMES, "priority classes members may use (default: every class)"),
    _k("description", DESCRIPTION, "shown to users"),
))
GPU_ASK = Section("A GPU request", (
    _k("count", GPU_COUNT, "whole GPUs (not with the others)"),
    _k("fraction", FRACTION, "share of one GPU's memory and compute"),
    _k("memory", MEMORY, "peak GPU memory"),
    _k("compute", DEVICE_SHARE, "share of one GPU's compute"),
))
GPU_SHORTHAND = Value(lambda v: v, {"anyOf": [
    {"type": "integer", "minimum": 0, "maximum": MAX_GPUS_PER_NODE}, {"enum": ["none"]},
    {"type": "string", "pattern": RATIO_PATTERN}]},
    "a number of GPUs, a fraction such as 1/4, or none")
PROFILE = Section("A server profile users pick", (
    _k("slug", SLUG_VALUE, "identifier, e.g. train-1gpu", required=True),
    _k("display_name", TEXT, "shown in the form (default: the slug)"),
    _k("description", DESCRIPTION, "shown in the form"),
    _k("pool", TEXT, "the pool (required with a GPU)"),
    _k("gpu", Either((GPU_SHORTHAND, GPU_ASK)), "leave out for CPU only"),
    _k("cpu", CPU, "CPU cores", default=1),
    _k("memory", MEMORY, "RAM", default="2GiB"),
    _k("image", IMAGE, "container image (Kubernetes)"),
    _k("priority", TEXT, "its priority class (default: interactive)"),
    _k("priorities", NAMES, "further classes a user may choose for it"),
    _k("max_lifetime", POSITIVE_DURATION, "the server is stopped after this long"),
    _k("teams", NAMES, "teams that may use it (default: every team)"),
    _k("gpu_models", NAMES, "GPU models it may land on (default: any)"),
    _k("kubespawner_override", Value(kubespawner_override, OVERRIDE_SCHEMA, _OVERRIDE_EXPECTED),
       "KubeSpawner traits for this profile on Kubernetes (volumes, tolerations, ...; never "
       "GPU: the grant sets that)"),
))
SLURM = Section("How grants become Slurm requests (batch jobs and servers on Slurm)", (
    _k("shards_per_gpu", SHARDS, "GRES shards per GPU: a fraction f of a GPU is asked "
       "as shard:K with K = f x shards_per_gpu (at least 1); the Slurm export writes the same "
       "count into gres.conf", default=8),
    _k("partition", SLURM_NAME, "the Slurm partition for jobs and servers (default: the "
       "cluster's default partition)"),
))
POLICY = Section("jupyter-gpushare policy", (
    _k("inventory", INVENTORY, required=True),
    _k("pools", MapOf(POOL), "pools by name", required=True),
    _k("priority_classes", MapOf(PRIORITY_CLASS), "priority classes by name", required=True),
    _k("teams", MapOf(TEAM), "teams by name"),
    _k("default_team", TEXT, "team of users in no team's groups"),
    _k("profiles", ListOf(PROFILE), "what users pick when starting a server"),
    _k("slurm", SLURM, "Slurm settings, for the Slurm batch backend, spawner and export"),
), "Who may use which GPUs, how much, and how. Check with: jupyter-gpushare check-policy FILE")


# ---------------------------------------------------------------------- JSON Schema


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    # the loader reads `key:` (left empty) as absent, so an optional key may be null
    return {"anyOf": [schema, {"type": "null"}], **(
        {"description": schema["description"]} if "description" in schema else {})}


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
        return {"type": "object", "additionalProperties": item,
                "propertyNames": {"pattern": NAME_PATTERN}}
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
    out: dict[str, Any] = {"type": "object", "title": section.title, "properties": properties,
                           "additionalProperties": False}
    required = [k.name for k in section.keys if k.required]
    if required:
        out["required"] = required
    if section.description:
        out["description"] = section.description
    return out


def json_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of the policy file, from the loader's definitions."""
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": SCHEMA_ID,
            **_section_schema(POLICY)}
