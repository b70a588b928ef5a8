"""The policy file (YAML) and its loader: policy file -> :class:`core.model.Policy`.

This is an adapter: it reads text and files, the core never imports it. Every
problem is collected (not just the first) as a :class:`PolicyIssue` that names
the file, the line, the dotted field path and what was expected, so an admin can
fix a whole file in one go. Errors make :func:`load_policy` / :func:`parse_policy`
raise :class:`PolicyError`; warnings (a pool with no nodes, guarantees that
oversubscribe a pool, ...) are returned by :func:`check_policy` and logged.

The schema is documented, with an example, in ``hub_config/gpushare.yaml``.
Inventories that are *discovered* (``source: nvml`` or ``kubernetes``) need an
adapter: pass ``discover=`` a callable that takes the :class:`DiscoverySpec` and
returns the nodes. Without one, capacity checks are skipped (with a warning).
"""

from __future__ import annotations

import difflib
import logging
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

from .core.model import (
    GPU,
    UNIT,
    GPUAsk,
    Node,
    Policy,
    Pool,
    PoolQuota,
    PriorityClass,
    Profile,
    SharingMode,
    Team,
)
from .policy_units import (
    UnitError,
    format_duration,
    format_mib,
    format_units,
    parse_cpu_milli,
    parse_duration_s,
    parse_fraction_milli,
    parse_memory_mib,
    parse_ratio,
    parse_units_milli,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

INVENTORY_SOURCES = ("static", "simulated", "nvml", "kubernetes")
DISCOVERED_SOURCES = ("nvml", "kubernetes")
MAX_HEADROOM = 0.9
_SLUG = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")


# --------------------------------------------------------------------------- issues


@dataclass(frozen=True)
class PolicyIssue:
    """One problem in a policy file: where it is and what was expected."""

    file: str
    line: int
    path: str
    message: str
    severity: str = "error"  # "error" or "warning"

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        prefix = "warning: " if self.severity == "warning" else ""
        path = f"{self.path}: " if self.path else ""
        return f"{where}: {prefix}{path}{self.message}"


class PolicyError(Exception):
    """The policy file has errors; ``errors`` lists every one of them."""

    def __init__(self, errors: list[PolicyIssue]):
        self.errors = list(errors)
        super().__init__(str(self))

    def __str__(self) -> str:
        count = len(self.errors)
        head = f"{count} error{'s' if count != 1 else ''} in the policy file:"
        return "\n".join([head, *(f"  {issue}" for issue in self.errors)])


@dataclass
class PolicyCheck:
    """What :func:`check_policy` found: the policy (``None`` on errors) and all issues."""

    policy: Policy | None
    issues: list[PolicyIssue]

    @property
    def errors(self) -> list[PolicyIssue]:
        return [i for i in self.issues if i.severity == "error"]

    @property
    def warnings(self) -> list[PolicyIssue]:
        return [i for i in self.issues if i.severity == "warning"]


@dataclass(frozen=True)
class DiscoverySpec:
    """What an adapter needs to discover an inventory (``inventory.discovery`` verbatim)."""

    source: str  # "nvml" or "kubernetes"
    options: dict[str, Any]
    file: str = "<string>"
    line: int = 0


Discover = Callable[[DiscoverySpec], Iterable[Node]]


# ------------------------------------------------------------- YAML with line numbers


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


# ----------------------------------------------------------------- reading helpers


class _Ctx:
    """Collects issues for one file."""

    def __init__(self, filename: str):
        self.filename = filename
        self.issues: list[PolicyIssue] = []

    def error(self, line: int, path: str, message: str) -> None:
        self.issues.append(PolicyIssue(self.filename, line, path, message))

    def warn(self, line: int, path: str, message: str) -> None:
        self.issues.append(PolicyIssue(self.filename, line, path, message, "warning"))

    @property
    def failed(self) -> bool:
        return any(i.severity == "error" for i in self.issues)


def _describe(value: object) -> str:
    if value is None:
        return "nothing"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return repr(value)


def _join(path: str, key: object) -> str:
    return f"{path}.{key}" if path else str(key)


def _as_map(ctx: _Ctx, value: object, line: int, path: str) -> YMap | None:
    if isinstance(value, YMap):
        return value
    ctx.error(line, path, f"got {_describe(value)} (expected a mapping of keys to values)")
    return None


def _as_list(ctx: _Ctx, value: object, line: int, path: str) -> YList | None:
    if isinstance(value, YList):
        return value
    ctx.error(line, path, f"got {_describe(value)} (expected a list)")
    return None


class _Fields:
    """Typed, line-aware access to the keys of one mapping; reports unknown keys."""

    def __init__(self, ctx: _Ctx, data: YMap, path: str, allowed: Iterable[str]):
        self.ctx, self.data, self.path = ctx, data, path
        allowed = tuple(allowed)
        for key in data:
            if key not in allowed:
                self._unknown(key, allowed)

    def _unknown(self, key: object, allowed: tuple[str, ...]) -> None:
        hint = difflib.get_close_matches(str(key), allowed, n=1)
        expected = f"did you mean {hint[0]!r}?" if hint else "expected one of " + ", ".join(
            allowed
        )
        self.ctx.error(
            self.key_line(key), _join(self.path, key), f"unknown key ({expected})"
        )

    def key_line(self, key: object) -> int:
        return self.data.key_lines.get(key, self.data.line)

    def line(self, key: object) -> int:
        return self.data.value_lines.get(key, self.data.line)

    def missing(self, key: str) -> None:
        if key in self.data:  # written but left empty
            self.ctx.error(self.key_line(key), _join(self.path, key), "required field is empty")
        else:
            self.ctx.error(self.data.line, _join(self.path, key), "required field is missing")

    def has(self, key: str) -> bool:
        return key in self.data and self.data[key] is not None

    def get(
        self, key: str, conv: Callable[[object], T], *, required: bool = False,
        default: T | None = None,
    ) -> T | None:
        """The converted value of ``key``; reports a missing or bad value and returns default."""
        if not self.has(key):
            if required:
                self.missing(key)
            return default
        value = self.data[key]
        try:
            return conv(value)
        except UnitError as exc:
            self.ctx.error(self.line(key), _join(self.path, key), f"got {_describe(value)} "
                           f"(expected {exc})")
            return default

    def map(self, key: str, *, required: bool = False) -> YMap | None:
        if not self.has(key):
            if required:
                self.missing(key)
            return None
        return _as_map(self.ctx, self.data[key], self.line(key), _join(self.path, key))

    def list(self, key: str, *, required: bool = False) -> YList | None:
        if not self.has(key):
            if required:
                self.missing(key)
            return None
        return _as_list(self.ctx, self.data[key], self.line(key), _join(self.path, key))


def _str(value: object) -> str:
    if isinstance(value, str) and value.strip():
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)  # e.g. a model name such as 4090
    raise UnitError("a non-empty text")


def _int(value: object) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise UnitError("a whole number")


def _number(value: object) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if value < 0:
            raise UnitError("a number >= 0")
        return float(value)
    raise UnitError("a number")


def _bool(value: object) -> bool:
    if isinstance(value, bool):
        return value
    raise UnitError("true or false")


def _str_list(value: object) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and all(isinstance(v, (str, int)) for v in value):
        return tuple(str(v) for v in value)
    raise UnitError("a list of names")


def _labels(value: object) -> tuple[tuple[str, str], ...]:
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return tuple(sorted((k, str(v)) for k, v in value.items()))
    raise UnitError("a mapping of label names to values")


def _headroom(value: object) -> float:
    ratio = parse_ratio(value, "a fraction between 0 and 0.9 such as 20%, 0.2 or 1/5")
    if ratio > MAX_HEADROOM:
        raise UnitError("a fraction between 0 and 0.9 such as 20%, 0.2 or 1/5")
    return float(ratio)


def _positive(conv: Callable[[object], int], what: str) -> Callable[[object], int]:
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
        hint = difflib.get_close_matches(str(value), options, n=1)
        extra = f"; did you mean {hint[0]!r}?" if hint else ""
        raise UnitError("one of " + ", ".join(options) + extra)

    return check


def _entries(ctx: _Ctx, fields: _Fields, key: str) -> list[tuple[str, YMap, int, str]]:
    """Items of a mapping-of-mappings section: (name, body, key line, path)."""
    section = fields.map(key)
    if section is None:
        return []
    out = []
    for name, body in section.items():
        path = _join(key, name)
        line = section.key_lines.get(name, section.line)
        if not isinstance(name, str) or not name:
            ctx.error(line, path, f"got name {_describe(name)} (expected a text name)")
            continue
        if body is None:
            body = YMap()
            body.line = line
        mapping = _as_map(ctx, body, section.value_lines.get(name, line), path)
        if mapping is not None:
            out.append((name, mapping, line, path))
    return out


def _levenshtein_hint(name: str, known: Iterable[str]) -> str:
    hint = difflib.get_close_matches(name, list(known), n=1)
    return f"; did you mean {hint[0]!r}?" if hint else ""


def _unknown_ref(kind: str, name: str, known: Iterable[str]) -> str:
    known = sorted(known)
    listed = ", ".join(known) if known else "none are defined"
    return f"unknown {kind} {name!r} (expected one of: {listed}){_levenshtein_hint(name, known)}"


# ------------------------------------------------------------------------- sections


def _parse_pools(ctx: _Ctx, root: _Fields) -> dict[str, tuple[Pool, int]]:
    pools: dict[str, tuple[Pool, int]] = {}
    if not root.has("pools"):
        root.missing("pools")
    for name, body, line, path in _entries(ctx, root, "pools"):
        f = _Fields(ctx, body, path, ("mode", "memory_headroom", "description"))
        mode = f.get("mode", _choice(*(m.value for m in SharingMode)), required=True)
        headroom = f.get("memory_headroom", _headroom, default=0.2)
        if mode in ("exclusive", "mig") and f.has("memory_headroom"):
            ctx.warn(f.key_line("memory_headroom"), _join(path, "memory_headroom"),
                     f"ignored: a {mode} pool hands out whole devices")
        description = f.get("description", _str, default="")
        if mode is not None:
            pools[name] = (Pool(name, SharingMode(mode), headroom or 0.0, description or ""), line)
    return pools


def _parse_priorities(ctx: _Ctx, root: _Fields) -> dict[str, tuple[PriorityClass, int]]:
    out: dict[str, tuple[PriorityClass, int]] = {}
    if not root.has("priority_classes"):
        root.missing("priority_classes")
    keys = ("value", "preemptible", "grace_period", "checkpoint_required_after", "description")
    for name, body, line, path in _entries(ctx, root, "priority_classes"):
        f = _Fields(ctx, body, path, keys)
        value = f.get("value", _int, required=True)
        preemptible = f.get("preemptible", _bool, default=False)
        grace = f.get("grace_period", parse_duration_s, default=30)
        checkpoint = f.get("checkpoint_required_after", parse_duration_s)
        if checkpoint is not None and not preemptible:
            ctx.warn(f.key_line("checkpoint_required_after"),
                     _join(path, "checkpoint_required_after"),
                     "only preemptible work is ever stopped; set preemptible: true or drop this")
        if value is not None:
            out[name] = (
                PriorityClass(name, value, bool(preemptible), grace or 0, checkpoint,
                              f.get("description", _str, default="") or ""),
                line,
            )
    return out


# ------------------------------------------------------------------------ inventory


def simulated_nodes(
    pool: str,
    count: int,
    gpus_per_node: int,
    model: str = "Simulated GPU",
    gpu_memory_mib: int = 81920,
    cpu_milli: int = 32000,
    memory_mib: int = 262144,
    prefix: str | None = None,
    labels: tuple[tuple[str, str], ...] = (),
) -> tuple[Node, ...]:
    """``count`` identical nodes of simulated GPUs (uuids ``GPU-sim-<node>-<i>``)."""
    prefix = prefix or f"sim-{pool}"
    nodes = []
    for n in range(count):
        name = f"{prefix}-{n}"
        gpus = tuple(
            GPU(f"GPU-sim-{name}-{i}", model, gpu_memory_mib, i, simulated=True)
            for i in range(gpus_per_node)
        )
        nodes.append(Node(name, pool, gpus, cpu_milli, memory_mib, labels))
    return tuple(nodes)


@dataclass
class _NodeAt:
    node: Node
    line: int
    path: str
    pool_line: int


def _parse_gpus(ctx: _Ctx, f: _Fields, path: str, node_name: str, simulated: bool
                ) -> tuple[GPU, ...]:
    gpus: list[GPU] = []
    items = f.list("gpus") if f.has("gpus") else None
    for i, item in enumerate(items or ()):
        ipath = f"{path}.gpus[{i}]"
        body = _as_map(ctx, item, items.item_lines[i] if items else 0, ipath)
        if body is None:
            continue
        g = _Fields(ctx, body, ipath, ("model", "memory", "count", "units", "uuids"))
        model = g.get("model", _str, required=True)
        memory = g.get("memory", _positive(parse_memory_mib, "a memory size"), required=True)
        count = g.get("count", _positive(_int, "a whole number"), default=1) or 1
        units = g.get("units", _positive(parse_fraction_milli, "a fraction"), default=UNIT)
        if units is not None and units > UNIT:
            ctx.error(g.line("units"), _join(ipath, "units"),
                      "a device cannot be more than one GPU (expected a fraction up to 1)")
        uuids = g.get("uuids", _str_list) or ()
        if uuids and len(uuids) != count:
            ctx.error(g.line("uuids"), _join(ipath, "uuids"),
                      f"got {len(uuids)} uuids (expected one per GPU: {count})")
            uuids = ()
        if model is None or memory is None:
            continue
        for k in range(count):
            index = len(gpus)
            default = f"GPU-sim-{node_name}-{index}" if simulated else f"GPU-{node_name}-{index}"
            uuid = uuids[k] if uuids else default
            gpus.append(GPU(uuid, model, memory, index, min(units or UNIT, UNIT), simulated))
    return tuple(gpus)


def _parse_node_list(ctx: _Ctx, inv: _Fields, simulated: bool) -> list[_NodeAt]:
    out: list[_NodeAt] = []
    items = inv.list("nodes")
    keys = ("name", "pool", "cpu", "memory", "labels", "gpus")
    for i, item in enumerate(items or ()):
        path = f"inventory.nodes[{i}]"
        line = items.item_lines[i] if items else 0
        body = _as_map(ctx, item, line, path)
        if body is None:
            continue
        f = _Fields(ctx, body, path, keys)
        name = f.get("name", _str, required=True)
        pool = f.get("pool", _str, required=True)
        cpu = f.get("cpu", _positive(parse_cpu_milli, "a CPU count"), required=True)
        memory = f.get("memory", _positive(parse_memory_mib, "a memory size"), required=True)
        labels = f.get("labels", _labels) or ()
        gpus = _parse_gpus(ctx, f, path, name or f"node{i}", simulated)
        if None in (name, pool, cpu, memory):
            continue
        node = Node(name, pool, gpus, cpu, memory, labels)  # type: ignore[arg-type]
        out.append(_NodeAt(node, body.line, path, f.line("pool")))
    return out


def _parse_simulated(ctx: _Ctx, inv: _Fields) -> list[_NodeAt]:
    raw = inv.data.get("simulated")
    line = inv.line("simulated")
    groups: list[tuple[Any, int, str]]
    if isinstance(raw, YMap):
        groups = [(raw, line, "inventory.simulated")]
    elif isinstance(raw, YList):
        groups = [(g, raw.item_lines[i], f"inventory.simulated[{i}]") for i, g in enumerate(raw)]
    else:
        ctx.error(line, "inventory.simulated",
                  f"got {_describe(raw)} (expected a mapping or a list of mappings)")
        return []
    keys = ("pool", "nodes", "gpus_per_node", "model", "gpu_memory", "cpu", "memory", "name",
            "labels")
    out: list[_NodeAt] = []
    for item, item_line, path in groups:
        body = _as_map(ctx, item, item_line, path)
        if body is None:
            continue
        f = _Fields(ctx, body, path, keys)
        pool = f.get("pool", _str, required=True)
        count = f.get("nodes", _positive(_int, "a whole number"), default=1)
        per_node = f.get("gpus_per_node", _int, default=8)
        model = f.get("model", _str, default="Simulated GPU")
        gmem = f.get("gpu_memory", _positive(parse_memory_mib, "a memory size"), default=81920)
        cpu = f.get("cpu", _positive(parse_cpu_milli, "a CPU count"), default=32000)
        mem = f.get("memory", _positive(parse_memory_mib, "a memory size"), default=262144)
        prefix = f.get("name", _str)
        labels = f.get("labels", _labels) or ()
        if per_node is not None and per_node < 0:
            ctx.error(f.line("gpus_per_node"), _join(path, "gpus_per_node"),
                      f"got {per_node} (expected a whole number >= 0)")
            continue
        if None in (pool, count, per_node, model, gmem, cpu, mem):
            continue
        nodes = simulated_nodes(pool, count, per_node, model, gmem, cpu, mem,  # type: ignore
                                prefix, labels)
        out.extend(_NodeAt(n, body.line, path, f.line("pool")) for n in nodes)
    return out


def _parse_inventory(ctx: _Ctx, root: _Fields, discover: Discover | None
                     ) -> tuple[str, list[_NodeAt], bool]:
    """Nodes, the source, and whether the inventory is known (not left to discovery)."""
    inv_map = root.map("inventory", required=True)
    if inv_map is None:
        return "static", [], False
    keys = ("source", "nodes", "simulated", "discovery")
    inv = _Fields(ctx, inv_map, "inventory", keys)
    default = "simulated" if inv.has("simulated") and not inv.has("nodes") else "static"
    source = inv.get("source", _choice(*INVENTORY_SOURCES), default=default) or default
    if source in DISCOVERED_SOURCES:
        return source, _discover(ctx, inv, source, discover), discover is not None
    options = inv.map("discovery")
    if options is not None:
        ctx.error(inv.key_line("discovery"), "inventory.discovery",
                  f"only used with source nvml or kubernetes (source is {source})")
    if inv.has("simulated") and source != "simulated":
        ctx.error(inv.key_line("simulated"), "inventory.simulated",
                  f"only used with source: simulated (source is {source})")
    nodes = _parse_node_list(ctx, inv, simulated=source == "simulated")
    if source == "simulated" and inv.has("simulated"):
        nodes += _parse_simulated(ctx, inv)
    if not inv.has("nodes") and not inv.has("simulated"):
        what = "nodes or simulated" if source == "simulated" else "nodes"
        ctx.error(inv_map.line, "inventory", f"no nodes declared (expected {what})")
    return source, nodes, True


def _discover(ctx: _Ctx, inv: _Fields, source: str, discover: Discover | None) -> list[_NodeAt]:
    for key in ("nodes", "simulated"):
        if inv.has(key):
            ctx.error(inv.key_line(key), _join("inventory", key),
                      f"not used with source {source} (nodes are discovered)")
    options = inv.map("discovery")
    line = inv.line("source")
    if discover is None:
        ctx.warn(line, "inventory.source",
                 f"the inventory is discovered from {source} at run time; "
                 "capacity and fit checks were skipped")
        return []
    spec = DiscoverySpec(source, dict(options or {}), ctx.filename, line)
    try:
        nodes = list(discover(spec))
    except Exception as exc:  # an adapter's failure, reported where the source is declared
        ctx.error(line, "inventory.source", f"discovery from {source} failed: {exc}")
        return []
    return [_NodeAt(n, line, "inventory.source", line) for n in nodes]


def _check_nodes(ctx: _Ctx, nodes: list[_NodeAt], pools: dict[str, tuple[Pool, int]],
                 pools_ok: bool) -> None:
    seen: dict[str, int] = {}
    uuids: dict[str, int] = {}
    for at in nodes:
        node = at.node
        if node.name in seen:
            ctx.error(at.line, f"{at.path}.name",
                      f"duplicate node name {node.name!r} (first at line {seen[node.name]})")
        seen.setdefault(node.name, at.line)
        if pools_ok and node.pool not in pools:
            ctx.error(at.pool_line, f"{at.path}.pool", _unknown_ref("pool", node.pool, pools))
        for gpu in node.gpus:
            if gpu.uuid in uuids:
                ctx.error(at.line, f"{at.path}.gpus",
                          f"duplicate GPU uuid {gpu.uuid!r} (first at line {uuids[gpu.uuid]})")
            uuids.setdefault(gpu.uuid, at.line)


# ---------------------------------------------------------------------------- teams


@dataclass
class _TeamAt:
    team: Team
    line: int
    quota_lines: dict[str, int] = field(default_factory=dict)


def _parse_quota(ctx: _Ctx, body: YMap, path: str) -> PoolQuota | None:
    keys = ("guaranteed", "borrow_limit", "gpu_hours_per_month", "per_user_cap",
            "explicit_requests")
    f = _Fields(ctx, body, path, keys)
    guaranteed = f.get("guaranteed", parse_units_milli, required=True)
    borrow = f.get("borrow_limit", parse_units_milli, default=0)
    hours = f.get("gpu_hours_per_month", _number)
    cap = f.get("per_user_cap", _positive(parse_units_milli, "GPU units"))
    explicit = f.get("explicit_requests", _bool, default=False)
    if guaranteed is None or borrow is None:
        return None
    return PoolQuota(guaranteed, borrow, hours, cap, bool(explicit))


def _priority_list(ctx: _Ctx, f: _Fields, path: str,
                   priorities: dict[str, tuple[PriorityClass, int]], refs_ok: bool
                   ) -> tuple[str, ...] | None:
    """The ``priorities:`` list of a team or profile (``None`` when absent); unknown
    classes are errors."""
    if not f.has("priorities"):
        return None
    names = f.get("priorities", _str_list)
    if names is None:
        return None
    for i, name in enumerate(names):
        if refs_ok and name not in priorities:
            ctx.error(f.line("priorities"), f"{path}.priorities[{i}]",
                      _unknown_ref("priority class", name, priorities))
    return names


def _parse_teams(ctx: _Ctx, root: _Fields, pools: dict[str, tuple[Pool, int]], pools_ok: bool,
                 priorities: dict[str, tuple[PriorityClass, int]], prio_ok: bool
                 ) -> dict[str, _TeamAt]:
    teams: dict[str, _TeamAt] = {}
    for name, body, line, path in _entries(ctx, root, "teams"):
        f = _Fields(ctx, body, path, ("groups", "admins", "quotas", "priorities", "description"))
        groups = f.get("groups", _str_list) or (name,)
        admins = f.get("admins", _str_list) or ()
        allowed = _priority_list(ctx, f, path, priorities, prio_ok)
        quotas: list[tuple[str, PoolQuota]] = []
        at = _TeamAt(Team(name, groups, (), admins, allowed), line)
        for pool, qbody, qline, qpath in _entries(ctx, f, "quotas"):
            qpath = f"{path}.{qpath}"
            if pools_ok and pool not in pools:
                ctx.error(qline, qpath, _unknown_ref("pool", pool, pools))
            quota = _parse_quota(ctx, qbody, qpath)
            if quota is None:
                continue
            if quota.per_user_cap_milli is not None and (
                quota.per_user_cap_milli > quota.guaranteed_milli + quota.borrow_limit_milli
            ):
                ctx.warn(qbody.key_lines.get("per_user_cap", qline), f"{qpath}.per_user_cap",
                         "larger than guaranteed + borrow_limit, so it never limits anyone")
            quotas.append((pool, quota))
            at.quota_lines[pool] = qline
        at.team = Team(name, groups, tuple(quotas), admins, allowed)
        teams[name] = at
    return teams


# ------------------------------------------------------------------------- profiles


@dataclass
class _Pools:
    """What profile checks need to know about each pool's hardware."""

    pools: dict[str, tuple[Pool, int]]
    nodes: dict[str, list[Node]]
    known: bool  # False when the inventory is left to discovery

    def gpus(self, pool: str, models: Sequence[str] = ()) -> list[GPU]:
        return [g for n in self.nodes.get(pool, ()) for g in n.gpus
                if not models or g.model in models]


def _parse_ask(ctx: _Ctx, f: _Fields, path: str, pool: Pool | None, hw: _Pools,
               models: Sequence[str]) -> GPUAsk | None:
    """The profile's ``gpu:`` field (absent or 0 -> CPU only)."""
    if not f.has("gpu"):
        return GPUAsk()
    raw = f.data["gpu"]
    gpath, line = f"{path}.gpu", f.line("gpu")
    if isinstance(raw, YMap):
        return _parse_ask_map(ctx, _Fields(ctx, raw, gpath, ("count", "fraction", "memory",
                                                              "compute")), pool, hw, models)
    if raw == 0 or raw in ("none", "0"):
        return GPUAsk()
    if isinstance(raw, int) and not isinstance(raw, bool) and raw > 0:
        return GPUAsk(whole=raw)
    try:
        return _fraction_ask(ctx, line, gpath, parse_fraction_milli(raw), None, None)
    except UnitError:
        ctx.error(line, gpath, f"got {_describe(raw)} (expected a number of GPUs, a fraction "
                  "such as 1/4, or a mapping with count, fraction, memory or compute)")
        return None


def _fraction_ask(ctx: _Ctx, line: int, path: str, fraction: int, memory: int | None,
                  compute: int | None) -> GPUAsk | None:
    if fraction > UNIT:
        ctx.error(line, path, f"fraction {format_units(fraction)} is more than one GPU "
                  "(expected at most 1; ask for count: N whole GPUs instead)")
        return None
    if fraction == UNIT and memory is None and compute is None:
        return GPUAsk(whole=1)
    return GPUAsk(fraction_milli=fraction, memory_mib=memory, compute_milli=compute)


def _parse_ask_map(ctx: _Ctx, g: _Fields, pool: Pool | None, hw: _Pools,
                   models: Sequence[str]) -> GPUAsk | None:
    path, line = g.path, g.data.line
    if g.has("count"):
        for other in ("fraction", "memory", "compute"):
            if g.has(other):
                ctx.error(g.key_line(other), _join(path, other),
                          "cannot be combined with count (whole GPUs get all memory and compute)")
        count = g.get("count", _positive(_int, "a whole number of GPUs"))
        return GPUAsk(whole=count) if count else None
    fraction = g.get("fraction", _positive(parse_fraction_milli, "a fraction"))
    memory = g.get("memory", _positive(parse_memory_mib, "a memory size"))
    compute = g.get("compute", _positive(parse_fraction_milli, "a fraction"))
    if compute is not None and compute > UNIT:
        ctx.error(g.line("compute"), _join(path, "compute"),
                  f"got {format_units(compute)} (expected a share of one GPU, at most 100%)")
        return None
    if fraction is None and memory is None and compute is None:
        if not any(g.has(k) for k in ("fraction", "memory", "compute")):
            ctx.error(line, path, "empty GPU request (expected count, fraction, memory or "
                      "compute; leave gpu out for a CPU-only profile)")
        return None
    if fraction is None:
        fraction = _implied_fraction(ctx, g, memory, compute, pool, hw, models)
        if fraction is None:
            return None
    return _fraction_ask(ctx, g.line("fraction") if g.has("fraction") else line, path,
                         fraction, memory, compute)


def _implied_fraction(ctx: _Ctx, g: _Fields, memory: int | None, compute: int | None,
                      pool: Pool | None, hw: _Pools, models: Sequence[str]) -> int | None:
    """Charge max(memory / smallest shareable GPU memory of the pool, compute)."""
    candidates = [compute or 0]
    if memory is not None and pool is not None:
        gpus = hw.gpus(pool.name, models)
        if gpus:
            smallest = min(int(gpu.memory_mib * (1.0 - pool.memory_headroom)) for gpu in gpus)
            candidates.append(-(-memory * UNIT // smallest))
        elif compute is None:
            ctx.error(g.data.line, g.path, f"cannot tell what share of a GPU {memory} MiB is: "
                      f"pool {pool.name} has no known GPUs (expected fraction as well)")
            return None
    if memory is not None and pool is None:
        return None
    return max(1, max(candidates))


def _check_fit(ctx: _Ctx, f: _Fields, path: str, ask: GPUAsk, pool: Pool, hw: _Pools,
               models: Sequence[str], cpu: int, memory: int) -> None:
    """Does the profile fit some node / GPU of its pool?"""
    line = f.line("gpu") if f.has("gpu") else f.data.line
    nodes = hw.nodes.get(pool.name, [])
    if not hw.known or not nodes:
        return
    if ask.is_fraction and pool.mode in (SharingMode.EXCLUSIVE, SharingMode.MIG):
        ctx.error(line, f"{path}.gpu", f"pool {pool.name} is {pool.mode.value}: it hands out "
                  f"whole devices only (expected count: N, got {ask.describe()})")
        return
    fitting = [n for n in nodes if n.cpu_milli >= cpu and n.memory_mib >= memory]
    if not fitting:
        biggest = max(nodes, key=lambda n: (n.cpu_milli, n.memory_mib))
        ctx.error(f.data.line, path, f"asks for {cpu / 1000:g} CPU and {format_mib(memory)} RAM; "
                  f"no node of pool {pool.name} has that much (largest: "
                  f"{biggest.cpu_milli / 1000:g} CPU, {format_mib(biggest.memory_mib)})")
        return
    if ask.whole:
        most = max(sum(1 for g in n.gpus if not models or g.model in models) for n in fitting)
        if ask.whole > most:
            ctx.error(line, f"{path}.gpu", f"asks for {ask.whole} GPUs but no node of pool "
                      f"{pool.name} has more than {most}" + (" of models " + ", ".join(models)
                                                               if models else ""))
    elif ask.is_fraction:
        gpus = [g for n in fitting for g in n.gpus if not models or g.model in models]
        room = [(g, int(g.memory_mib * (1.0 - pool.memory_headroom))) for g in gpus]
        if not any(ask.memory_on(g, cap) <= cap for g, cap in room):
            best = max(room, key=lambda r: r[1], default=None)
            where = (f"the largest leaves {format_mib(best[1])} after "
                     f"{pool.memory_headroom:.0%} headroom on a {format_mib(best[0].memory_mib)} "
                     f"{best[0].model}" if best else "it has no GPUs")
            need = format_mib(ask.memory_on(best[0], best[1])) if best else ask.describe()
            ctx.error(line, f"{path}.gpu", f"needs {need} of GPU memory, which fits no GPU of "
                      f"pool {pool.name}: {where} (expected a smaller fraction or memory)")


def _parse_profile(ctx: _Ctx, item: YMap, path: str, hw: _Pools,
                   priorities: dict[str, tuple[PriorityClass, int]], teams: dict[str, _TeamAt],
                   refs_ok: bool) -> Profile | None:
    keys = ("slug", "display_name", "description", "pool", "gpu", "cpu", "memory", "image",
            "priority", "priorities", "max_lifetime", "teams", "gpu_models")
    f = _Fields(ctx, item, path, keys)
    slug = f.get("slug", _str, required=True)
    if slug is not None and not _SLUG.match(slug):
        ctx.error(f.line("slug"), f"{path}.slug", f"got {slug!r} (expected lower-case letters, "
                  "digits and '-', such as train-1gpu)")
    display = f.get("display_name", _str, default=slug) or slug or ""
    cpu = f.get("cpu", _positive(parse_cpu_milli, "a CPU count"), default=1000) or 1000
    memory = f.get("memory", _positive(parse_memory_mib, "a memory size"), default=2048) or 2048
    lifetime = f.get("max_lifetime", _positive(parse_duration_s, "a duration"))
    allowed = f.get("teams", _str_list) or ()
    models = f.get("gpu_models", _str_list) or ()
    image = f.get("image", _str)
    description = f.get("description", _str, default="") or ""
    pool_name = f.get("pool", _str, required=f.has("gpu") and f.data["gpu"] not in (0, "none"))
    pool = _check_pool_ref(ctx, f, path, pool_name, hw, models, refs_ok)
    priority = _priority_ref(ctx, f, path, priorities, refs_ok)
    extra = _priority_list(ctx, f, path, priorities, refs_ok) or ()
    if refs_ok:
        for i, team in enumerate(allowed):
            if team not in teams:
                ctx.error(f.line("teams"), f"{path}.teams[{i}]", _unknown_ref("team", team, teams))
            elif pool is not None and teams[team].team.quota(pool.name) is None:
                ctx.warn(f.line("teams"), f"{path}.teams[{i}]", f"team {team} has no quota in "
                         f"pool {pool.name}, so its members cannot start this profile")
        if priority is not None:
            _check_team_priorities(ctx, f, path, priority, allowed, teams)
    ask = _parse_ask(ctx, f, path, pool, hw, models)
    if ask is None or slug is None or priority is None:
        return None
    if pool is not None and not ask.is_empty:
        _check_fit(ctx, f, path, ask, pool, hw, models, cpu, memory)
    return Profile(slug, display, pool_name or "", ask, priority, description, cpu, memory,
                   image, lifetime, allowed, models, extra)


def _check_team_priorities(ctx: _Ctx, f: _Fields, path: str, priority: str,
                           listed: Sequence[str], teams: dict[str, _TeamAt]) -> None:
    """A profile offered to a team that may not use the profile's own priority class:
    an error when the profile names the team, a warning when it is open to every team
    (the form then leaves it out for that team's members)."""
    where = f.line("priority") if f.has("priority") else f.data.line
    for i, team in enumerate(listed):
        at = teams.get(team)
        if at is not None and not at.team.may_use_priority(priority):
            ctx.error(where, f"{path}.teams[{i}]", f"team {team} may not use priority "
                      f"{priority}, the profile's own (team {team} may use: "
                      f"{', '.join(at.team.priorities or ()) or 'none'})")
    if listed:
        return
    for team, at in teams.items():
        if not at.team.may_use_priority(priority):
            ctx.warn(where, f"{path}.priority", f"team {team} may not use priority {priority}, "
                     "so this profile is not offered to its members (list the teams it is "
                     "for, or add the class to the team's priorities)")


def _check_pool_ref(ctx: _Ctx, f: _Fields, path: str, name: str | None, hw: _Pools,
                    models: Sequence[str], refs_ok: bool) -> Pool | None:
    if name is None:
        return None
    if name not in hw.pools:
        if refs_ok:
            ctx.error(f.line("pool"), f"{path}.pool", _unknown_ref("pool", name, hw.pools))
        return None
    pool = hw.pools[name][0]
    if models and hw.known and hw.nodes.get(name):
        present = {g.model for g in hw.gpus(name)}
        for i, model in enumerate(models):
            if model not in present:
                ctx.error(f.line("gpu_models"), f"{path}.gpu_models[{i}]",
                          _unknown_ref(f"GPU model in pool {name}:", model, present))
    return pool


def _priority_ref(ctx: _Ctx, f: _Fields, path: str,
                  priorities: dict[str, tuple[PriorityClass, int]], refs_ok: bool) -> str | None:
    if not f.has("priority"):
        if "interactive" in priorities:
            return "interactive"
        if refs_ok:
            ctx.error(f.data.line, f"{path}.priority", "required field is missing (there is no "
                      "priority class named interactive to default to)")
        return None
    name = f.get("priority", _str)
    if name is not None and name not in priorities:
        if refs_ok:
            ctx.error(f.line("priority"), f"{path}.priority",
                      _unknown_ref("priority class", name, priorities))
        return None
    return name


def _parse_profiles(ctx: _Ctx, root: _Fields, hw: _Pools,
                    priorities: dict[str, tuple[PriorityClass, int]], teams: dict[str, _TeamAt],
                    refs_ok: bool) -> list[Profile]:
    items = root.list("profiles")
    out: list[Profile] = []
    seen: dict[str, int] = {}
    for i, item in enumerate(items or ()):
        path, line = f"profiles[{i}]", items.item_lines[i] if items else 0
        body = _as_map(ctx, item, line, path)
        if body is None:
            continue
        profile = _parse_profile(ctx, body, path, hw, priorities, teams, refs_ok)
        slug = body.get("slug")
        if isinstance(slug, str) and slug in seen:
            ctx.error(body.value_lines.get("slug", line), f"{path}.slug",
                      f"duplicate slug {slug!r} (first at line {seen[slug]})")
        elif isinstance(slug, str):
            seen[slug] = body.value_lines.get("slug", line)
        if profile is not None:
            out.append(profile)
    if items is not None and not items:
        ctx.warn(items.line, "profiles", "no profiles: users will have nothing to start")
    return out


# --------------------------------------------------------------------- whole file


def _capacity(nodes: Iterable[Node]) -> int:
    return sum(g.units_milli for n in nodes for g in n.gpus)


def _check_pools_and_guarantees(ctx: _Ctx, hw: _Pools, teams: dict[str, _TeamAt]) -> None:
    if not hw.known:
        return
    for name, (_pool, line) in hw.pools.items():
        nodes = hw.nodes.get(name, [])
        capacity = _capacity(nodes)
        if not nodes:
            ctx.warn(line, f"pools.{name}", "no nodes in this pool: nothing can be granted here")
            continue
        guaranteed = sum(q.guaranteed_milli for t in teams.values() for p, q in t.team.quotas
                         if p == name)
        if capacity and guaranteed > capacity:
            over = (guaranteed - capacity) * 100 / capacity
            ctx.warn(line, f"pools.{name}", f"team guarantees ({format_units(guaranteed)} GPU) "
                     f"oversubscribe the pool's {format_units(capacity)} GPU by {over:.0f}%: "
                     "not every team can get its guarantee at once")


def _read_root(ctx: _Ctx, text: str) -> YMap | None:
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
        ctx.error(1, "", f"got {_describe(data)} at the top (expected a mapping with inventory, "
                  "pools, priority_classes, teams and profiles)")
        return None
    return data


def check_policy(text: str, filename: str = "<string>", discover: Discover | None = None
                 ) -> PolicyCheck:
    """Read a policy and report every problem; the policy is ``None`` if there are errors."""
    ctx = _Ctx(filename)
    data = _read_root(ctx, text)
    if data is None:
        return PolicyCheck(None, ctx.issues)
    top = ("inventory", "pools", "priority_classes", "teams", "default_team", "profiles")
    root = _Fields(ctx, data, "", top)
    pools = _parse_pools(ctx, root)
    pools_ok = root.has("pools") and not any(
        i.path.startswith("pools") and i.severity == "error" for i in ctx.issues)
    priorities = _parse_priorities(ctx, root)
    prio_ok = not any(i.path.startswith("priority_classes") and i.severity == "error"
                      for i in ctx.issues)
    source, node_ats, known = _parse_inventory(ctx, root, discover)
    _check_nodes(ctx, node_ats, pools, pools_ok)
    teams = _parse_teams(ctx, root, pools, pools_ok, priorities, prio_ok)
    teams_ok = not any(i.path.startswith("teams") and i.severity == "error" for i in ctx.issues)
    by_pool: dict[str, list[Node]] = {}
    for at in node_ats:
        by_pool.setdefault(at.node.pool, []).append(at.node)
    hw = _Pools(pools, by_pool, known)
    profiles = _parse_profiles(ctx, root, hw, priorities, teams, pools_ok and prio_ok and teams_ok)
    default_team = root.get("default_team", _str)
    if default_team is not None and teams_ok and default_team not in teams:
        ctx.error(root.line("default_team"), "default_team",
                  _unknown_ref("team", default_team, teams))
    if not teams and not root.has("teams"):
        ctx.warn(data.line, "teams", "no teams: nobody has a quota, so no GPU can be granted")
    _check_pools_and_guarantees(ctx, hw, teams)
    ctx.issues.sort(key=lambda i: (i.line, i.severity != "error"))
    if ctx.failed:
        return PolicyCheck(None, ctx.issues)
    policy = Policy(
        nodes=tuple(at.node for at in node_ats),
        pools=tuple(p for p, _ in pools.values()),
        priority_classes=tuple(p for p, _ in priorities.values()),
        teams=tuple(t.team for t in teams.values()),
        profiles=tuple(profiles),
        default_team=default_team,
        inventory_source=source,
    )
    return PolicyCheck(policy, ctx.issues)


def _finish(check: PolicyCheck) -> Policy:
    if check.policy is None:
        raise PolicyError(check.errors)
    for issue in check.warnings:
        log.warning("%s", issue)
    return check.policy


def parse_policy(text: str, filename: str = "<string>", discover: Discover | None = None
                 ) -> Policy:
    """Parse policy text; raises :class:`PolicyError` listing every error."""
    return _finish(check_policy(text, filename, discover))


def read_policy_text(path: str | Path) -> str:
    """The file's text; an unreadable file raises :class:`PolicyError` naming it."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PolicyError([PolicyIssue(str(path), 0, "", f"cannot read the file: {exc}")]
                          ) from exc


def check_policy_file(path: str | Path, discover: Discover | None = None) -> PolicyCheck:
    """:func:`check_policy` on a file; an unreadable file is one error."""
    try:
        text = read_policy_text(path)
    except PolicyError as exc:
        return PolicyCheck(None, exc.errors)
    return check_policy(text, str(path), discover)


def load_policy(path: str | Path, discover: Discover | None = None) -> Policy:
    """Load a policy file; raises :class:`PolicyError` listing every error.

    A discovered inventory (``source: nvml`` or ``kubernetes``) is read with
    :func:`jupyter_gpushare.discovery.discover` unless ``discover`` is given; a failed
    discovery is an error naming the file and line of ``inventory.source``.
    """
    if discover is None:
        from .discovery import discover as discover_at_run_time

        discover = discover_at_run_time
    return _finish(check_policy_file(path, discover))


# ------------------------------------------------------------------------ summary


def _pool_line(pool: Pool, nodes: list[Node]) -> str:
    mode = pool.mode.value
    if pool.shares_gpus:
        mode += f", {pool.memory_headroom:.0%} headroom"
    if not pool.queues:
        mode += ", no queue"
    models = sorted({f"{g.model} {format_mib(g.memory_mib)}" for n in nodes for g in n.gpus})
    count = sum(len(n.gpus) for n in nodes)
    capacity = _capacity(nodes)
    return (f"  {pool.name:<14} {mode:<32} {len(nodes):>3} node{'s' if len(nodes) != 1 else ' '} "
            f"{count:>4} GPU{'s' if count != 1 else ' '} = {format_units(capacity):>5} GPU units "
            f"({capacity} milli)"
            + (f"  [{', '.join(models)}]" if models else ""))


def _guarantee_lines(policy: Policy, pool: Pool) -> list[str]:
    capacity = _capacity(policy.nodes_in(pool.name))
    rows = [(t, q) for t in policy.teams if (q := t.quota(pool.name)) is not None]
    if not rows:
        return [f"  {pool.name}: no team has a quota here"]
    lines = [f"  {pool.name} (capacity {format_units(capacity)} GPU units)"]
    for team, q in rows:
        share = f"{q.guaranteed_milli * 100 / capacity:5.1f}%" if capacity else "    -"
        extra = [f"borrow <= {format_units(q.borrow_limit_milli)}"]
        if q.per_user_cap_milli is not None:
            extra.append(f"per user <= {format_units(q.per_user_cap_milli)}")
        if q.gpu_hours_per_month is not None:
            extra.append(f"budget {q.gpu_hours_per_month:g} GPU-h/month")
        if q.explicit_requests:
            extra.append("explicit requests")
        lines.append(f"    {team.name:<14} guaranteed {format_units(q.guaranteed_milli):>6} "
                     f"({share})  " + ", ".join(extra))
    total = sum(q.guaranteed_milli for _, q in rows)
    if capacity:
        pct = total * 100 / capacity
        verdict = (f"OVERSUBSCRIBED by {pct - 100:.0f}%" if total > capacity
                   else f"{100 - pct:.0f}% unguaranteed (free to borrow)")
        lines.append(f"    {'total':<14} guaranteed {format_units(total):>6} ({pct:5.1f}%)  "
                     + verdict)
    else:
        lines.append(f"    {'total':<14} guaranteed {format_units(total):>6}  (capacity unknown)")
    return lines


def _profile_line(p: Profile) -> str:
    bits = [p.gpu.describe()]
    if p.pool:
        bits.append(f"pool {p.pool}")
    priority = f"priority {p.priority}"
    if p.priorities:
        priority += " (or " + ", ".join(c for c in p.priority_choices[1:]) + ")"
    bits += [f"{p.cpu_milli / 1000:g} CPU", format_mib(p.memory_mib), priority]
    if p.max_lifetime_s:
        bits.append(f"max {format_duration(p.max_lifetime_s)}")
    return f"    {p.slug:<20} {p.display_name:<24} " + ", ".join(bits)


def summarize(policy: Policy) -> str:
    """A readable overview: capacity per pool, guarantees per team, profiles per team."""
    gpus = [g for n in policy.nodes for g in n.gpus]
    simulated = " (simulated)" if gpus and all(g.simulated for g in gpus) else ""
    lines = [f"Inventory: {policy.inventory_source}, {len(policy.nodes)} nodes, "
             f"{len(gpus)} GPUs{simulated}", "", "Pools (capacity)"]
    lines += [_pool_line(p, list(policy.nodes_in(p.name))) for p in policy.pools]
    lines += ["", "Priority classes"]
    for pc in sorted(policy.priority_classes, key=lambda c: -c.value):
        bits = [f"value {pc.value}", "preemptible" if pc.preemptible else "not preemptible",
                f"grace {format_duration(pc.grace_period_s)}"]
        if pc.checkpoint_required_after_s is not None:
            bits.append("checkpoint required after "
                        f"{format_duration(pc.checkpoint_required_after_s)}")
        lines.append(f"  {pc.name:<14} " + ", ".join(bits))
    lines += ["", "Guarantees per pool"]
    for pool in policy.pools:
        lines += _guarantee_lines(policy, pool)
    lines += ["", "Profiles per team"]
    for team in policy.teams:
        groups = ", ".join(team.groups)
        classes = "" if team.priorities is None else (
            "; priorities: " + (", ".join(team.priorities) or "none"))
        lines.append(f"  {team.name} (groups: {groups}{classes})")
        lines += [_profile_line(p) for p in policy.profiles_for({team.name})] or ["    (none)"]
    if policy.default_team:
        lines += ["", f"Users in no team's groups belong to team {policy.default_team}."]
    return "\n".join(lines)
