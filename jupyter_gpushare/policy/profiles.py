"""Reading the profiles section: GPU asks, references, fit on the pool's hardware."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..core.model import GPU, UNIT, GPUAsk, Node, Pool, Profile, SharingMode
from ..policy_units import UnitError, format_mib, format_units, parse_fraction_milli
from .bounds import MAX_GPUS_PER_NODE
from .fields import Fields, as_map, join, unknown_ref
from .issues import Collector
from .schema import GPU_ASK, PROFILE
from .sections import Declared, TeamAt, priority_list
from .yamlread import YMap, describe


@dataclass
class Pools:
    """What profile checks need to know about each pool's hardware."""

    pools: dict[str, Pool]
    nodes: dict[str, list[Node]]
    known: bool  # False when the inventory is left to discovery

    def gpus(self, pool: str, models: Sequence[str] = ()) -> list[GPU]:
        return [g for n in self.nodes.get(pool, ()) for g in n.gpus
                if not models or g.model in models]


def _parse_ask(ctx: Collector, f: Fields, path: str, pool: Pool | None, hw: Pools,
               models: Sequence[str]) -> GPUAsk | None:
    """The profile's ``gpu:`` field (absent or 0 -> CPU only)."""
    if not f.has("gpu"):
        return GPUAsk()
    raw = f.data["gpu"]
    gpath, line = f"{path}.gpu", f.line("gpu")
    if isinstance(raw, YMap):
        return _parse_ask_map(ctx, Fields(ctx, raw, gpath, GPU_ASK), pool, hw, models)
    if raw == 0 or raw in ("none", "0"):
        return GPUAsk()
    if isinstance(raw, int) and not isinstance(raw, bool) and raw > 0:
        if raw > MAX_GPUS_PER_NODE:
            ctx.error(line, gpath, f"{describe(raw)} is out of range 1..{MAX_GPUS_PER_NODE} "
                      "(GPUs)")
            return None
        return GPUAsk(whole=raw)
    try:
        return _fraction_ask(ctx, line, gpath, parse_fraction_milli(raw), None, None)
    except UnitError:
        ctx.error(line, gpath, f"got {describe(raw)} (expected a number of GPUs, a fraction "
                  "such as 1/4, or a mapping with count, fraction, memory or compute)")
        return None


def _fraction_ask(ctx: Collector, line: int, path: str, fraction: int, memory: int | None,
                  compute: int | None) -> GPUAsk | None:
    if fraction > UNIT:
        ctx.error(line, path, f"fraction {format_units(fraction)} is more than one GPU "
                  "(expected at most 1; ask for count: N whole GPUs instead)")
        return None
    if fraction == UNIT and memory is None and compute is None:
        return GPUAsk(whole=1)
    return GPUAsk(fraction_milli=fraction, memory_mib=memory, compute_milli=compute)


def _parse_ask_map(ctx: Collector, g: Fields, pool: Pool | None, hw: Pools,
                   models: Sequence[str]) -> GPUAsk | None:
    path, line = g.path, g.data.line
    if g.has("count"):
        for other in ("fraction", "memory", "compute"):
            if g.has(other):
                ctx.error(g.key_line(other), join(path, other),
                          "cannot be combined with count (whole GPUs get all memory and compute)")
        count = g.get("count")
        return GPUAsk(whole=count) if count else None
    fraction = g.get("fraction")
    memory = g.get("memory")
    compute = g.get("compute")
    if compute is not None and compute > UNIT:
        ctx.error(g.line("compute"), join(path, "compute"),
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


def _implied_fraction(ctx: Collector, g: Fields, memory: int | None, compute: int | None,
                      pool: Pool | None, hw: Pools, models: Sequence[str]) -> int | None:
    """Charge max(memory / smallest shareable GPU memory of the pool, compute)."""
    candidates = [compute or 0]
    if memory is not None and pool is not None:
        gpus = hw.gpus(pool.name, models)
        if gpus:
            smallest = min(max(1, int(gpu.memory_mib * (1.0 - pool.memory_headroom)))
                           for gpu in gpus)
            candidates.append(-(-memory * UNIT // smallest))
        elif compute is None:
            ctx.error(g.data.line, g.path, f"cannot tell what share of a GPU {memory} MiB is: "
                      f"pool {pool.name} has no known GPUs (expected fraction as well)")
            return None
    if memory is not None and pool is None:
        return None
    return max(1, max(candidates))


def _check_fit(ctx: Collector, f: Fields, path: str, ask: GPUAsk, pool: Pool, hw: Pools,
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


def _parse_profile(ctx: Collector, item: YMap, path: str, hw: Pools, names: Declared,
                   teams: dict[str, TeamAt]) -> Profile | None:
    f = Fields(ctx, item, path, PROFILE)
    slug = f.get("slug")
    display = f.get("display_name", default=slug) or slug or ""
    cpu = f.get("cpu", default=1000) or 1000
    memory = f.get("memory", default=2048) or 2048
    lifetime = f.get("max_lifetime")
    allowed = f.get("teams") or ()
    models = f.get("gpu_models") or ()
    image = f.get("image")
    description = f.get("description", default="") or ""
    pool_name = f.get("pool", required=f.has("gpu") and f.data["gpu"] not in (0, "none"))
    pool = _check_pool_ref(ctx, f, path, pool_name, hw, models, names)
    priority = _priority_ref(ctx, f, path, names)
    extra = priority_list(ctx, f, path, names.priorities) or ()
    for i, team in enumerate(allowed):
        if names.teams is not None and team not in names.teams:
            ctx.error(f.line("teams"), f"{path}.teams[{i}]",
                      unknown_ref("team", team, names.teams))
        elif pool is not None and team in teams and teams[team].team.quota(pool.name) is None:
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
                   image, lifetime, allowed, models, extra,
                   kubespawner_override=f.get("kubespawner_override") or ())


def _check_team_priorities(ctx: Collector, f: Fields, path: str, priority: str,
                           listed: Sequence[str], teams: dict[str, TeamAt]) -> None:
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


def _check_pool_ref(ctx: Collector, f: Fields, path: str, name: str | None, hw: Pools,
                    models: Sequence[str], names: Declared) -> Pool | None:
    if name is None:
        return None
    if name not in hw.pools:
        if names.pools is not None and name not in names.pools:
            ctx.error(f.line("pool"), f"{path}.pool", unknown_ref("pool", name, names.pools))
        return None
    pool = hw.pools[name]
    if models and hw.known and hw.nodes.get(name):
        present = {g.model for g in hw.gpus(name)}
        for i, model in enumerate(models):
            if model not in present:
                ctx.error(f.line("gpu_models"), f"{path}.gpu_models[{i}]",
                          unknown_ref(f"GPU model in pool {name}:", model, present))
    return pool


def _priority_ref(ctx: Collector, f: Fields, path: str, names: Declared) -> str | None:
    classes = names.priorities
    if not f.has("priority"):
        if classes is None or "interactive" in classes:
            return "interactive"
        ctx.error(f.data.line, f"{path}.priority", "required field is missing (there is no "
                  "priority class named interactive to default to)")
        return None
    name: str | None = f.get("priority")
    if name is not None and classes is not None and name not in classes:
        ctx.error(f.line("priority"), f"{path}.priority",
                  unknown_ref("priority class", name, classes))
        return None
    return name


def parse_profiles(ctx: Collector, root: Fields, hw: Pools, names: Declared,
                   teams: dict[str, TeamAt]) -> list[Profile]:
    items = root.list("profiles")
    out: list[Profile] = []
    seen: dict[str, int] = {}
    for i, item in enumerate(items or ()):
        path, line = f"profiles[{i}]", items.item_lines[i] if items else 0
        body = as_map(ctx, item, line, path)
        if body is None:
            continue
        profile = _parse_profile(ctx, body, path, hw, names, teams)
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
