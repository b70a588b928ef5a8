"""The GPU-aware idle culler: warns, then stops (or moves to a CPU-only profile) servers
whose GPU share shows no GPU activity for their pool's window, and releases their grant.

The rule is :func:`jupyter_gpushare.core.culling.verdict`; this module gathers the facts
(heartbeats through :class:`~.usage.UseRecorder`, kernel activity the server extension
reports with its heartbeats, the user's running batch jobs) every ``interval_s`` and
carries the verdict out:

* **warn**: a notice of kind ``idle`` on the grant (``GET /notices``, the notices stream;
  the server extension forwards it to JupyterLab) with the deadline;
* **act**: ask the hub to stop the server (``action = "stop"``), or to stop it and start it
  again with the CPU-only profile ``cpu_profile`` (``action = "cpu"``); once the hub has
  stopped it, release the grant with the end kind ``culled`` (and the reason
  ``culled: ...``; a release by the spawner during the stop is the cull too). That end
  record is what the monthly report and the admin page count; :attr:`GPUCuller.history`
  (bounded) feeds the admin page's culler table and ``gpushare_culls_total`` the metrics.

JupyterHub's own idle culler keeps doing what it does; this one looks at GPUs only.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from traitlets import Dict, Enum, Float, Integer, Unicode
from traitlets.config import LoggingConfigurable

from ...core.culling import CullFacts, CullRule, Verdict, idle_since, verdict
from ...core.grant_end import EndKind, GrantEnd
from ...core.model import Kind
from ..hubclient import HubClient, HubError
from ..store.db import grants_table
from ..store.serial import iso

if TYPE_CHECKING:
    from ..service.broker import Broker
    from ..service.preempt import NoticeHub

log = logging.getLogger("gpushare.broker.culler")


def _duration(seconds: float) -> str:
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{seconds / 3600:g} h"
    if seconds >= 60:
        return f"{seconds / 60:g} min"
    return f"{seconds:g} s"


class GPUCuller(LoggingConfigurable):
    """Idle culling of GPU shares, configured per pool (see the module docstring)."""

    windows = Dict(
        key_trait=Unicode(),
        value_trait=Float(),
        default_value={},
        config=True,
        help="Idle window in seconds per pool, e.g. {'interactive': 7200}: a server of that "
        "pool whose GPUs show no activity for this long is warned. Pools not listed use "
        "default_window_s.",
    )
    default_window_s = Float(
        0.0, config=True, help="Idle window of pools not in `windows` (0: never culled)."
    )
    warn_s = Float(
        900.0, config=True,
        help="Seconds between the warning and the stop; activity meanwhile cancels it.",
    )
    stale_s = Float(
        300.0, config=True,
        help="A grant whose server sent no heartbeat for this long is left alone (no "
        "evidence that it is idle).",
    )
    interval_s = Float(60.0, config=True, help="Seconds between two passes of the culler.")
    action = Enum(
        ["stop", "cpu"], "stop", config=True,
        help="What happens after the warning: 'stop' the server, or 'cpu': stop it and start "
        "it again with the CPU-only profile `cpu_profile`. Either way the grant is released.",
    )
    cpu_profile = Unicode(
        "", config=True, help="Slug of the CPU-only profile servers move to (action 'cpu')."
    )
    history_size = Integer(500, config=True, help="Culling events kept for the admin page.")

    def __init__(
        self,
        broker: Broker,
        hub: HubClient | None,
        notices: NoticeHub | None = None,
        on_cull: Any = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.broker = broker
        self.hub = hub
        self.notice_hub = notices
        self.on_cull = on_cull  # callable(pool, action) for the metrics
        self.warned: dict[str, float] = {}
        self.history: deque[dict[str, Any]] = deque(maxlen=self.history_size)
        self._task: asyncio.Task[None] | None = None

    # -- the rule's inputs --------------------------------------------------------------------

    def rule_for(self, pool: str) -> CullRule:
        window = self.windows.get(pool, self.default_window_s)
        return CullRule(window_s=window, warn_s=self.warn_s, stale_s=self.stale_s)

    def facts(
        self, grant_id: str, now: float, batch_users: set[str] | None = None
    ) -> CullFacts:
        """The rule's inputs for one grant; ``batch_users`` (the users holding a batch
        grant, if the caller has them) saves a pass over every live grant."""
        broker = self.broker
        grant = broker.state.grants[grant_id]
        usage = broker.usage
        if batch_users is not None:
            jobs_running = grant.user in batch_users
        else:
            jobs_running = any(
                g.request.kind is Kind.BATCH and g.user == grant.user
                for g in broker.state.grants.values()
            )
        return CullFacts(
            now=now,
            interactive=grant.request.kind is Kind.INTERACTIVE,
            granted_at=grant.granted_at,
            last_gpu_activity=usage.last_active.get(grant_id),
            last_kernel_activity=usage.last_kernel.get(grant_id),
            last_job_activity=now if jobs_running else None,
            last_heartbeat=usage.last_seen.get(grant_id),
            warned_at=self.warned.get(grant_id),
        )

    # -- one pass -----------------------------------------------------------------------------

    async def tick(self, now: float | None = None) -> list[dict[str, Any]]:
        """Decide on every live grant once; returns what was done."""
        now = self.broker.clock() if now is None else now
        done: list[dict[str, Any]] = []
        for gid in [g for g in self.warned if g not in self.broker.state.grants]:
            self._withdraw(gid)
        acts = []
        # one rule per pool and one set of batch users per pass, not per grant (100,000
        # grants: a rule object each, and a pass over every grant each, were O(n²))
        rules: dict[str, CullRule] = {}
        batch_users: set[str] | None = None
        grants = self.broker.state.grants
        for gid, grant in list(grants.items()):
            rule = rules.get(grant.pool)
            if rule is None:
                rule = rules[grant.pool] = self.rule_for(grant.pool)
            if rule.window_s <= 0 and gid not in self.warned:
                continue
            if batch_users is None:
                batch_users = {g.user for g in grants.values() if g.request.kind is Kind.BATCH}
            facts = self.facts(gid, now, batch_users)
            v = verdict(facts, rule)
            if v is Verdict.WARN:
                done.append(self._warn(gid, facts, rule))
            elif v is Verdict.CLEAR:
                self._withdraw(gid)
                done.append(self._event(gid, "cleared", now, idle_since(facts)))
            elif v is Verdict.ACT:
                acts.append(self._act(gid, facts, rule))
        # the stops wait for the hub: run them side by side, not one after the other
        for event in await asyncio.gather(*acts):
            if event is not None:
                done.append(event)
        self.broker.usage.prune(self.broker.state.grants)
        return done

    def _event(self, gid: str, what: str, now: float, since: float) -> dict[str, Any]:
        grant = self.broker.state.grants.get(gid)
        event = {
            "ts": iso(now),
            "grant_id": gid,
            "user": grant.user if grant else "",
            "server": grant.request.holder if grant else "",
            "team": grant.team if grant else "",
            "pool": grant.pool if grant else "",
            "event": what,
            "idle_s": round(max(0.0, now - since), 1),
        }
        self.history.append(event)
        return event

    def _warn(self, gid: str, facts: CullFacts, rule: CullRule) -> dict[str, Any]:
        grant = self.broker.state.grants[gid]
        deadline = facts.now + rule.warn_s
        self.warned[gid] = facts.now
        then = (
            "moved to the CPU-only profile" if self.action == "cpu" and self.cpu_profile
            else "stopped"
        )
        notice = {
            "grant_id": gid,
            "user": grant.user,
            "server": grant.request.holder,
            "kind": "idle",
            "holder_kind": grant.request.kind.value,
            "reason": f"no GPU activity for {_duration(rule.window_s)}: this server will be "
            f"{then} and its GPU share released at the deadline unless a kernel uses the "
            "GPU before",
            "action": "cpu" if then != "stopped" else "stop",
            "deadline": iso(deadline),
            "deadline_ts": deadline,
            "for_request": None,
        }
        self.broker.cull_notices[gid] = notice
        if self.notice_hub is not None:
            self.notice_hub.publish(notice)
        log.info("culler: warned %s/%s (grant %s)", grant.user, grant.request.holder, gid)
        return self._event(gid, "warned", facts.now, idle_since(facts))

    def _withdraw(self, gid: str) -> None:
        self.warned.pop(gid, None)
        self.broker.cull_notices.pop(gid, None)

    async def _act(self, gid: str, facts: CullFacts, rule: CullRule) -> dict[str, Any] | None:
        grant = self.broker.state.grants[gid]
        user, server = grant.user, grant.request.holder
        if self.hub is None:
            log.warning("culler: no hub to stop %s/%s; grant %s kept", user, server, gid)
            return None
        cpu = self.action == "cpu" and bool(self.cpu_profile)
        what = "moved to cpu" if cpu else "stopped"
        reason = f"culled: no GPU activity for {_duration(rule.window_s)}; server {what}"
        # while the hub stops the server its spawner releases the grant: that release is
        # the cull (the end record, core.grant_end.resolve)
        self.broker.culling[gid] = reason
        try:
            await self.hub.stop_server(user, server)
            await self._wait_stopped(user, server)
            if cpu:
                await self._start(user, server, {"profile": self.cpu_profile})
        except HubError as exc:
            self.broker.culling.pop(gid, None)
            log.warning("culler: could not stop %s/%s: %s (will retry)", user, server, exc)
            return None
        except BaseException:  # (cancelled, or a bug): a later release is no cull
            self.broker.culling.pop(gid, None)
            raise
        event = self._event(gid, what, facts.now, idle_since(facts))
        self._withdraw(gid)
        if gid in self.broker.state.grants:
            self.broker.release(gid, reason, end=GrantEnd(EndKind.CULLED, reason))
        else:  # released while the hub stopped the server: make sure it says culled
            self._relabel(gid, reason)
        if self.on_cull is not None:
            self.on_cull(grant.pool, "cpu" if what != "stopped" else "stop")
        log.info("culler: %s %s/%s, grant %s released", what, user, server, gid)
        return event

    async def _wait_stopped(self, user: str, server: str, timeout_s: float = 60.0) -> None:
        """Wait until the hub no longer lists ``server`` (its stop may be pending)."""
        assert self.hub is not None
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            model = await self.hub.get_user(user)
            if server not in ((model or {}).get("servers") or {}):
                return
            await asyncio.sleep(0.5)

    async def _start(self, user: str, server: str, options: dict[str, Any]) -> None:
        """Start ``server`` again with ``options`` (the CPU-only profile)."""
        assert self.hub is not None
        path = f"/users/{quote(user, safe='')}/server"
        if server:
            path = f"/users/{quote(user, safe='')}/servers/{quote(server, safe='')}"
        await self.hub._call("POST", path, options)

    def _relabel(self, gid: str, reason: str) -> None:
        """Put the culler's reason on a grant its holder released during the stop, so the
        ledger (and the monthly report) says it was culled."""
        with self.broker.engine.begin() as conn:
            conn.execute(
                grants_table.update()
                .where(grants_table.c.id == gid, grants_table.c.released_at.is_not(None),
                       grants_table.c.end_kind != EndKind.PREEMPTED.value)
                .values(release_reason=reason, end_kind=EndKind.CULLED.value)
            )

    # -- the loop -----------------------------------------------------------------------------

    def start(self) -> None:
        """Run a pass every ``interval_s`` (with no window configured a pass only forgets
        the heartbeat figures of ended grants)."""
        if self._task is None:
            self._task = asyncio.ensure_future(self._loop())

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.tick()
            except Exception:
                log.exception("culler pass failed")

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None
