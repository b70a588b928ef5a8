"""Reconciliation with reality: release grants whose holder is gone.

A :class:`HolderChecker` says, for each live grant, whether its holder (a hub server, a
batch job, a pod) still exists: ``"alive"``, ``"gone"`` or ``"unknown"``. Only ``"gone"``
releases anything, so a hub that cannot be reached changes nothing. Grants younger than
``min_age_s`` are left alone (their server may not be registered yet).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from traitlets import Any as AnyTrait
from traitlets.config import LoggingConfigurable

from ..core.model import Grant, Kind
from .hubclient import HubError

if TYPE_CHECKING:
    from .service import Broker

log = logging.getLogger("gpushare.broker.reconcile")


class HolderChecker(LoggingConfigurable):
    """Base class: every holder is unknown (nothing is ever released)."""

    hub = AnyTrait(None, allow_none=True)  # HubClient
    backend = AnyTrait(None, allow_none=True)  # BatchBackend

    async def check(self, grants: list[Grant]) -> dict[str, tuple[str, str]]:
        """Map grant id to (``alive`` | ``gone`` | ``unknown``, why)."""
        return {g.id: ("unknown", "no holder checker") for g in grants}


class HubHolderChecker(HolderChecker):
    """Interactive grants: the hub's list of the user's servers; batch: the batch backend."""

    async def check(self, grants: list[Grant]) -> dict[str, tuple[str, str]]:
        out: dict[str, tuple[str, str]] = {}
        users: dict[str, dict[str, Any] | None] = {}
        for grant in grants:
            if grant.request.kind is Kind.BATCH:
                alive = await self.backend.job_alive(grant) if self.backend is not None else None
                out[grant.id] = (
                    ("unknown", "batch backend cannot tell")
                    if alive is None
                    else ("alive", "job runs")
                    if alive
                    else ("gone", f"job {grant.request.holder} is gone")
                )
                continue
            if self.hub is None:
                out[grant.id] = ("unknown", "no hub")
                continue
            if grant.user not in users:
                try:
                    users[grant.user] = await self.hub.get_user(grant.user)
                except HubError as exc:
                    log.warning("reconcile: cannot ask the hub about %s: %s", grant.user, exc)
                    out[grant.id] = ("unknown", str(exc))
                    continue
            model = users[grant.user]
            server = grant.request.holder
            if model is None:
                out[grant.id] = ("gone", f"user {grant.user} no longer exists")
            elif server in (model.get("servers") or {}):
                out[grant.id] = ("alive", "server exists")
            else:
                out[grant.id] = ("gone", f"server {grant.user}/{server} is not running")
        return out


async def reconcile(
    broker: Broker, checker: HolderChecker, min_age_s: float = 60.0
) -> dict[str, Any]:
    """Release grants whose holders are gone and retry waiting requests; return the changes."""
    now = broker.clock()
    candidates = [g for g in list(broker.state.grants.values()) if now - g.granted_at >= min_age_s]
    verdicts = await checker.check(candidates)
    released = []
    unknown = 0
    for grant in candidates:
        verdict, why = verdicts.get(grant.id, ("unknown", ""))
        if verdict == "unknown":
            unknown += 1
        if verdict != "gone" or grant.id not in broker.state.grants:
            continue
        broker.release(grant.id, f"reconciled: {why}")
        released.append(
            {
                "grant_id": grant.id,
                "user": grant.user,
                "server": grant.request.holder,
                "reason": why,
            }
        )
        log.warning("reconcile: released grant %s of %s: %s", grant.id, grant.user, why)
    retried = []
    for request_id, pend in list(broker.pending.items()):
        if not any(v in broker.state.grants for v in pend.victims):
            retried.append({"request_id": request_id, "status": broker.retry(request_id)})
    for change in broker.drain_queue():
        retried.append({"request_id": change[0], "status": change[1]})
    result = {
        "checked": len(candidates),
        "unknown": unknown,
        "released": released,
        "retried": retried,
    }
    log.info(
        "reconcile: checked %d grants, released %d, retried %d",
        len(candidates),
        len(released),
        len(retried),
    )
    return result
