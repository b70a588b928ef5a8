"""The watchdog's action on a violation: stop the offending kernel (interrupt, restart or shut
down, as configured and escalated on repeats) or process (SIGTERM, then SIGKILL), and tell the
user why in the stream, the kernel's output or the process's terminal.

:class:`WatchdogEnforcer` is held by :class:`~.service.TelemetryService` (``service.enforcer``);
it owns the watchdog's events and the count of repeats per kernel, and is handed the managers,
the settings and the ways to tell the user when it is built.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from jupyter_core.utils import ensure_async

from ..telemetry.watchdog import Violation
from .process_stop import pid_alive, stop_process, where_is, write_to_terminal
from .service_config import ServiceConfig
from .watchdog_repeat import RepeatGuard

if TYPE_CHECKING:
    from ..telemetry.simulated import SimulatedSampler

log = logging.getLogger(__name__.rpartition(".")[0] + ".service")  # the service's log, as before

VERBS = {"interrupt": "interrupted", "restart": "restarted", "shutdown": "shut down"}


class WatchdogEnforcer:
    """Acts on the watchdog's violations and keeps the events it told."""

    def __init__(
        self,
        config: ServiceConfig,
        kernel_manager: Any,
        terminal_manager: Any,
        simulated_sampler: Callable[[], SimulatedSampler | None],
        broadcast: Callable[[str], None],
        tell_kernel: Callable[[str, str], Awaitable[bool]],
    ) -> None:
        self.config = config
        self.kernel_manager = kernel_manager
        self.terminal_manager = terminal_manager
        self.simulated_sampler = simulated_sampler  # the simulated sampler in use, if any
        self.broadcast = broadcast  # to the stream's clients
        self.tell_kernel = tell_kernel  # into a kernel's output
        self.repeats = RepeatGuard()
        self.events: deque[dict[str, Any]] = deque(maxlen=100)

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
                "stopped (SIGTERM)"
                if outcome == "terminated"
                else f"killed (SIGKILL, {grace:g} s after SIGTERM)"
                if outcome == "killed"
                else "already gone"
                if outcome == "gone"
                else f"not stopped ({outcome})"
            )
            shown = f" ({cmd})" if cmd else ""
            text = (
                v.message.replace(f"process {v.pid} ", f"process {v.pid}{shown} ", 1)
                + f"; it was {how}"
            )
            log.error("gpushare watchdog: %s", text)
            if terminal is not None:
                self.tell_terminal(terminal, text)
            if self.simulated_sampler() is not None:
                self._forget_dead_simulated()
        else:
            log.error("gpushare watchdog: %s", text)
        event = {
            "type": "watchdog",
            "level": "error",
            "message": text,
            "action": action,
            "outcome": outcome,
            **v.to_dict(),
            **extra,
        }
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
        if self.simulated_sampler() is not None and action != "interrupt":
            self._forget_dead_simulated()
        return "done"

    def _forget_dead_simulated(self) -> None:
        sim = self.simulated_sampler()
        if sim is None:
            return
        for pid in sim.process_memory():
            # a killed process its parent has not reaped yet is a zombie: dead, using nothing
            if not pid_alive(pid):
                sim.set_process_memory(pid, 0)
