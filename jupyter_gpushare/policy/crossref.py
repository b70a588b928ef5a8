"""Checks across sections that are not references at one place: capacity and guarantees."""

from __future__ import annotations

from collections.abc import Iterable

from ..core.model import Node, Pool
from ..policy_units import format_units
from .fields import Fields, unknown_ref
from .issues import Collector
from .profiles import Pools
from .sections import Declared, TeamAt


def capacity(nodes: Iterable[Node]) -> int:
    """GPU units (milli) of ``nodes``."""
    return sum(g.units_milli for n in nodes for g in n.gpus)


def check_pools_and_guarantees(ctx: Collector, hw: Pools, lines: dict[str, int],
                               teams: dict[str, TeamAt]) -> None:
    """Warn about pools with no nodes and guarantees that oversubscribe a pool."""
    if not hw.known:
        return
    for name in hw.pools:
        line = lines[name]
        nodes = hw.nodes.get(name, [])
        total = capacity(nodes)
        if not nodes:
            ctx.warn(line, f"pools.{name}", "no nodes in this pool: nothing can be granted here")
            continue
        guaranteed = sum(q.guaranteed_milli for t in teams.values() for p, q in t.team.quotas
                         if p == name)
        if total and guaranteed > total:
            over = (guaranteed - total) * 100 / total
            ctx.warn(line, f"pools.{name}", f"team guarantees ({format_units(guaranteed)} GPU) "
                     f"oversubscribe the pool's {format_units(total)} GPU by {over:.0f}%: "
                     "not every team can get its guarantee at once")


def check_default_team(ctx: Collector, root: Fields, names: Declared) -> str | None:
    """``default_team`` names a declared team."""
    default_team: str | None = root.get("default_team")
    if default_team is not None and names.teams is not None and default_team not in names.teams:
        ctx.error(root.line("default_team"), "default_team",
                  unknown_ref("team", default_team, names.teams))
    return default_team


def pool_table(pools: dict[str, tuple[Pool, int]]) -> tuple[dict[str, Pool], dict[str, int]]:
    """Parsed pools by name, and the line of each."""
    return ({n: p for n, (p, _) in pools.items()}, {n: line for n, (_, line) in pools.items()})
