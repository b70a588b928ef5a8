"""A new policy put in force for the live grants, the queue and new requests.

:func:`replace_policy` is what ``BrokerApp``'s reload (:mod:`..ops.reload`) does through
``Broker.replace_policy``; ``docs/policy-reload.md`` describes what happens to each grant.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import defaultdict
from typing import Any

from ...core.grant_end import EndKind, GrantEnd
from ...core.model import Grant, Policy, from_milli
from ...core.state import CapacityError, ClusterState
from ..store.db import grants_table
from ..store.serial import gpu_index, iso
from . import lifecycle
from .parts import BrokerParts

log = logging.getLogger("gpushare.broker")


def replace_policy(b: BrokerParts, policy: Policy, version: str = "") -> list[dict[str, Any]]:
    """Put ``policy`` in force for the live grants, the queue and new requests; return
    what happened to each grant it no longer allows (see ``docs/policy-reload.md``):

    * a grant on hardware (node, GPU) or in a pool that left the inventory, or that no
      longer fits it: released, with the reason;
    * a grant whose team, team quota in the pool, profile (or its team list) or priority
      class the policy no longer has: kept, but borrowed and preemptible, with a notice;
    * grants above a guarantee that was cut below the team's use: the newest ones are
      kept as borrowed and preemptible, with a notice, until the rest fits the guarantee.

    Borrow limits, per-user caps and budgets apply to new requests only. Runs on the
    event loop (no await); the database is written before memory changes."""
    now = b.clock()
    changes: list[dict[str, Any]] = []
    grants = sorted(b.state.grants.values(), key=lambda g: (g.granted_at, g.id))
    scratch = ClusterState(policy)
    kept: list[Grant] = []
    for grant in grants:
        try:
            scratch.apply(grant)
            kept.append(grant)
        except (CapacityError, KeyError, ValueError) as exc:
            why = f"released: the new policy has no room for it ({exc})"
            lost = grant.placement.node not in {n.name for n in policy.nodes}
            kind = EndKind.NODE_LOST if lost else EndKind.POLICY
            lifecycle.release(b, grant.id, why, drain=False, end=GrantEnd(kind, why))
            changes.append(_change(grant, "released", why))
    demote: dict[str, str] = {}
    for grant in kept:
        reason = _no_longer_allowed(policy, grant)
        if reason and not grant.borrowed:
            demote[grant.id] = reason
    inside: dict[tuple[str, str], list[Grant]] = defaultdict(list)
    for grant in kept:
        if not grant.borrowed and grant.id not in demote:
            inside[(grant.team, grant.pool)].append(grant)
    for (team_name, pool), members in inside.items():
        team = policy.team(team_name)
        quota = team.quota(pool) if team else None
        if quota is None:
            continue
        total = sum(g.units_milli for g in members)
        for grant in reversed(members):  # the newest become borrowed first
            if total <= quota.guaranteed_milli:
                break
            demote[grant.id] = (
                f"team {team_name}'s guarantee in pool {pool} is now "
                f"{from_milli(quota.guaranteed_milli):g} GPU, below its use"
            )
            total -= grant.units_milli
    if demote:
        with b.writes.engine.begin() as conn:
            conn.execute(
                grants_table.update()
                .where(grants_table.c.id.in_(list(demote)))
                .values(borrowed=True, preemptible=True)
            )
    state = ClusterState(policy)
    for name, node in b.state.nodes.items():
        if node.cordoned and name in state.nodes:
            state.cordon(name, True)
    for grant in kept:
        if grant.id in demote:
            grant = dataclasses.replace(grant, borrowed=True, preemptible=True)
        state.apply(grant)
    for victim, request_id in b.state.preempting.items():
        if victim in state.grants:
            state.preempting[victim] = request_id
    b.policy, b.state, b.gpus = policy, state, gpu_index(policy)
    b.policy_version = version
    b.queue.reorder()
    for gid, why in demote.items():
        grant = state.grants[gid]
        notice = {
            "grant_id": gid,
            "user": grant.user,
            "server": grant.request.holder,
            "kind": "policy",
            "holder_kind": grant.request.kind.value,
            "reason": f"{why}: the grant is now borrowed (preemptible) capacity",
            "deadline": None,
            "deadline_ts": None,
            "policy_version": version,
            "at": iso(now),
        }
        b.policy_notices[gid] = notice
        b.effects.notice(notice)
        changes.append(_change(grant, "borrowed", why))
    for gid in [g for g in b.policy_notices if g not in state.grants]:
        del b.policy_notices[gid]
    for line in changes:
        log.warning(
            "policy change: grant %s of %s %s: %s",
            line["grant_id"],
            line["user"],
            line["change"],
            line["reason"],
        )
    lifecycle.drain_queue(b)
    return changes


def _change(grant: Grant, change: str, reason: str) -> dict[str, Any]:
    return {
        "grant_id": grant.id,
        "user": grant.user,
        "server": grant.request.holder,
        "team": grant.team,
        "pool": grant.pool,
        "change": change,
        "reason": reason,
    }


def _no_longer_allowed(policy: Policy, grant: Grant) -> str | None:
    """Why the policy would not let this grant's request in now (team, profile, priority)."""
    req = grant.request
    team = policy.team(req.team)
    if team is None:
        return f"team {req.team} is no longer in the policy"
    if team.quota(req.pool) is None:
        return f"team {req.team} no longer has a quota in pool {req.pool}"
    if policy.priority(req.priority) is None or not team.may_use_priority(req.priority):
        return f"priority class {req.priority} is no longer allowed for team {req.team}"
    if req.profile:
        profile = policy.profile(req.profile)
        if profile is None:
            return f"profile {req.profile} is no longer in the policy"
        if not profile.allowed_for({req.team}):
            return f"profile {req.profile} is no longer offered to team {req.team}"
    return None
