"""Who may ask for what: the policy's rules on teams, profiles, explicit asks and priorities.

Pure functions of a :class:`~jupyter_gpushare.core.model.Policy` (standard library only,
no I/O). The broker calls :func:`check_request` for every new request (servers and jobs)
before admission; a refusal carries a machine-readable ``code``, the request ``field`` it
is about and a sentence a person can read.

The rules (issue 8, items 1-3):

* **Team.** A team named in the request must be one of the user's teams (admins may name
  any team) and, with a profile, one that the profile is offered to: on the profile's
  ``teams`` list (an empty list offers it to every team) and allowed to use the profile's
  own priority class.
* **Explicit asks.** A request without a profile (``{"pool": ..., "gpu": ...}``) is allowed
  only where the team's quota in that pool says ``explicit_requests: true``; admins always
  may.
* **Priority.** With a profile the classes allowed are the profile's own ``priority`` and
  its extra ``priorities``; without one, every class; in both cases only those in the
  team's ``priorities`` (absent: every class). This holds for admins too: the class is
  charged to the team.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .model import Policy, Profile

NOT_MEMBER = "not_member"
UNKNOWN_TEAM = "unknown_team"
PROFILE_NOT_FOR_TEAM = "profile_not_for_team"
EXPLICIT_NOT_ALLOWED = "explicit_not_allowed"
PRIORITY_NOT_ALLOWED = "priority_not_allowed"
UNKNOWN_PRIORITY = "unknown_priority"


@dataclass(frozen=True)
class RuleRefusal:
    """Why a request breaks the policy's rules: ``code`` (stable, for programs), the
    request ``field`` at fault (``team``, ``profile`` or ``priority``) and ``message``."""

    code: str
    field: str
    message: str


def _names(items: Iterable[str]) -> str:
    listed = ", ".join(items)
    return listed or "none"


def allowed_priorities(policy: Policy, team: str, profile: Profile | None) -> tuple[str, ...]:
    """Priority classes a member of ``team`` may use with ``profile`` (``None``: an explicit
    ask), the profile's default first; empty for a team the policy does not know."""
    return policy.allowed_priorities(team, profile)


def check_request(
    policy: Policy,
    *,
    user_teams: Iterable[str],
    team: str,
    profile: Profile | None,
    explicit_pool: str | None,
    priority: str,
    is_admin: bool,
) -> RuleRefusal | None:
    """``None`` if a request charged to ``team`` may go on to admission, else the refusal.

    ``user_teams`` are the teams of the user the request is for; ``profile`` is the profile
    asked for (``None`` for an explicit ask, whose pool is ``explicit_pool``); ``priority``
    is the class the request would run at (the profile's default where none was asked).
    """
    known = policy.team(team)
    if known is None:
        return RuleRefusal(UNKNOWN_TEAM, "team", f"there is no team {team!r} in the policy "
                           f"(teams: {_names(t.name for t in policy.teams)})")
    mine = tuple(user_teams)
    if team not in mine and not is_admin:
        return RuleRefusal(NOT_MEMBER, "team", f"you are not a member of team {team} "
                           f"(your teams: {_names(mine)})")
    if profile is not None:
        if not profile.allowed_for({team}):
            return RuleRefusal(PROFILE_NOT_FOR_TEAM, "team", f"profile {profile.slug} is only "
                               f"for teams {_names(profile.teams)}, not team {team}")
        if not known.may_use_priority(profile.priority):
            return RuleRefusal(PROFILE_NOT_FOR_TEAM, "team", f"profile {profile.slug} runs at "
                               f"priority {profile.priority}, which team {team} may not use "
                               f"(team {team} may use: {_names(known.priorities or ())})")
    elif not is_admin:
        pool = explicit_pool or ""
        quota = known.quota(pool)
        if quota is None:
            return RuleRefusal(EXPLICIT_NOT_ALLOWED, "profile", f"team {team} has no quota in "
                               f"pool {pool!r}, so it may not ask for GPUs there")
        if not quota.explicit_requests:
            return RuleRefusal(EXPLICIT_NOT_ALLOWED, "profile", f"team {team} may not send "
                               f"explicit GPU requests in pool {pool}: choose a profile "
                               f"(an admin may allow it with teams.{team}.quotas.{pool}."
                               "explicit_requests: true)")
    if policy.priority(priority) is None:
        return RuleRefusal(UNKNOWN_PRIORITY, "priority", f"there is no priority class "
                           f"{priority!r} (classes: "
                           f"{_names(c.name for c in policy.priority_classes)})")
    allowed = allowed_priorities(policy, team, profile)
    if priority not in allowed:
        what = f"profile {profile.slug}" if profile is not None else "an explicit GPU request"
        return RuleRefusal(PRIORITY_NOT_ALLOWED, "priority", f"priority {priority} is not "
                           f"allowed for team {team} with {what} (allowed: {_names(allowed)})")
    return None


def choose_team(
    policy: Policy,
    *,
    user_teams: Iterable[str],
    profile: Profile | None,
    explicit_pool: str | None,
    priority: str,
    is_admin: bool,
) -> tuple[str | None, RuleRefusal | None]:
    """The first of ``user_teams`` that passes :func:`check_request` and has a quota in the
    request's pool, for a request that names no team: ``(team, None)``; or ``(None,
    refusal)`` with the refusal of the first team that has a quota there (``(None, None)``
    when none has: the caller says "in no team that may use ...")."""
    pool = profile.pool if profile is not None else explicit_pool or ""
    mine = tuple(user_teams)
    first: RuleRefusal | None = None
    for team in mine:
        known = policy.team(team)
        if known is None or known.quota(pool) is None:
            continue
        refusal = check_request(policy, user_teams=mine, team=team, profile=profile,
                                explicit_pool=explicit_pool, priority=priority,
                                is_admin=is_admin)
        if refusal is None:
            return team, None
        first = first or refusal
    return None, first
