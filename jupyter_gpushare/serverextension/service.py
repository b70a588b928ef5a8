"""Telemetry runtime inside the single-user server.

The sampler thread samples, walks this server's process tree and attributes usage
(no event-loop time spent on NVML or psutil); the event loop then runs the watchdog and
the hints, keeps the timeline, fans samples out to stream clients and sends heartbeats.

The service holds its parts, each owning its state, built next to it: its settings
(:mod:`.service_config`), its kernels (:mod:`.service_kernels`), the watchdog's action
(:mod:`.watchdog_action`) and the talk with the broker (:mod:`.service_broker`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from ..telemetry.attribution import Attribution, attribute, collect_process_tree
from ..telemetry.broker_link import BrokerLink
from ..telemetry.factory import make_sampler, underlying
from ..telemetry.grant import GrantInfo
from ..telemetry.hints import LowUtilHint, UsagePoint, low_util_hints, usage_points
from ..telemetry.model import Sample
from ..telemetry.sampler import Sampler, capacity_for
from ..telemetry.simulated import SimulatedSampler
from ..telemetry.watchdog import ACTIONS, LimitWatchdog, watchdog_applies
from .hostuse import RESOURCE_USAGE, HostMeter, HostUse
from .notices import notice_text
from .service_broker import BrokerTalk
from .service_config import ServiceConfig
from .service_kernels import KernelTable
from .watchdog_action import VERBS, WatchdogEnforcer

__all__ = ["HINTS_EVERY_S", "VERBS", "Sender", "ServiceConfig", "TelemetryService", "notice_text"]

log = logging.getLogger(__name__)

Sender = Callable[[str], None]

HINTS_EVERY_S = 5.0


class TelemetryService:
    """Owns the sampler, the watchdog, the timeline and the stream subscribers; holds the
    kernels, the watchdog's enforcer and the talk with the broker."""

    def __init__(
        self,
        config: ServiceConfig,
        kernel_manager: Any = None,
        session_manager: Any = None,
        grant: GrantInfo | None = None,
        server_pid: int | None = None,
        terminal_manager: Any = None,
    ) -> None:
        if config.watchdog_action not in ACTIONS:
            raise ValueError(f"watchdog action must be one of {ACTIONS}")
        self.config = config
        self.grant = grant if grant is not None else GrantInfo.from_env()
        self.kernel_manager = kernel_manager
        self.session_manager = session_manager
        self.terminal_manager = terminal_manager
        self.server_pid = server_pid or os.getpid()
        self.broker = BrokerLink(self.grant.broker_url, config.api_token, config.broker_timeout_s)
        self.kernels = KernelTable(
            config,
            self.grant,
            self.broker,
            kernel_manager,
            session_manager,
            lambda: self.simulated_sampler,
        )
        self.sampler: Sampler = make_sampler(
            "simulated" if self.grant.simulated and config.sampler == "auto" else config.sampler,
            config.interval_s,
            config.history_s,
            simulated_uuids=self.grant.gpu_uuids,
            simulated_options={
                "count": config.simulated_gpu_count,
                "model": config.simulated_gpu_model,
                "memory_total_mib": self.grant.gpu_memory_mib or config.simulated_gpu_memory_mib,
                "background_load": config.simulated_background_load,
                # the server's own use: its kernels compute as hard as they use the CPU
                "own_pids": lambda: [k.pid for k in self.kernels if k.pid],
                "own_compute_pct": self.grant.compute_pct,
            },
        )
        applies, self.watchdog_reason = watchdog_applies(self.grant)
        if not config.watchdog_enabled:
            applies, self.watchdog_reason = False, "watchdog disabled by configuration"
        self.watchdog: LimitWatchdog | None = (
            LimitWatchdog(
                self.grant.memory_limit_mib or 0,
                config.watchdog_grace_samples,
                config.watchdog_cooldown_s,
                server_pid=self.server_pid,
            )
            if applies
            else None
        )
        cap = capacity_for(config.history_s, config.interval_s)
        self.timeline: deque[dict[str, Any]] = deque(maxlen=cap)
        self.points: deque[UsagePoint] = deque(
            maxlen=capacity_for(config.low_util_window_s + 2 * config.interval_s, config.interval_s)
            * 8
        )
        self.host_meter = HostMeter(self.server_pid)
        # set by the extension: True where jupyter-resource-usage measures the host instead
        self.host_elsewhere: Callable[[], bool] = lambda: False
        self.current: dict[str, Any] | None = None
        self.current_json: str | None = None
        self.attribution: Attribution | None = None
        self.subscribers: set[Sender] = set()
        self.enforcer = WatchdogEnforcer(
            config,
            kernel_manager,
            terminal_manager,
            lambda: self.simulated_sampler,
            self.broadcast,
            self.kernels.tell,
        )
        self.broker_talk = BrokerTalk(
            config,
            self.grant,
            self.broker,
            self.sampler,
            lambda: self.attribution,
            self.kernels.activity_ts,
            self.broadcast,
            self.kernels.tell_soon,
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        self._started = False
        self._first_sample = asyncio.Event()
        self._hints: list[LowUtilHint] = []
        self._hints_at = float("-inf")

    # -- lifecycle -----------------------------------------------------------------
    async def start(self) -> None:
        """Start sampling and the periodic tasks (idempotent; needs a running loop)."""
        if self._started:
            return
        self._started = True
        self._loop = asyncio.get_running_loop()
        self._first_sample = asyncio.Event()
        await self.kernels.refresh()
        self.sampler.add_listener(self._on_sample_in_thread)
        self.sampler.start()
        self._tasks = [
            asyncio.ensure_future(self._every(self.config.interval_s, self.kernels.refresh)),
            asyncio.ensure_future(self._heartbeats()),
            asyncio.ensure_future(
                self._every(self.config.notices_interval_s, self.broker_talk.poll_notices)
            ),
        ]

    async def stop(self) -> None:
        for t in [*self._tasks, *self.kernels.telling]:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self._tasks = []
        self.sampler.remove_listener(self._on_sample_in_thread)
        await asyncio.get_running_loop().run_in_executor(None, self.sampler.stop)
        self._started = False

    async def wait_for_sample(self, timeout: float = 10.0) -> dict[str, Any] | None:
        """The current answer, waiting for the first sample if there is none yet."""
        if self.current is None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._first_sample.wait(), timeout)
        return self.current

    async def current_answer(self, timeout: float = 10.0) -> dict[str, Any] | None:
        """The latest sample's answer, with the watchdog's events as of now."""
        current = await self.wait_for_sample(timeout)
        if current is None:
            return None
        return {**current, "watchdog": self.watchdog_state()}

    @staticmethod
    async def _every(period: float, fn: Callable[[], Any]) -> None:
        while True:
            try:
                await fn()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("gpushare periodic task failed")
            await asyncio.sleep(period)

    async def _heartbeats(self) -> None:
        """Send the first heartbeat as soon as the first sample is in (at most
        ``first_heartbeat_within_s`` after start; until a sample comes, try again every
        sample interval), then one every ``heartbeat_interval_s``."""
        c = self.config
        await self.wait_for_sample(c.first_heartbeat_within_s)
        sent = False
        while True:
            try:
                sent = await self.broker_talk.heartbeat() is not None or sent
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("gpushare heartbeat failed")
            await asyncio.sleep(
                c.heartbeat_interval_s if sent else min(c.interval_s, c.heartbeat_interval_s)
            )

    @property
    def events(self) -> deque[dict[str, Any]]:
        """The watchdog's events (the enforcer's own, not a copy)."""
        return self.enforcer.events

    async def grant_answer(self) -> dict[str, Any]:
        """The ``/gpushare/api/grant`` answer (asks the broker)."""
        return await self.broker_talk.grant_answer()

    async def team_answer(self) -> dict[str, Any]:
        """The ``/gpushare/api/team`` answer (asks the broker)."""
        return await self.broker_talk.team_answer()

    @property
    def simulated_sampler(self) -> SimulatedSampler | None:
        """The simulated sampler, when one is in use (test and demo hook)."""
        s = underlying(self.sampler)
        return s if isinstance(s, SimulatedSampler) else None

    # -- per sample ----------------------------------------------------------------
    def _on_sample_in_thread(self, sample: Sample) -> None:
        """Sampler thread: attribute (psutil) off the loop, then hand over."""
        kernels = self.kernels.running
        tree = collect_process_tree(self.server_pid, kernels)
        att = attribute(sample, self.grant.gpu_uuids, tree, kernels)
        elsewhere = self.host_elsewhere()
        host = HostUse(RESOURCE_USAGE) if elsewhere else self.host_meter.measure()
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._on_sample, sample, att, host)

    def _on_sample(self, sample: Sample, att: Attribution, host: HostUse | None = None) -> None:
        """Event loop: watchdog, hints, timeline, stream fan-out."""
        self.attribution = att
        limit = self.grant.memory_limit_mib
        pts = usage_points(sample.ts, att)
        self.points.extend(pts)
        self.timeline.append({"ts": sample.ts, "gpus": [g.to_dict(limit) for g in att.gpus]})
        if self.watchdog is not None:
            for v in self.watchdog.check(att, sample.ts):
                asyncio.ensure_future(self.enforcer.enforce(v))
        if sample.ts - self._hints_at >= HINTS_EVERY_S:  # minutes-long window: no need per tick
            self._hints, self._hints_at = self.hints(sample.ts), sample.ts
        hints = self._hints
        self.current = self.answer(sample, att, hints)
        if host is not None:
            self.current["host"] = host.to_dict()
        self.current_json = json.dumps({"type": "sample", **self.current, "sent_ts": time.time()})
        self._first_sample.set()
        self.broadcast(self.current_json)

    def hints(self, now: float) -> list[LowUtilHint]:
        c = self.config
        return low_util_hints(
            self.points,
            now,
            c.low_util_window_s,
            c.low_util_threshold_pct,
            c.low_util_min_memory_mib,
            c.interval_s,
        )

    def answer(self, sample: Sample, att: Attribution, hints: list[LowUtilHint]) -> dict[str, Any]:
        """The ``/gpushare/api/metrics`` answer for one sample."""
        limit = self.grant.memory_limit_mib
        return {
            "ts": sample.ts,
            "simulated": sample.simulated,
            "source": sample.source,
            "error": sample.error,
            "notes": [*sample.notes, *([att.note] if att.note else [])],
            "sampler": self.sampler.describe(),
            "grant": self.grant_summary(),
            "limits": self.grant.limits(),
            "gpus": [g.to_dict(limit) for g in att.gpus],
            "attribution": att.to_dict(limit),
            "hints": [h.to_dict() for h in hints],
            "watchdog": self.watchdog_state(),
        }

    def grant_summary(self) -> dict[str, Any]:
        g = self.grant
        if not g.has_grant:
            return {"has_grant": False, "status": "no grant"}
        return {
            "has_grant": True,
            "grant_id": g.grant_id,
            "profile": g.profile,
            "team": g.team,
            "pool": g.pool,
            "borrowed": g.borrowed,
            "units": g.units,
            "gpu_uuids": list(g.gpu_uuids),
        }

    def watchdog_state(self) -> dict[str, Any]:
        return {
            "active": self.watchdog is not None,
            "reason": self.watchdog_reason,
            "action": self.config.watchdog_action,
            "events": list(self.events)[-20:],
        }

    # -- stream --------------------------------------------------------------------
    def subscribe(self, send: Sender) -> None:
        self.subscribers.add(send)
        for msg in self.broker_talk.notice_messages:
            send(msg)
        if self.current_json is not None:
            send(self.current_json)

    def unsubscribe(self, send: Sender) -> None:
        self.subscribers.discard(send)

    def broadcast(self, message: str) -> None:
        for send in list(self.subscribers):
            try:
                send(message)
            except Exception:
                self.subscribers.discard(send)

    def history_answer(self, since: float | None = None) -> dict[str, Any]:
        items = [t for t in self.timeline if since is None or t["ts"] > since]
        return {
            "simulated": self.sampler.simulated,
            "interval_s": self.config.interval_s,
            "history_s": self.config.history_s,
            "limits": self.grant.limits(),
            "samples": items,
        }
