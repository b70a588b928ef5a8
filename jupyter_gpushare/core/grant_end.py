"""How a grant ended: one record, read by the admin page, the report, the metrics and the ledger.

Every path that ends a grant writes a :class:`GrantEnd` on the grant's row (columns
``end_kind``, ``ended_by_request``, ``ended_by_team`` next to ``released_at`` and the
free-text ``release_reason``). The kinds are a closed set (:class:`EndKind`):

==============  =============================================================================
kind            when
==============  =============================================================================
released        its holder released it (server stopped, job ended, request cancelled)
preempted       taken for another request (by which request and team, and why); also when
                the holder released it itself while it was being preempted
culled          the GPU idle culler stopped its server
expired         released at or after its profile's ``max_lifetime_s``
node_lost       its node failed or left the inventory
reconciled      its server or job was gone (reconciliation with the hub or batch engine)
policy          a policy change (or a restart with another policy) left no room for it
==============  =============================================================================

:func:`classify` reads a kind from a legacy ``release_reason`` text (rows written before
the ``end_kind`` column existed, and callers that pass only a reason); :func:`resolve`
is the one rule that decides the end of a grant from what the caller said and what the
broker knows (being preempted, being culled, past its lifetime). Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class EndKind(str, Enum):
    """How a grant ended (closed set; the values are what the database stores)."""

    RELEASED = "released"
    PREEMPTED = "preempted"
    CULLED = "culled"
    EXPIRED = "expired"
    NODE_LOST = "node_lost"
    RECONCILED = "reconciled"
    POLICY = "policy"


ALL_KINDS: tuple[str, ...] = tuple(k.value for k in EndKind)

EXPIRY_SLACK_S = 5.0
"""A release this close before ``granted_at + max_lifetime_s`` counts as the expiry (the
engine's kill and the spawner's release arrive a little apart)."""


@dataclass(frozen=True)
class GrantEnd:
    """The end of one grant: its kind, the reason text, and for a preemption who took it."""

    kind: EndKind
    reason: str = ""
    by_request: str | None = None
    by_team: str | None = None


# prefixes of the reasons the broker has written (and writes) in ``release_reason``
_PREFIXES: tuple[tuple[str, EndKind], ...] = (
    ("preempted", EndKind.PREEMPTED),
    ("released: job preempted", EndKind.PREEMPTED),
    ("culled", EndKind.CULLED),
    ("expired", EndKind.EXPIRED),
    ("node lost", EndKind.NODE_LOST),
    ("released: job's node", EndKind.NODE_LOST),
    ("reconciled", EndKind.RECONCILED),
    ("released: job died while the broker was down", EndKind.RECONCILED),
    ("released: the new policy has no room", EndKind.POLICY),
    ("no longer fits the policy", EndKind.POLICY),
    ("policy", EndKind.POLICY),
)


def classify(reason: str | None) -> EndKind:
    """The kind a free-text ``release_reason`` stands for (``released`` when none fits)."""
    text = (reason or "").strip().lower()
    for prefix, kind in _PREFIXES:
        if text.startswith(prefix):
            return kind
    return EndKind.RELEASED


def kind_of(end_kind: str | None, reason: str | None) -> EndKind:
    """The end kind of a closed grant row: its ``end_kind`` column, or for a row written
    without one, the kind its reason text says. Every reader goes through this."""
    if end_kind:
        try:
            return EndKind(end_kind)
        except ValueError:
            pass
    return classify(reason)


@dataclass(frozen=True)
class EndFacts:
    """What the broker knows about a grant when it ends."""

    now: float
    granted_at: float
    max_lifetime_s: float | None = None
    preempting_for: str | None = None  # the request it is being preempted for, if any
    preempting_team: str | None = None
    preempting_why: str = ""
    culling_why: str | None = None  # the culler is stopping its server, with this reason


def resolve(reason: str, facts: EndFacts, end: GrantEnd | None = None) -> GrantEnd:
    """The one rule that decides how a grant ended.

    1. An explicit end the broker itself determined (node lost, reconciled, policy,
       culled, preempted at the deadline) stands as given, except that a plain
       ``released`` is only what the holder said;
    2. a holder's release while the grant was being preempted is the preemption
       (the victim's own stop races with the deadline: it still counts as preempted);
    3. a holder's release while the culler stops its server is the cull;
    4. a holder's release at or after the profile's lifetime is the expiry;
    5. else the kind read from the reason (:func:`classify`)."""
    given = end if end is not None else GrantEnd(classify(reason), reason)
    if given.kind is EndKind.PREEMPTED and given.by_request is None and facts.preempting_for:
        return GrantEnd(EndKind.PREEMPTED, facts.preempting_why or given.reason,
                        facts.preempting_for, facts.preempting_team)
    if given.kind is not EndKind.RELEASED:
        return given
    if facts.preempting_for is not None:
        return GrantEnd(EndKind.PREEMPTED, facts.preempting_why or reason,
                        facts.preempting_for, facts.preempting_team)
    if facts.culling_why is not None:
        return GrantEnd(EndKind.CULLED, facts.culling_why)
    if (
        facts.max_lifetime_s
        and facts.now >= facts.granted_at + facts.max_lifetime_s - EXPIRY_SLACK_S
    ):
        return GrantEnd(EndKind.EXPIRED, f"expired: max lifetime {facts.max_lifetime_s:g} s "
                        f"reached ({reason})")
    return given
