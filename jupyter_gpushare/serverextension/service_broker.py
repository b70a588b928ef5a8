"""The telemetry service's talk with the broker: heartbeats (what the grant uses), preemption
and other notices pushed to the stream and the kernels, and the grant and team answers that
ask the broker.

:class:`BrokerTalk` is held by :class:`~.service.TelemetryService` (``service.broker_talk``); it
owns the last heartbeat's outcome and the notices seen and sent, and is handed the link, the
grant and the ways to read the service's latest figures and reach its users when it is built.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from ..telemetry.attribution import Attribution
from ..telemetry.broker_link import BrokerAnswer, BrokerLink, heartbeat_body
from ..telemetry.grant import GrantInfo
from ..telemetry.sampler import Sampler
from .notices import notice_text, notices_of, with_time_left
from .service_config import ServiceConfig


class BrokerTalk:
    """Heartbeats, notices and the broker's answers for this server's grant."""

    def __init__(
        self,
        config: ServiceConfig,
        grant: GrantInfo,
        broker: BrokerLink,
        sampler: Sampler,
        attribution: Callable[[], Attribution | None],
        kernel_activity_ts: Callable[[], float | None],
        broadcast: Callable[[str], None],
        tell_kernels_soon: Callable[[str], None],
    ) -> None:
        self.config = config
        self.grant = grant
        self.broker = broker
        self.sampler = sampler
        self.attribution = attribution  # the latest sample's attribution (None before one)
        self.kernel_activity_ts = kernel_activity_ts
        self.broadcast = broadcast  # to the stream's clients
        self.tell_kernels_soon = tell_kernels_soon  # into every kernel's output, in background
        self.last_heartbeat: dict[str, Any] | None = None
        self.seen_notices: set[str] = set()
        self.notice_messages: list[str] = []

    # -- broker --------------------------------------------------------------------
    async def heartbeat(self) -> BrokerAnswer | None:
        """Tell the broker what this grant uses (for GPU-hour accounting)."""
        att, g = self.attribution(), self.grant
        if att is None or g.grant_id is None or not self.broker.configured:
            return None
        body = heartbeat_body(g.grant_id, att, self.sampler.simulated)
        activity = self.kernel_activity_ts()
        if activity is not None:  # the broker's GPU idle culler: kernel work resets its clock
            body["kernel_activity_ts"] = activity
        ans = await self.broker.heartbeat(body)
        self.last_heartbeat = {"ts": body["ts"], "ok": ans.ok, "error": ans.error}
        return ans

    async def notices(self) -> BrokerAnswer:
        if self.grant.grant_id is None:
            return BrokerAnswer(False, error="no grant")
        return await self.broker.notices(self.grant.grant_id)

    async def poll_notices(self) -> None:
        """Push new preemption notices to stream clients and into the kernels' output."""
        if self.grant.grant_id is None or not self.broker.configured:
            return
        ans = await self.notices()
        for n in notices_of(ans):
            key = json.dumps(n, sort_keys=True)
            timed = with_time_left(n)
            if key not in self.seen_notices:
                self.seen_notices.add(key)
                msg = json.dumps({"type": "notice", "notice": timed})
                self.notice_messages.append(msg)
                self.broadcast(msg)
                if timed.get("kind", "preemption") != "preemption":  # the watcher tells those
                    self.tell_kernels_soon(notice_text(timed))
            left = timed.get("seconds_left")
            last_call = f"{key}#last"
            if (
                isinstance(left, (int, float))
                and 0 < left <= max(15.0, 2 * self.config.notices_interval_s)
                and last_call not in self.seen_notices
                and timed.get("kind", "preemption") != "preemption"
            ):
                self.seen_notices.add(last_call)
                self.tell_kernels_soon(notice_text(timed))

    async def grant_answer(self) -> dict[str, Any]:
        """The ``/gpushare/api/grant`` answer."""
        g = self.grant
        out: dict[str, Any] = {
            "simulated": self.sampler.simulated or g.simulated,
            "grant": g.to_dict(),
            "limits": g.limits(),
            "notices": [],
            "preemption": None,
            "broker": None,
            "heartbeat": self.last_heartbeat,
        }
        if not g.has_grant:
            return out
        remote, notices = await asyncio.gather(self.broker.grant(g.grant_id or ""), self.notices())
        out["broker"] = {"ok": remote.ok, "error": remote.error or notices.error}
        out["broker_grant"] = remote.data if remote.ok else None
        ns = [with_time_left(n) for n in notices_of(notices)]
        out["notices"] = ns
        pre = [n for n in ns if n.get("kind", "preemption") == "preemption"]
        out["preemption"] = min(pre, key=lambda n: n.get("deadline") or "") if pre else None
        return out

    async def team_answer(self) -> dict[str, Any]:
        team = self.grant.team
        if not team:
            return {
                "team": None,
                "usage": None,
                "error": "no grant: no team",
                "simulated": self.sampler.simulated,
            }
        ans = await self.broker.team_usage(team)
        return {
            "team": team,
            "usage": ans.data if ans.ok else None,
            "error": ans.error,
            "simulated": self.sampler.simulated or self.grant.simulated,
        }
