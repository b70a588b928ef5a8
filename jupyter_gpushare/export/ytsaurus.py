"""``jupyter-gpushare export ytsaurus POLICY``: the teams' GPU quotas as YTsaurus pools.

YTsaurus allocates whole GPUs, so only the policy's whole-GPU pools (``exclusive`` by
default) are exported. In one pool tree (``--pool-tree``, e.g. ``gpu_h200``) a parent pool
(``--parent``, default ``gpushare``) holds one pool per team:

* ``strong_guarantee_resources = {gpu = G}``: the team's guarantee, the sum over the exported
  pools of its ``guaranteed`` GPUs (whole GPUs, rounded down: a fractional guarantee in a
  whole-GPU pool cannot be given as such and is named in a comment);
* ``resource_limits = {gpu = G + B}``: guarantee plus borrow limit, capped at the GPUs the
  pools hold; what a team runs above its guarantee is YTsaurus's fair share, preempted when
  another team's guarantee needs it back (the policy's "borrowed capacity is preemptible");
* the parent gets the pools' whole GPUs as both guarantee and limit.

The text is a shell script of ``yt`` commands (``yt create scheduler_pool``, then ``yt set``
of each attribute so that rerunning it updates pools that exist), with the matching
``c.YTsaurusBackend`` settings in a comment. GPU-hour budgets and priority classes have no
YTsaurus pool equivalent here and are listed as comments.
"""

from __future__ import annotations

import argparse
import re
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..core.model import UNIT, Policy, SharingMode
from ..policy.issues import one_line
from ..policy.yamlread import show
from .command import Exporter, exporter

POOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,100}$")
"""What YTsaurus accepts as a pool name (its CheckPoolName)."""


def yt_pool_name(name: str) -> str:
    """``name`` if YTsaurus accepts it as a pool name, else ValueError."""
    if not POOL_NAME.match(name):
        raise ValueError(f"{show(name)} is not a YTsaurus pool name (expected 1 to 100 "
                         "letters, digits, '-' or '_')")
    return name


@dataclass(frozen=True)
class YtPool:
    """One YTsaurus scheduler pool to create."""

    name: str
    parent: str  # "" for a pool at the tree's root
    guarantee_gpu: int
    limit_gpu: int
    team: str = ""
    note: str = ""


def exported_pools(policy: Policy, names: Iterable[str] | None = None) -> tuple[str, ...]:
    """The gpushare pools exported: ``names`` (checked), else every exclusive pool."""
    if names:
        out = []
        for name in names:
            pool = policy.pool(name)
            if pool is None:
                raise ValueError(f"no pool {name!r} in the policy")
            if pool.mode is not SharingMode.EXCLUSIVE:
                raise ValueError(f"pool {name!r} is {pool.mode.value}: YTsaurus allocates "
                                 "whole GPUs only, export exclusive pools")
            out.append(name)
        return tuple(out)
    return tuple(p.name for p in policy.pools if p.mode is SharingMode.EXCLUSIVE)


def whole_gpus_in(policy: Policy, pools: Iterable[str]) -> int:
    chosen = set(pools)
    return sum(len(n.gpus) for n in policy.nodes if n.pool in chosen)


def export_ytsaurus(policy: Policy, *, parent: str = "gpushare",
                    team_pools: Mapping[str, str] | None = None,
                    pools: Iterable[str] | None = None) -> list[YtPool]:
    """The pools for ``policy`` (see the module docstring); the parent first."""
    chosen = exported_pools(policy, pools)
    capacity = whole_gpus_in(policy, chosen)
    mapping = dict(team_pools or {})
    out = [YtPool(yt_pool_name(parent), "", capacity, capacity,
                  note=f"whole GPUs of {', '.join(chosen) or 'no pool'}")]
    for team in policy.teams:
        guaranteed = borrow = 0
        for name in chosen:
            quota = team.quota(name)
            if quota is not None:
                guaranteed += quota.guaranteed_milli
                borrow += quota.borrow_limit_milli
        if guaranteed == 0 and borrow == 0:
            continue
        whole = guaranteed // UNIT
        note = "" if whole * UNIT == guaranteed else (
            f"guarantee {guaranteed / UNIT:g} GPU rounded down to {whole}")
        limit = min(capacity, (guaranteed + borrow) // UNIT)
        out.append(YtPool(yt_pool_name(mapping.get(team.name) or team.name), parent, whole,
                          max(whole, limit),
                          team=team.name, note=note))
    return out


def _yson(value: Any) -> str:
    import yt.yson

    return yt.yson.dumps(value, yson_format="text").decode()


def pool_path(tree: str, pool: YtPool) -> str:
    parts = [p for p in (pool.parent, pool.name) if p]
    return f"//sys/pool_trees/{tree}/" + "/".join(parts)


def render(policy: Policy, pools: list[YtPool], tree: str,
           exported: Iterable[str] | None = None) -> str:
    """The shell script of ``yt`` commands for ``pools`` in pool tree ``tree`` (``exported``:
    the gpushare pools they stand for, default every exclusive pool)."""
    chosen = set(exported_pools(policy, exported))
    lines = [
        "#!/bin/sh",
        "# jupyter-gpushare export ytsaurus: the policy's whole-GPU quotas as YTsaurus pools",
        f"# pool tree: {tree}; run with YT_PROXY and an admin's YT_TOKEN set",
        "set -e",
    ]
    for pool in pools:
        attrs: dict[str, Any] = {"pool_tree": tree, "name": pool.name}
        if pool.parent:
            attrs["parent_name"] = pool.parent
        lines.append("")
        lines.append(f"# {pool.name}: " + (f"team {pool.team}" if pool.team else "parent")
                     + (f" ({pool.note})" if pool.note else ""))
        lines.append("yt create scheduler_pool --ignore-existing --attributes "
                     + shlex.quote(_yson(attrs)))
        path = pool_path(tree, pool)
        for attr, value in (("strong_guarantee_resources", {"gpu": pool.guarantee_gpu}),
                            ("resource_limits", {"gpu": pool.limit_gpu})):
            lines.append(f"yt set {shlex.quote(path + '/@' + attr)} {shlex.quote(_yson(value))}")
    teams = {p.team: p.name for p in pools if p.team}
    lines += ["", "# jupyterhub_config.py / the broker's config:",
              "# c.JobManager.backend_class = "
              "'jupyter_gpushare.backends.ytsaurus.YTsaurusBackend'",
              f"# c.YTsaurusBackend.pool_trees = [{tree!r}]",
              f"# c.YTsaurusBackend.pools = {teams!r}"]
    budgets = [(t.name, name, q.gpu_hours_per_month) for t in policy.teams
               for name, q in t.quotas if q.gpu_hours_per_month and name in chosen]
    if budgets:
        lines.append("# not exported (no YTsaurus pool equivalent; the broker enforces them):")
        lines += [f"#   team {t} pool {p}: {h:g} GPU-hours a month" for t, p, h in budgets]
    # commands quote every word (shlex.quote, YSON); comments stay one line each
    return "\n".join(one_line(line) for line in lines) + "\n"


def _pairs(values: list[str] | None) -> dict[str, str]:
    out = {}
    for item in values or []:
        team, sep, pool = item.partition("=")
        if not sep or not team or not pool:
            raise SystemExit(f"--team-pool wants TEAM=POOL, not {item!r}")
        out[team] = pool
    return out


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pool-tree", default="gpu",
                        help="the YTsaurus pool tree of the GPU nodes (default gpu)")
    parser.add_argument("--parent", default="gpushare",
                        help="the parent pool of the team pools (default gpushare)")
    parser.add_argument("--pool", action="append", dest="pools", metavar="POOL",
                        help="a whole-GPU pool of the policy to export (repeatable; default "
                             "every exclusive pool)")
    parser.add_argument("--team-pool", action="append", metavar="TEAM=POOL",
                        help="the YTsaurus pool of a team (default the team's name)")


def _render(policy: Any, args: argparse.Namespace) -> str:
    try:
        pools = export_ytsaurus(policy, parent=args.parent, team_pools=_pairs(args.team_pool),
                                pools=args.pools)
    except ValueError as exc:
        raise SystemExit(f"jupyter-gpushare export ytsaurus: {exc}") from None
    return render(policy, pools, args.pool_tree, args.pools)


exporter(Exporter(
    "ytsaurus",
    "YTsaurus: a scheduler pool per team with strong_guarantee_resources and "
    "resource_limits in GPUs (whole-GPU pools), as yt commands",
    _arguments,
    _render,
))
