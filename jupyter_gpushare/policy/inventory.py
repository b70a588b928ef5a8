"""Reading the inventory section: static, simulated or discovered nodes."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ..core.model import GPU, UNIT, Node
from .bounds import MAX_DEVICES, MAX_NODES
from .fields import Fields, as_map, join, unknown_ref
from .issues import Collector
from .schema import DISCOVERED_SOURCES, GPUS, NODE, SIMULATED
from .yamlread import YList, YMap, describe


@dataclass(frozen=True)
class DiscoverySpec:
    """What an adapter needs to discover an inventory (``inventory.discovery`` verbatim)."""

    source: str  # "nvml" or "kubernetes"
    options: dict[str, Any]
    file: str = "<string>"
    line: int = 0


Discover = Callable[[DiscoverySpec], Iterable[Node]]


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
class NodeAt:
    """A parsed node and where it was written."""

    node: Node
    line: int
    path: str
    pool_line: int


def _parse_gpus(ctx: Collector, f: Fields, path: str, node_name: str, simulated: bool
                ) -> tuple[GPU, ...]:
    gpus: list[GPU] = []
    items = f.list("gpus") if f.has("gpus") else None
    for i, item in enumerate(items or ()):
        ipath = f"{path}.gpus[{i}]"
        body = as_map(ctx, item, items.item_lines[i] if items else 0, ipath)
        if body is None:
            continue
        g = Fields(ctx, body, ipath, GPUS)
        model = g.get("model")
        memory = g.get("memory")
        count = g.get("count", default=1) or 1
        units = g.get("units", default=UNIT)
        if units is not None and units > UNIT:
            ctx.error(g.line("units"), join(ipath, "units"),
                      "a device cannot be more than one GPU (expected a fraction up to 1)")
        vendor = g.get("vendor") or ""
        uuids = g.get("uuids") or ()
        if uuids and len(uuids) != count:
            ctx.error(g.line("uuids"), join(ipath, "uuids"),
                      f"got {len(uuids)} uuids (expected one per GPU: {count})")
            uuids = ()
        if model is None or memory is None:
            continue
        for k in range(count):
            index = len(gpus)
            default = f"GPU-sim-{node_name}-{index}" if simulated else f"GPU-{node_name}-{index}"
            uuid = uuids[k] if uuids else default
            gpus.append(GPU(uuid, model, memory, index, min(units or UNIT, UNIT), simulated,
                            vendor))
    return tuple(gpus)


def _parse_node_list(ctx: Collector, inv: Fields, simulated: bool) -> list[NodeAt]:
    out: list[NodeAt] = []
    items = inv.list("nodes")
    for i, item in enumerate(items or ()):
        path = f"inventory.nodes[{i}]"
        line = items.item_lines[i] if items else 0
        body = as_map(ctx, item, line, path)
        if body is None:
            continue
        f = Fields(ctx, body, path, NODE)
        name = f.get("name")
        pool = f.get("pool")
        cpu = f.get("cpu")
        memory = f.get("memory")
        labels = f.get("labels") or ()
        gpus = _parse_gpus(ctx, f, path, name or f"node{i}", simulated)
        if None in (name, pool, cpu, memory):
            continue
        node = Node(name, pool, gpus, cpu, memory, labels)
        out.append(NodeAt(node, body.line, path, f.line("pool")))
    return out


def _parse_simulated(ctx: Collector, inv: Fields) -> list[NodeAt]:
    raw = inv.data.get("simulated")
    line = inv.line("simulated")
    groups: list[tuple[Any, int, str]]
    if isinstance(raw, YMap):
        groups = [(raw, line, "inventory.simulated")]
    elif isinstance(raw, YList):
        groups = [(g, raw.item_lines[i], f"inventory.simulated[{i}]") for i, g in enumerate(raw)]
    else:
        ctx.error(line, "inventory.simulated",
                  f"got {describe(raw)} (expected a mapping or a list of mappings)")
        return []
    out: list[NodeAt] = []
    for item, item_line, path in groups:
        body = as_map(ctx, item, item_line, path)
        if body is None:
            continue
        f = Fields(ctx, body, path, SIMULATED)
        pool = f.get("pool")
        count = f.get("nodes", default=1)
        per_node = f.get("gpus_per_node", default=8)
        model = f.get("model", default="Simulated GPU")
        gmem = f.get("gpu_memory", default=81920)
        cpu = f.get("cpu", default=32000)
        mem = f.get("memory", default=262144)
        prefix = f.get("name")
        labels = f.get("labels") or ()
        if per_node is not None and per_node < 0:
            ctx.error(f.line("gpus_per_node"), join(path, "gpus_per_node"),
                      f"got {per_node} (expected a whole number >= 0)")
            continue
        if None in (pool, count, per_node, model, gmem, cpu, mem):
            continue
        if count * per_node > MAX_DEVICES:  # checked before building a single node
            ctx.error(body.line, path, f"{count} nodes x {per_node} GPUs = "
                      f"{count * per_node:,} GPUs is out of range 0..{MAX_DEVICES:,} (GPUs)")
            continue
        nodes = simulated_nodes(pool, count, per_node, model, gmem, cpu, mem, prefix, labels)
        out.extend(NodeAt(n, body.line, path, f.line("pool")) for n in nodes)
    return out


def parse_inventory(ctx: Collector, root: Fields, discover: Discover | None
                    ) -> tuple[str, list[NodeAt], bool]:
    """Nodes, the source, and whether the inventory is known (not left to discovery)."""
    inv_map = root.map("inventory")
    if inv_map is None:
        return "static", [], False
    inv = Fields(ctx, inv_map, "inventory", root.section.key("inventory").shape)  # type: ignore
    default = "simulated" if inv.has("simulated") and not inv.has("nodes") else "static"
    source = inv.get("source", default=default) or default
    if source in DISCOVERED_SOURCES:
        found = _discover(ctx, inv, source, discover)
        _check_size(ctx, inv_map, found)
        return source, found, discover is not None
    if inv.has("discovery"):
        ctx.error(inv.key_line("discovery"), "inventory.discovery",
                  f"only used with source nvml or kubernetes (source is {source})")
    if inv.has("simulated") and source != "simulated":
        ctx.error(inv.key_line("simulated"), "inventory.simulated",
                  f"only used with source: simulated (source is {source})")
    nodes = _parse_node_list(ctx, inv, simulated=source == "simulated")
    if source == "simulated" and inv.has("simulated"):
        nodes += _parse_simulated(ctx, inv)
    _check_size(ctx, inv_map, nodes)
    if not inv.has("nodes") and not inv.has("simulated"):
        what = "nodes or simulated" if source == "simulated" else "nodes"
        ctx.error(inv_map.line, "inventory", f"no nodes declared (expected {what})")
    return source, nodes, True


def _check_size(ctx: Collector, inv: YMap, nodes: list[NodeAt]) -> None:
    """At most :data:`MAX_NODES` nodes and :data:`MAX_DEVICES` GPUs in all."""
    devices = sum(len(at.node.gpus) for at in nodes)
    if len(nodes) > MAX_NODES:
        ctx.error(inv.line, "inventory", f"{len(nodes):,} nodes is out of range "
                  f"0..{MAX_NODES:,} (nodes)")
    if devices > MAX_DEVICES:
        ctx.error(inv.line, "inventory", f"{devices:,} GPUs is out of range "
                  f"0..{MAX_DEVICES:,} (GPUs)")


def _discover(ctx: Collector, inv: Fields, source: str, discover: Discover | None
              ) -> list[NodeAt]:
    for key in ("nodes", "simulated"):
        if inv.has(key):
            ctx.error(inv.key_line(key), join("inventory", key),
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
    return [NodeAt(n, line, "inventory.source", line) for n in nodes]


def check_nodes(ctx: Collector, nodes: list[NodeAt], pools: set[str] | None) -> None:
    """Node names and GPU uuids are unique; every node's pool is declared."""
    seen: dict[str, int] = {}
    uuids: dict[str, int] = {}
    for at in nodes:
        node = at.node
        if node.name in seen:
            ctx.error(at.line, f"{at.path}.name",
                      f"duplicate node name {node.name!r} (first at line {seen[node.name]})")
        seen.setdefault(node.name, at.line)
        if pools is not None and node.pool not in pools:
            ctx.error(at.pool_line, f"{at.path}.pool", unknown_ref("pool", node.pool, pools))
        for gpu in node.gpus:
            if gpu.uuid in uuids:
                ctx.error(at.line, f"{at.path}.gpus",
                          f"duplicate GPU uuid {gpu.uuid!r} (first at line {uuids[gpu.uuid]})")
            uuids.setdefault(gpu.uuid, at.line)

