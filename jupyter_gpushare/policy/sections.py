"""Reading the pools, priority_classes, teams and slurm sections."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..core.model import Pool, PoolQuota, PriorityClass, SharingMode, SlurmOptions, Team
from .fields import Fields, join, unknown_ref
from .issues import Collector
from .schema import SLURM
from .yamlread import YMap


@dataclass
class Declared:
    """Names declared in each section, valid or not: references are checked against these,
    so one broken entry is reported once and not again at every place that names it.
    ``None``: the section is missing or not a mapping (references to it are not checked)."""

    pools: set[str] | None
    priorities: set[str] | None
    teams: set[str] | None


def declared(root: Fields) -> Declared:
    """The names under pools, priority_classes and teams (see :class:`Declared`)."""
    def names(key: str) -> set[str] | None:
        return root.names(key) if isinstance(root.data.get(key), YMap) else None

    return Declared(names("pools"), names("priority_classes"), names("teams"))


def parse_pools(ctx: Collector, root: Fields) -> dict[str, tuple[Pool, int]]:
    pools: dict[str, tuple[Pool, int]] = {}
    if not root.has("pools"):
        root.missing("pools")
    for name, f, line, path in root.entries("pools"):
        mode = f.get("mode")
        headroom = f.get("memory_headroom", default=0.2)
        if mode in ("exclusive", "mig") and f.has("memory_headroom"):
            ctx.warn(f.key_line("memory_headroom"), join(path, "memory_headroom"),
                     f"ignored: a {mode} pool hands out whole devices")
        description = f.get("description", default="")
        if mode is not None:
            pools[name] = (Pool(name, SharingMode(mode), headroom or 0.0, description or ""), line)
    return pools


def parse_priorities(ctx: Collector, root: Fields) -> dict[str, tuple[PriorityClass, int]]:
    out: dict[str, tuple[PriorityClass, int]] = {}
    if not root.has("priority_classes"):
        root.missing("priority_classes")
    for name, f, line, path in root.entries("priority_classes"):
        value = f.get("value")
        preemptible = f.get("preemptible", default=False)
        grace = f.get("grace_period", default=30)
        checkpoint = f.get("checkpoint_required_after")
        if checkpoint is not None and not preemptible:
            ctx.warn(f.key_line("checkpoint_required_after"),
                     join(path, "checkpoint_required_after"),
                     "only preemptible work is ever stopped; set preemptible: true or drop this")
        if value is not None:
            out[name] = (
                PriorityClass(name, value, bool(preemptible), grace or 0, checkpoint,
                              f.get("description", default="") or ""),
                line,
            )
    return out


def priority_list(ctx: Collector, f: Fields, path: str, classes: set[str] | None
                  ) -> tuple[str, ...] | None:
    """The ``priorities:`` list of a team or profile (``None`` when absent); classes not
    declared under priority_classes are errors."""
    names: tuple[str, ...] | None = f.get("priorities")
    for i, name in enumerate(names or ()):
        if classes is not None and name not in classes:
            ctx.error(f.line("priorities"), f"{path}.priorities[{i}]",
                      unknown_ref("priority class", name, classes))
    return names


@dataclass
class TeamAt:
    """A parsed team and where it was written."""

    team: Team
    line: int
    quota_lines: dict[str, int] = field(default_factory=dict)


def _parse_quota(ctx: Collector, f: Fields) -> PoolQuota | None:
    guaranteed = f.get("guaranteed")
    borrow = f.get("borrow_limit", default=0)
    hours = f.get("gpu_hours_per_month")
    cap = f.get("per_user_cap")
    explicit = f.get("explicit_requests", default=False)
    if guaranteed is None or borrow is None:
        return None
    return PoolQuota(guaranteed, borrow, hours, cap, bool(explicit))


def parse_teams(ctx: Collector, root: Fields, names: Declared) -> dict[str, TeamAt]:
    teams: dict[str, TeamAt] = {}
    for name, f, line, path in root.entries("teams"):
        groups = f.get("groups") or (name,)
        admins = f.get("admins") or ()
        allowed = priority_list(ctx, f, path, names.priorities)
        quotas: list[tuple[str, PoolQuota]] = []
        at = TeamAt(Team(name, groups, (), admins, allowed), line)
        for pool, q, qline, qpath in f.entries("quotas"):
            if names.pools is not None and pool not in names.pools:
                ctx.error(qline, qpath, unknown_ref("pool", pool, names.pools))
            quota = _parse_quota(ctx, q)
            if quota is None:
                continue
            if quota.per_user_cap_milli is not None and (
                quota.per_user_cap_milli > quota.guaranteed_milli + quota.borrow_limit_milli
            ):
                ctx.warn(q.key_line("per_user_cap"), f"{qpath}.per_user_cap",
                         "larger than guaranteed + borrow_limit, so it never limits anyone")
            quotas.append((pool, quota))
            at.quota_lines[pool] = qline
        at.team = Team(name, groups, tuple(quotas), admins, allowed)
        teams[name] = at
    return teams


def parse_slurm(ctx: Collector, root: Fields) -> SlurmOptions:
    """The optional ``slurm:`` section (defaults where it or a key is absent)."""
    body = root.map("slurm", required=False)
    if body is None:
        return SlurmOptions()
    f = Fields(ctx, body, "slurm", SLURM)
    shards = f.get("shards_per_gpu", default=SlurmOptions.shards_per_gpu)
    return SlurmOptions(shards_per_gpu=shards, partition=f.get("partition"))
