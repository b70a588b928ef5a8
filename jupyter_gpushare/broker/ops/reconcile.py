"""Reconciliation with reality: release grants whose holder is gone, stop servers with none.

A :class:`HolderChecker` says, for each live grant, whether its holder (a hub server, a
batch job, a pod) still exists: ``"alive"``, ``"gone"`` or ``"unknown"``. Only ``"gone"``
releases anything, so a hub that cannot be reached changes nothing. Grants younger than
``min_age_s`` are left alone (their server may not be registered yet).

* **Interactive grants**: the hub's list of the user's servers (running or starting).
* **Batch grants**: the job lookups (:meth:`HolderChecker.add_job_lookup`, e.g. the broker's
  jobs table), then the batch backend; a job that none of them knows is gone
  (``HubHolderChecker.release_unknown_jobs``), so a batch grant naming a made-up job is
  released at the next reconcile.
* **Servers without a grant**: a server the hub runs with a GPU profile of the policy
  (``user_options.profile``) that holds no grant and waits for none is stopped
  (``HubHolderChecker.stop_servers_without_grant``): a GPU share is never used without
  exactly one live grant.

A pass over many grants (100,000 on a large site) gives the event loop back every
``SLICE_S`` of work: it checks the grants a batch of users at a time (each user's grants
together, so the hub is asked about a user once per pass).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from traitlets import Any as AnyTrait
from traitlets import Bool
from traitlets.config import LoggingConfigurable

from ...core.grant_end import EndKind, GrantEnd
from ...core.model import Grant, Kind
from ..hubclient import HubError, hub_time

if TYPE_CHECKING:
    from ..service.broker import Broker

log = logging.getLogger("gpushare.broker.reconcile")

JobLookup = Callable[[Grant], Awaitable[bool | None]]
"""Does the job holding this batch grant exist? ``True``/``False``, or ``None``: cannot tell."""


class HolderChecker(LoggingConfigurable):
    """Base class: every holder is unknown (nothing is ever released)."""

    hub = AnyTrait(None, allow_none=True)  # HubClient
    backend = AnyTrait(None, allow_none=True)  # BatchBackend

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.job_lookups: list[JobLookup] = []

    def add_job_lookup(self, lookup: JobLookup) -> None:
        """Ask ``lookup`` first whether a batch grant's job exists (the jobs table, ...)."""
        self.job_lookups.append(lookup)

    async def check(self, grants: list[Grant]) -> dict[str, tuple[str, str]]:
        """Map grant id to (``alive`` | ``gone`` | ``unknown``, why)."""
        return {g.id: ("unknown", "no holder checker") for g in grants}

    async def servers_without_grant(self, broker: Broker, min_age_s: float) -> list[dict[str, Any]]:
        """Servers that run with a GPU profile but hold no grant (stopped, or reported)."""
        return []


class HubHolderChecker(HolderChecker):
    """Interactive grants: the hub's list of the user's servers; batch: job lookups, backend."""

    release_unknown_jobs = Bool(
        True,
        config=True,
        help="Release a batch grant whose job no job lookup and no batch backend knows "
        "(False: leave it, as 'unknown').",
    )
    stop_servers_without_grant = Bool(
        True,
        config=True,
        help="Stop a server that runs with a GPU profile but holds no live grant "
        "(False: only report it in the reconcile result and the log).",
    )

    async def job_verdict(self, grant: Grant) -> tuple[str, str]:
        job = grant.request.holder
        for lookup in self.job_lookups:
            known = await lookup(grant)
            if known is not None:
                return ("alive", "job exists") if known else ("gone", f"job {job!r} is gone")
        alive = await self.backend.job_alive(grant) if self.backend is not None else None
        if alive is not None:
            return ("alive", "job runs") if alive else ("gone", f"job {job!r} is gone")
        if self.release_unknown_jobs:
            return ("gone", f"no job {job!r} is known to the broker or the batch backend")
        return ("unknown", "batch backend cannot tell")

    async def check(self, grants: list[Grant]) -> dict[str, tuple[str, str]]:
        out: dict[str, tuple[str, str]] = {}
        users: dict[str, dict[str, Any] | None] = {}
        for grant in grants:
            if grant.request.kind is Kind.BATCH:
                out[grant.id] = await self.job_verdict(grant)
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

    async def servers_without_grant(self, broker: Broker, min_age_s: float) -> list[dict[str, Any]]:
        if self.hub is None:
            return []
        try:
            users = await self.hub.active_users()
        except HubError as exc:
            log.warning("reconcile: cannot list the hub's servers: %s", exc)
            return []
        found = []
        now = broker.clock()
        for model in users:
            user = model.get("name") or ""
            for name, server in (model.get("servers") or {}).items():
                if not isinstance(server, dict) or server.get("pending") or not server.get("ready"):
                    continue  # starting or stopping: the spawner is at work
                started = hub_time(server.get("started"))
                if started is not None and now - started < min_age_s:
                    continue
                slug = (server.get("user_options") or {}).get("profile")
                profile = broker.policy.profile(slug) if isinstance(slug, str) else None
                if profile is None or profile.gpu.is_empty:
                    continue  # not a GPU server of this policy
                held = broker.held_by(Kind.INTERACTIVE.value, user, name)
                if held:
                    continue
                entry = {"user": user, "server": name, "profile": slug, "stopped": False}
                if self.stop_servers_without_grant:
                    try:
                        entry["stopped"] = await self.hub.stop_server(user, name)
                    except HubError as exc:
                        log.warning("reconcile: cannot stop %s/%s: %s", user, name, exc)
                log.warning(
                    "reconcile: server %s/%s runs profile %s without a GPU grant%s",
                    user,
                    name,
                    slug,
                    ": stopped" if entry["stopped"] else "",
                )
                found.append(entry)
        return found


async def reconcile(
    broker: Broker, checker: HolderChecker, min_age_s: float = 60.0
) -> dict[str, Any]:
    """Release grants whose holders are gone, stop servers without a grant, retry waiting
    requests; return the changes.

    Never holds the event loop much longer than ``SLICE_S`` at a time (see the module).
    """
    now = broker.clock()
    pause = _Pause()
    grants = broker.state.grants
    # user -> their grant's id, or a list of ids when they hold several, in SHARDS dicts by
    # the user's hash (one dict of 100,000 users holds the loop for milliseconds each time
    # it grows, and again when it is dropped). Ids, not grants: a dict of strings is not
    # tracked by the garbage collector, and a list of strings costs it little, where the
    # same containers of 100,000 grants made each of its passes during the pass 5-8 ms
    shards: list[dict[str, str | list[str]]] = [{} for _ in range(SHARDS)]
    for i, gid in enumerate(list(grants)):
        g = grants.get(gid)
        if g is not None and now - g.granted_at >= min_age_s:
            by_user = shards[hash(g.user) % SHARDS]
            had = by_user.get(g.user)
            if had is None:
                by_user[g.user] = gid
            elif isinstance(had, list):
                had.append(gid)
            else:
                by_user[g.user] = [had, gid]
        if not i % 128:
            await pause()
    # only the "gone" verdicts are kept (no table of every grant, for the same reason)
    gone: list[tuple[str, str]] = []
    tally = [0, 0]  # checked, unknown
    batch: list[Grant] = []

    async def check() -> None:
        verdicts = await checker.check(batch)
        tally[0] += len(batch)
        for grant in batch:
            verdict, why = verdicts.get(grant.id, ("unknown", ""))
            if verdict == "unknown":
                tally[1] += 1
            elif verdict == "gone":
                gone.append((grant.id, why))
        batch.clear()
        await pause()

    for by_user in shards:
        for held in by_user.values():
            ids = held if isinstance(held, list) else (held,)
            for j in range(0, len(ids), BATCH):  # (a user with very many grants: parts)
                for gid in ids[j : j + BATCH]:
                    grant = grants.get(gid)  # (released meanwhile: nothing to check)
                    if grant is not None:
                        batch.append(grant)
                if len(batch) >= BATCH:
                    await check()
        by_user.clear()
        await pause()
    if batch:
        await check()
    count, unknown = tally
    released = []
    for i, (gid, why) in enumerate(gone):
        if not i % 16:
            await pause()
        grant = broker.state.grants.get(gid)  # the state, not `grants`: it may be rebuilt
        ended = GrantEnd(EndKind.RECONCILED, f"reconciled: {why}")
        if grant is None or not broker.release(gid, ended.reason, end=ended):
            continue
        released.append(
            {
                "grant_id": gid,
                "user": grant.user,
                "server": grant.request.holder,
                "kind": grant.request.kind.value,
                "reason": why,
            }
        )
        log.warning("reconcile: released grant %s of %s: %s", gid, grant.user, why)
    await pause()
    orphans = await checker.servers_without_grant(broker, min_age_s)
    retried = []
    for request_id, pend in list(broker.pending.items()):
        if not any(v in broker.state.grants for v in pend.victims):
            retried.append({"request_id": request_id, "status": broker.retry(request_id)})
    for change in broker.drain_queue():
        retried.append({"request_id": change[0], "status": change[1]})
    result = {
        "checked": count,
        "unknown": unknown,
        "released": released,
        "servers_without_grant": orphans,
        "retried": retried,
    }
    log.info(
        "reconcile: checked %d grants, released %d, %d servers without grant, retried %d",
        count,
        len(released),
        len(orphans),
        len(retried),
    )
    return result


SLICE_S = 0.002
"""Seconds of work after which a reconcile pass lets the event loop serve others."""

YIELD_S = 0.001
"""Seconds the pass then gives the loop back for. Not a bare ``sleep(0)``: that lets each
waiting task take one step, and an HTTP answer is several steps (read, handle, write, each
woken by the last), so it waited a slice of the pass per step (~3 slices for a timer, 30-90
ms for ``/health`` during a pass over 100,000 grants). The pass takes ~1.5 times as long."""

BATCH = 250
"""Grants (whole users' worth) handed to the holder checker at a time."""

SHARDS = 64
"""Tables a pass groups the grants by user in (see :func:`reconcile`)."""


class _Pause:
    """``await pause()``: yield to the event loop once ``SLICE_S`` passed since the last
    (``force=True``: now)."""

    def __init__(self) -> None:
        self.since = time.perf_counter()

    async def __call__(self, force: bool = False) -> None:
        if force or time.perf_counter() - self.since >= SLICE_S:
            await asyncio.sleep(YIELD_S)
            self.since = time.perf_counter()


async def reconcile_loop(
    broker: Any, checker: HolderChecker, min_age_s: float, interval_s: float, on_start: bool
) -> None:
    """:func:`reconcile` at start (``on_start``) and every ``interval_s`` (0: never again)."""
    first = True
    while True:
        if not first or on_start:
            try:
                await reconcile(broker, checker, min_age_s)
            except Exception:
                log.exception("reconcile failed")
        first = False
        if interval_s <= 0:
            return
        await asyncio.sleep(interval_s)
