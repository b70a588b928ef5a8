"""Telemetry runtime inside the single-user server.

The sampler thread samples, walks this server's process tree and attributes usage
(no event-loop time spent on NVML or psutil); the event loop then runs the watchdog and
the hints, keeps the timeline, fans samples out to stream clients and sends heartbeats.
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
from dataclasses import dataclass, field
from typing import Any

from jupyter_core.utils import ensure_async

from ..telemetry.attribution import (
    Attribution,
    KernelInfo,
    attribute,
    collect_process_tree,
)
from ..telemetry.broker_link import BrokerAnswer, BrokerLink, heartbeat_body
from ..telemetry.factory import make_sampler, underlying
from ..telemetry.grant import GrantInfo
from ..telemetry.hints import LowUtilHint, UsagePoint, low_util_hints, usage_points
from ..telemetry.model import Sample
from ..telemetry.sampler import Sampler, capacity_for
from ..telemetry.simulated import SimulatedSampler
from ..telemetry.watchdog import ACTIONS, LimitWatchdog, Violation, watchdog_applies
from .hostuse import RESOURCE_USAGE, HostMeter, HostUse
from .kernel_messages import run_in_kernel, watcher_code
from .notices import notice_text, notices_of, with_time_left
from .process_stop import pid_alive, stop_process, where_is, write_to_terminal
from .watchdog_repeat import RepeatGuard

log = logging.getLogger(__name__)

Sender = Callable[[str], None]


@dataclass
class ServiceConfig:
    """Everything configurable (filled from the ExtensionApp's traitlets)."""

    sampler: str = "auto"
    interval_s: float = 1.0
    history_s: float = 900.0
    watchdog_action: str = "restart"
    watchdog_enabled: bool = True
    watchdog_grace_samples: int = 2
    watchdog_cooldown_s: float = 10.0
    watchdog_kill_grace_s: float = 5.0
    low_util_threshold_pct: float = 20.0
    low_util_window_s: float = 300.0
    low_util_min_memory_mib: float = 1024.0
    heartbeat_interval_s: float = 60.0
    # the first heartbeat goes out once the first sample is in, at most this long after start
    # (then every heartbeat_interval_s): the first minute of a server is measured too
    first_heartbeat_within_s: float = 3.0
    notices_interval_s: float = 5.0
    notices_to_kernels: bool = True
    broker_timeout_s: float = 5.0
    simulated_gpu_count: int = 2
    simulated_gpu_model: str = "H200-sim"
    simulated_gpu_memory_mib: int = 143771
    simulated_kernel_memory_mib: int = 0
    simulated_background_load: bool = True
    api_token: str = field(default_factory=lambda: os.environ.get("JUPYTERHUB_API_TOKEN", ""))


HINTS_EVERY_S = 5.0
VERBS = {"interrupt": "interrupted", "restart": "restarted", "shutdown": "shut down"}


class TelemetryService:
    """Owns the sampler, the watchdog, the timeline and the stream subscribers."""

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
        self.broker = BrokerLink(self.grant.broker_url, config.api_token, config.broker_timeout_s)
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
        self.events: deque[dict[str, Any]] = deque(maxlen=100)
        self.host_meter = HostMeter(self.server_pid)
        self.repeats = RepeatGuard()
        # set by the extension: True where jupyter-resource-usage measures the host instead
        self.host_elsewhere: Callable[[], bool] = lambda: False
        self.current: dict[str, Any] | None = None
        self.current_json: str | None = None
        self.attribution: Attribution | None = None
        self.kernels: tuple[KernelInfo, ...] = ()
        self.subscribers: set[Sender] = set()
        self.last_heartbeat: dict[str, Any] | None = None
        self.seen_notices: set[str] = set()
        self.notice_messages: list[str] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        self._started = False
        self._first_sample = asyncio.Event()
        self._telling: set[asyncio.Future[Any]] = set()
        self._watched: set[str] = set()  # kernels that run the notice watcher
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
        await self.refresh_kernels()
        self.sampler.add_listener(self._on_sample_in_thread)
        self.sampler.start()
        self._tasks = [
            asyncio.ensure_future(self._every(self.config.interval_s, self.refresh_kernels)),
            asyncio.ensure_future(self._heartbeats()),
            asyncio.ensure_future(self._every(self.config.notices_interval_s, self.poll_notices)),
        ]

    async def stop(self) -> None:
        for t in [*self._tasks, *self._telling]:
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
                sent = await self.heartbeat() is not None or sent
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("gpushare heartbeat failed")
            await asyncio.sleep(c.heartbeat_interval_s if sent else min(
                c.interval_s, c.heartbeat_interval_s))

    @property
    def simulated_sampler(self) -> SimulatedSampler | None:
        """The simulated sampler, when one is in use (test and demo hook)."""
        s = underlying(self.sampler)
        return s if isinstance(s, SimulatedSampler) else None

    # -- kernels -------------------------------------------------------------------
    async def refresh_kernels(self) -> None:
        """Read this server's kernels: id, process id and notebook path."""
        km = self.kernel_manager
        if km is None:
            return
        paths: dict[str, str] = {}
        if self.session_manager is not None:
            with contextlib.suppress(Exception):
                for s in await self.session_manager.list_sessions():
                    kid = (s.get("kernel") or {}).get("id")
                    if kid:
                        paths[kid] = s.get("path") or s.get("name") or ""
        infos = []
        for kid in list(km.list_kernel_ids()):
            try:
                k = km.get_kernel(kid)
            except KeyError:
                continue
            proc = getattr(getattr(k, "provisioner", None), "process", None)
            pid = getattr(proc, "pid", None)
            name = getattr(k, "kernel_name", "")
            infos.append(KernelInfo(kid, pid, paths.get(kid) or None, name))
        self.kernels = tuple(infos)
        self._watch_kernels()
        self._simulate_kernel_memory()

    def kernel_activity_ts(self) -> float | None:
        """The latest activity of this server's kernels (epoch seconds; now if one is busy)."""
        km = self.kernel_manager
        if km is None:
            return None
        latest: float | None = None
        for kid in list(km.list_kernel_ids()):
            try:
                k = km.get_kernel(kid)
            except KeyError:
                continue
            if getattr(k, "execution_state", "") == "busy":
                return time.time()
            last = getattr(k, "last_activity", None)
            if last is not None and hasattr(last, "timestamp"):
                latest = max(latest or 0.0, last.timestamp())
        return latest

    def _simulate_kernel_memory(self) -> None:
        sim = self.simulated_sampler
        mib = self.config.simulated_kernel_memory_mib
        if sim is None or mib <= 0:
            return
        have = sim.process_memory()
        for k in self.kernels:
            if k.pid is not None and k.pid not in have:
                sim.set_process_memory(k.pid, mib)

    # -- per sample ----------------------------------------------------------------
    def _on_sample_in_thread(self, sample: Sample) -> None:
        """Sampler thread: attribute (psutil) off the loop, then hand over."""
        kernels = self.kernels
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
        self.timeline.append(
            {"ts": sample.ts, "gpus": [g.to_dict(limit) for g in att.gpus]}
        )
        if self.watchdog is not None:
            for v in self.watchdog.check(att, sample.ts):
                asyncio.ensure_future(self.enforce(v))
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
            self.points, now, c.low_util_window_s, c.low_util_threshold_pct,
            c.low_util_min_memory_mib, c.interval_s,
        )

    def answer(
        self, sample: Sample, att: Attribution, hints: list[LowUtilHint]
    ) -> dict[str, Any]:
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
        for msg in self.notice_messages:
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

    # -- watchdog action -----------------------------------------------------------
    async def enforce(self, v: Violation) -> dict[str, Any]:
        """Stop the offending kernel or process as configured and tell the user why."""
        action = self.config.watchdog_action
        text = v.message
        outcome = "no process to act on"
        extra: dict[str, Any] = {}
        tell: str | None = None  # the kernel told after the event is out (it may not answer)
        if v.kernel_id is not None and self.kernel_manager is not None:
            action, why = self.repeats.decide(v.kernel_id, action, v.ts)
            extra["times"] = self.repeats.count(v.kernel_id)
            text = f"{v.message}; the kernel was {VERBS[action]}{why}"
            log.error("gpushare watchdog: %s (kernel %s)", text, v.kernel_id)
            outcome = await self._act(action, v.kernel_id)
            if action != "shutdown" and outcome == "done":
                tell = v.kernel_id
        elif v.pid is not None:
            loop = asyncio.get_running_loop()
            where = await loop.run_in_executor(None, self._where, v.pid)
            cmd, terminal = where
            extra = {"process": cmd, "terminal": terminal}
            grace = self.config.watchdog_kill_grace_s
            outcome = await self._stop_process(v.pid, grace)
            how = (
                "stopped (SIGTERM)" if outcome == "terminated"
                else f"killed (SIGKILL, {grace:g} s after SIGTERM)" if outcome == "killed"
                else "already gone" if outcome == "gone" else f"not stopped ({outcome})"
            )
            shown = f" ({cmd})" if cmd else ""
            text = v.message.replace(
                f"process {v.pid} ", f"process {v.pid}{shown} ", 1
            ) + f"; it was {how}"
            log.error("gpushare watchdog: %s", text)
            if terminal is not None:
                self.tell_terminal(terminal, text)
            if self.simulated_sampler is not None:
                self._forget_dead_simulated()
        else:
            log.error("gpushare watchdog: %s", text)
        event = {"type": "watchdog", "level": "error", "message": text, "action": action,
                 "outcome": outcome, **v.to_dict(), **extra}
        event["message"] = text
        self.events.append(event)
        self.broadcast(json.dumps(event))
        if tell is not None:
            await self.tell_kernel(tell, text)
        return event

    def _where(self, pid: int) -> tuple[str, str | None]:
        """The process's command line and the terminal it runs in (blocking: psutil)."""
        return where_is(pid, self._terminals())

    def _terminals(self) -> dict[str, Any]:
        tm = self.terminal_manager
        terms = getattr(tm, "terminals", None)
        return dict(terms) if isinstance(terms, dict) else {}

    async def _stop_process(self, pid: int, grace_s: float) -> str:
        return await stop_process(pid, grace_s)

    def tell_terminal(self, name: str, text: str) -> bool:
        """Write the message into the terminal the process ran in."""
        return write_to_terminal(self._terminals().get(name), text)

    async def _act(self, action: str, kernel_id: str) -> str:
        km = self.kernel_manager
        try:
            if action == "interrupt":
                await ensure_async(km.interrupt_kernel(kernel_id))
            elif action == "restart":
                await ensure_async(km.restart_kernel(kernel_id))
            else:
                await ensure_async(km.shutdown_kernel(kernel_id))
        except Exception as exc:
            log.error("gpushare watchdog could not %s kernel %s: %s", action, kernel_id, exc)
            return f"failed: {exc}"
        if self.simulated_sampler is not None and action != "interrupt":
            self._forget_dead_simulated()
        return "done"

    def _forget_dead_simulated(self) -> None:
        sim = self.simulated_sampler
        if sim is None:
            return
        for pid in sim.process_memory():
            # a killed process its parent has not reaped yet is a zombie: dead, using nothing
            if not pid_alive(pid):
                sim.set_process_memory(pid, 0)

    def _watch_kernels(self) -> None:
        """Start the notice watcher in each new kernel of a server with a grant."""
        ids = {k.kernel_id for k in self.kernels}
        self._watched &= ids  # bounded by the live kernels
        if not (self.config.notices_to_kernels and self.grant.grant_id and self.broker.configured):
            return
        code = watcher_code(
            self.config.notices_interval_s, max(15.0, 2 * self.config.notices_interval_s)
        )
        for kid in sorted(ids - self._watched):
            self._watched.add(kid)
            task = asyncio.ensure_future(self.run_code(kid, code))
            self._telling.add(task)
            task.add_done_callback(self._telling.discard)

    async def tell_kernel(self, kernel_id: str, text: str) -> bool:
        """Write the message to the kernel's stderr (it reaches every attached frontend)."""
        code = (
            "import sys as _gs_sys; "
            f"_gs_sys.stderr.write({json.dumps('[gpushare] ' + text)} + '\\n'); "
            "_gs_sys.stderr.flush(); del _gs_sys"
        )
        return await self.run_code(kernel_id, code)

    async def run_code(self, kernel_id: str, code: str) -> bool:
        """Run ``code`` in the kernel, silently for the history, and wait for the reply."""
        return await run_in_kernel(self.kernel_manager, kernel_id, code)

    # -- broker --------------------------------------------------------------------
    async def heartbeat(self) -> BrokerAnswer | None:
        """Tell the broker what this grant uses (for GPU-hour accounting)."""
        att, g = self.attribution, self.grant
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
                    self._tell_soon(notice_text(timed))
            left = timed.get("seconds_left")
            last_call = f"{key}#last"
            if (
                isinstance(left, (int, float))
                and 0 < left <= max(15.0, 2 * self.config.notices_interval_s)
                and last_call not in self.seen_notices
                and timed.get("kind", "preemption") != "preemption"
            ):
                self.seen_notices.add(last_call)
                self._tell_soon(notice_text(timed))

    def _tell_soon(self, text: str) -> None:
        """Tell the kernels in the background: a busy kernel answers only after its cell, and
        the notice poll (and the stream) must not wait for it."""
        task = asyncio.ensure_future(self.tell_kernels(text))
        self._telling.add(task)
        task.add_done_callback(self._telling.discard)

    async def tell_kernels(self, text: str) -> None:
        """Write ``text`` into every kernel's output (preemption notices)."""
        if not self.config.notices_to_kernels or self.kernel_manager is None:
            return
        await asyncio.gather(
            *(self.tell_kernel(k.kernel_id, text) for k in self.kernels),
            return_exceptions=True,
        )

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
            return {"team": None, "usage": None, "error": "no grant: no team",
                    "simulated": self.sampler.simulated}
        ans = await self.broker.team_usage(team)
        return {"team": team, "usage": ans.data if ans.ok else None, "error": ans.error,
                "simulated": self.sampler.simulated or self.grant.simulated}

    def history_answer(self, since: float | None = None) -> dict[str, Any]:
        items = [t for t in self.timeline if since is None or t["ts"] > since]
        return {
            "simulated": self.sampler.simulated,
            "interval_s": self.config.interval_s,
            "history_s": self.config.history_s,
            "limits": self.grant.limits(),
            "samples": items,
        }
