"""The spawn form and the rules for user options: pure functions, no I/O.

:func:`choices_for` lists the profiles a user's teams may use (from the policy), and
:func:`with_availability` adds what the broker says about each (what the team has left,
whether the profile would borrow and so be preemptible, the queue). :func:`render_form`
turns them into the HTML of JupyterHub's spawn form, and :func:`validate_options`
applies the same rules to options that come through the REST API.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any

from jupyter_gpushare.core.model import UNIT, Policy, Profile

__all__ = [
    "OptionsError",
    "ProfileChoice",
    "choices_for",
    "describe_card",
    "describe_share",
    "render_form",
    "validate_options",
    "with_availability",
]

ALLOWED_KEYS = frozenset({"profile"})
"""The only user option the form offers."""


class OptionsError(Exception):
    """User options that are not allowed; ``status`` is the HTTP status to answer with."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


@dataclass(frozen=True)
class ProfileChoice:
    """One profile as the spawn form shows it."""

    slug: str
    display_name: str
    description: str
    pool: str
    share: str  # "1/8 GPU (17.6 GiB, 12.5% compute)"
    units: float
    team: str = ""
    team_left: float | None = None  # guaranteed units the team has left in the pool
    borrow_left: float | None = None  # units it may still borrow
    would_borrow: bool | None = None
    preemptible: bool | None = None
    queue: int | None = None  # requests waiting in the pool
    expected_wait_s: float | None = None
    available: bool | None = None  # None: unknown (broker not asked)
    note: str = ""  # why not available, or anything else the broker says
    max_lifetime_s: int | None = None  # the server is stopped after this long
    user_cap: float | None = None  # GPU units one user may hold in the pool
    gpu_hours_left: float | None = None  # the team's GPU-hours left this month in the pool
    outcome: str = ""  # the broker's dry-run answer: granted | preempting | queued | refused
    card: str = ""  # which card(s): "MetaX C500", "NVIDIA H200" (vendor + model)


# --------------------------------------------------------------------------- choices


def _fraction_text(milli: int) -> str:
    frac = Fraction(milli, UNIT).limit_denominator(64)
    if frac == Fraction(milli, UNIT) and frac.denominator <= 16:
        return f"{frac.numerator}/{frac.denominator}" if frac.denominator != 1 else str(frac)
    return f"{milli / UNIT:g}"


def _gib(mib: int) -> str:
    return f"{mib / 1024:.3g} GiB"


def describe_share(profile: Profile, policy: Policy) -> str:
    """How much GPU a profile gives, in words a data scientist reads at a glance."""
    ask = profile.gpu
    if ask.is_empty:
        return "no GPU"
    if ask.whole:
        return f"{ask.whole} whole GPU" + ("s" if ask.whole > 1 else "")
    pool = policy.pool(profile.pool)
    headroom = pool.memory_headroom if pool is not None and pool.shares_gpus else 0.0
    gpus = [g for n in policy.nodes_in(profile.pool) for g in n.gpus]
    smallest = min(gpus, key=lambda g: g.memory_mib, default=None)
    memory = ask.memory_mib
    if memory is None and smallest is not None:
        memory = ask.memory_on(smallest, int(smallest.memory_mib * (1.0 - headroom)))
    compute = ask.compute_on() / 10
    parts = [f"{compute:g} % compute"]
    if memory:
        parts.insert(0, _gib(memory))
    if ask.memory_mib is not None:
        # stated by peak memory: the GiB and the compute share are what the user gets;
        # "0.142 GPU" (what it is charged) means nothing at a glance
        return ", ".join(parts)
    return f"{_fraction_text(ask.fraction_milli)} GPU ({', '.join(parts)})"


_VENDOR_NAMES = {"nvidia": "NVIDIA", "amd": "AMD", "metax": "MetaX"}


def describe_card(profile: Profile, policy: Policy) -> str:
    """The card(s) a profile lands on, vendor and model: "MetaX C500" ("" for no GPU)."""
    if profile.gpu.is_empty or not profile.pool:
        return ""
    names = []
    for g in (g for n in policy.nodes_in(profile.pool) for g in n.gpus):
        if profile.gpu_models and g.model not in profile.gpu_models:
            continue
        vendor = _VENDOR_NAMES.get(g.vendor, g.vendor)
        name = g.model
        if vendor and not name.lower().startswith(vendor.lower()):
            name = f"{vendor} {name}"
        if name not in names:
            names.append(name)
    return " or ".join(names)


def choices_for(policy: Policy, groups: Iterable[str]) -> list[ProfileChoice]:
    """The profiles the user's teams may use, in policy order (availability unknown)."""
    teams = policy.teams_of(set(groups))
    team = teams[0] if teams else ""
    out = []
    for p in policy.profiles_for(set(teams)):
        if p.pool:
            allowed_team = next(
                (t for t in teams if (tm := policy.team(t)) is not None and tm.quota(p.pool)),
                None,
            )
            if allowed_team is None:
                continue  # no team of the user has a quota in this pool
        else:
            allowed_team = team
        tm = policy.team(allowed_team) if allowed_team else None
        quota = tm.quota(p.pool) if tm is not None and p.pool else None
        cap = quota.per_user_cap_milli if quota is not None else None
        out.append(
            ProfileChoice(
                slug=p.slug,
                display_name=p.display_name,
                description=p.description,
                pool=p.pool,
                share=describe_share(p, policy),
                units=p.gpu.units_milli / UNIT,
                team=allowed_team or "",
                max_lifetime_s=p.max_lifetime_s,
                user_cap=None if cap is None else cap / UNIT,
                card=describe_card(p, policy),
            )
        )
    return out


def _num(value: Any) -> float | None:
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None


def with_availability(
    choices: Sequence[ProfileChoice],
    broker_profiles: Iterable[Mapping[str, Any]],
    queued: Mapping[tuple[str, str], int] | None = None,
    hours_left: Mapping[tuple[str, str], float] | None = None,
) -> list[ProfileChoice]:
    """Add the broker's view (``GET /policy/profiles?user=``) to each choice.

    Each broker profile carries ``availability``: per team, ``guaranteed``,
    ``borrow_limit``, ``in_use``, ``within_guarantee``, ``within_borrow_limit``,
    ``fits_now`` and, where the broker gives it, ``decision``: its own dry-run answer
    for this user (``outcome``, ``reason``, ``code``). A card's verdict and reason are the
    decision's where there is one, so the form never disagrees with the broker.
    ``queued`` maps (team, pool) to the team's waiting requests, ``hours_left`` to its
    GPU-hours left this month. A profile the broker does not list for the user is
    dropped (the broker has the last word).
    """
    info = {str(p.get("slug")): p for p in broker_profiles if p.get("slug")}
    queued = queued or {}
    hours_left = hours_left or {}
    out = []
    for c in choices:
        p = info.get(c.slug)
        if p is None:
            if info:
                continue
            out.append(c)
            continue
        avail = p.get("availability")
        if not isinstance(avail, Mapping) or not avail:
            out.append(c)
            continue
        team = c.team if c.team in avail else next(iter(avail))
        a = avail[team]
        guaranteed = _num(a.get("guaranteed")) or 0.0
        limit = _num(a.get("borrow_limit")) or 0.0
        in_use = _num(a.get("in_use")) or 0.0
        within_g = bool(a.get("within_guarantee"))
        within_b = bool(a.get("within_borrow_limit", within_g))
        fits = a.get("fits_now")
        team_left = round(max(0.0, guaranteed - in_use), 4)
        borrow_left = round(max(0.0, guaranteed + limit - max(in_use, guaranteed)), 4)
        decision = a.get("decision") if isinstance(a.get("decision"), Mapping) else None
        note = ""
        outcome = ""
        if not c.units:
            would_borrow: bool | None = None
            available: bool | None = True
        elif decision is not None:
            outcome = str(decision.get("outcome") or "")
            would_borrow = bool(decision.get("borrowed", not within_g))
            available = outcome in ("granted", "preempting", "queued")
            reason = str(decision.get("reason") or "")
            if outcome == "preempting":
                note = f"starts after a reclaim: {reason}" if reason else "starts after a reclaim"
            elif outcome == "queued":
                note = f"would wait in the queue: {reason}" if reason else "would queue"
            elif not available:
                note = reason or "refused by the GPU broker"
        else:
            would_borrow = not within_g
            available = within_b and (fits is None or bool(fits))
            if not within_b:
                room = team_left + borrow_left
                note = (
                    f"needs {c.units:g} GPU; team {team} may use only {room:g} more "
                    f"in pool {c.pool} (guarantee and borrow limit)"
                )
            elif fits is False:
                note = "no GPU free for it right now"
        out.append(
            replace(
                c,
                team=team,
                team_left=team_left,
                borrow_left=borrow_left,
                would_borrow=would_borrow,
                preemptible=would_borrow,
                queue=queued.get((team, c.pool)),
                available=available,
                note=note,
                outcome=outcome,
                gpu_hours_left=hours_left.get((team, c.pool), c.gpu_hours_left),
            )
        )
    return out


# --------------------------------------------------------------------------- HTML


def _duration(seconds: int) -> str:
    if seconds % 86400 == 0:
        return f"{seconds // 86400} d"
    if seconds >= 3600:
        h, m = divmod(seconds // 60, 60)
        return f"{h} h" + (f" {m} min" if m else "")
    return f"{max(1, round(seconds / 60))} min"


def _facts_line(c: ProfileChoice) -> str:
    """Limits that hold whatever the availability: lifetime, per-user cap, GPU-hours."""
    bits = []
    if not c.units:
        bits.append("no GPU: starts at once, without a GPU grant")
    if c.max_lifetime_s:
        bits.append(f"stopped after {_duration(c.max_lifetime_s)}")
    if c.units and c.user_cap is not None:
        bits.append(f"per-user cap {c.user_cap:g} GPU in pool {c.pool}")
    if c.units and c.gpu_hours_left is not None:
        bits.append(f"team {c.team}: {c.gpu_hours_left:g} GPU-hours left this month")
    return "; ".join(bits)


def _status_line(c: ProfileChoice) -> str:
    bits = []
    if c.team:
        left = ""
        if c.team_left is not None and c.units:
            left = f": {c.team_left:g} GPU left of its guarantee"
            if c.borrow_left:
                left += f", may borrow {c.borrow_left:g} more"
        bits.append(f"team {c.team}{left}")
    if c.available is not False:
        if c.would_borrow:
            bits.append("would borrow idle capacity: preemptible when the owning team needs it")
        elif c.would_borrow is False and c.units:
            bits.append("inside the team's guarantee: not preempted")
    if c.queue:
        wait = f", about {round(c.expected_wait_s / 60)} min" if c.expected_wait_s else ""
        bits.append(f"queue: {c.queue} waiting{wait}")
    if c.available is False:
        bits.append("not available now" + (f": {c.note}" if c.note else ""))
    elif c.note:
        bits.append(c.note)
    return "; ".join(bits)


SIMULATED_BANNER = (
    "Simulated GPUs: this hub has no NVIDIA GPU, so the GPUs below are simulated. "
    "Grants, quotas and the meters behave as on real cards, but no CUDA program can use them."
)


def render_form(
    choices: Sequence[ProfileChoice],
    selected: str | None = None,
    message: str = "",
    simulated: bool = False,
) -> str:
    """HTML for JupyterHub's spawn form: one radio button per profile.

    ``selected`` stays selected even when it is not available now (after a refusal the
    user sees the profile they asked for, with the reason)."""
    sim = (
        '<div class="alert alert-warning gpushare-simulated"><strong>SIMULATED</strong> '
        f"{html.escape(SIMULATED_BANNER)}</div>"
        if simulated
        else ""
    )
    if not choices:
        return sim + (
            '<div class="alert alert-warning gpushare-noprofile">No server profile is open to '
            "your teams. Ask your hub admin to add you to a team.</div>"
        )
    slugs = [c.slug for c in choices]
    if selected not in slugs:
        selected = next((c.slug for c in choices if c.available is not False), slugs[0])
    rows = []
    for c in choices:
        e = html.escape
        checked = " checked" if c.slug == selected else ""
        status = _status_line(c)
        facts = _facts_line(c)
        pool = f'<span class="gpushare-pool">pool {e(c.pool)}</span>' if c.pool else ""
        if c.card:
            pool += f' <span class="gpushare-card">on {e(c.card)}</span>'

        classes = "gpushare-profile" + (" gpushare-unavailable" if c.available is False else "")
        share = c.share + (" (simulated)" if simulated and c.units else "")
        rows.append(
            f'<label class="{classes}" data-slug="{e(c.slug)}" '
            f'data-available="{"unknown" if c.available is None else str(c.available).lower()}" '
            f'style="display:block;border:1px solid #ddd;border-radius:4px;padding:8px;'
            f'margin-bottom:6px;font-weight:normal">'
            f'<input type="radio" name="profile" value="{e(c.slug)}"{checked}> '
            f"<strong>{e(c.display_name)}</strong> "
            f'<span class="gpushare-share">{e(share)}</span> {pool}'
            + (f'<div class="gpushare-desc">{e(c.description)}</div>' if c.description else "")
            + (f'<div class="gpushare-facts" style="color:#555">{e(facts)}</div>' if facts else "")
            + (
                f'<div class="gpushare-status" style="color:#555">{e(status)}</div>'
                if status
                else ""
            )
            + "</label>"
        )
    banner = f'<div class="alert alert-info">{html.escape(message)}</div>' if message else ""
    return f'<div class="gpushare-form">{sim}{banner}{"".join(rows)}</div>'


# --------------------------------------------------------------------------- options


def options_from_form(formdata: Mapping[str, list[str]]) -> dict[str, Any]:
    """Form fields (lists of strings) to user options; unknown fields are kept to be refused."""
    out: dict[str, Any] = {}
    for key, values in formdata.items():
        if key.startswith("_"):  # e.g. _xsrf
            continue
        out[key] = values[0] if isinstance(values, list) and len(values) == 1 else values
    return out


SHOWN_CHARS = 64
"""Characters of a user-supplied value that a message or a log line quotes."""


def clip(value: object, limit: int = SHOWN_CHARS) -> str:
    """A user-supplied value as messages and logs quote it: its first ``limit`` characters
    and "… (N characters)" when longer, so a 1 MB option is never echoed whole."""
    text = value if isinstance(value, str) else repr(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text):,} characters)"


def validate_options(
    options: Mapping[str, Any] | None,
    allowed: Sequence[str],
    known: Iterable[str],
) -> str:
    """The profile slug to start, or :class:`OptionsError` saying what is wrong.

    ``allowed``: slugs the user's teams may use, in order (the first is the default);
    ``known``: every slug of the policy (to tell "not allowed" from "no such profile").
    """
    options = dict(options or {})
    extra = sorted(str(k) for k in set(options) - ALLOWED_KEYS)
    if extra:
        raise OptionsError(
            f"option(s) not offered: {clip(', '.join(extra))}; the only option is 'profile' "
            f"(one of: {', '.join(allowed) or 'none'})",
            400,
        )
    if not allowed:
        raise OptionsError("no server profile is open to your teams", 403)
    slug = options.get("profile")
    if slug is None or slug == "":
        return allowed[0]
    if not isinstance(slug, str):
        raise OptionsError(f"profile must be a string, not {type(slug).__name__}", 400)
    if slug in allowed:
        return slug
    if slug in set(known):
        raise OptionsError(
            f"profile {slug!r} is not allowed for your teams; allowed: {', '.join(allowed)}", 403
        )
    raise OptionsError(f"no such profile {clip(repr(slug))}; allowed: {', '.join(allowed)}",
                       400)
