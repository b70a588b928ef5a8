"""The readable overview that ``check-policy`` prints."""

from __future__ import annotations

from ..core.model import Node, Policy, Pool, Profile
from ..policy_units import format_duration, format_mib, format_units
from .crossref import capacity as _capacity


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
