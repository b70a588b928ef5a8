"""Carrying out preemption: notices, deadlines, stopping victims, granting the waiter.

When the core plans a preemption the service records the victims and calls
:meth:`PreemptionRunner.preemption_planned`. The runner

1. publishes a notice per victim (``GET /notices`` and the ``/notices/stream`` SSE feed),
2. at the deadline (the victims' grace period), asks the hub to stop victim servers
   (``DELETE /users/{name}/servers/{server}``) and the batch backend to preempt victim jobs,
3. releases the victims, then decides again on the waiting request (which now fits).

A victim that leaves earlier (its holder releases the grant) shortens the wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from traitlets.config import LoggingConfigurable

from ...core.grant_end import EndKind, GrantEnd
from ...core.model import Grant, Kind
from ..hubclient import HubClient, HubError

if TYPE_CHECKING:
    from .broker import Broker

log = logging.getLogger("gpushare.broker.preempt")
SPAWN_ANSWER_S = 10.0
"""A victim's server still being spawned is stopped once its spawn is this old: JupyterHub's
``slow_spawn_timeout`` (10 s), after which the spawn's request has been answered (202); a
stop before then makes the hub answer that request 500 (found by the soak harness)."""


class BatchBackend(LoggingConfigurable):
    """Where batch jobs run; the broker asks it to preempt jobs and whether a job lives.

    Subclass and name it in ``BrokerApp.batch_backend_class``. The default knows no jobs:
    it never preempts anything itself (the grant is still released) and answers
    ``None`` (unknown) to liveness checks, so reconciliation leaves batch grants alone.
    """

    async def preempt(self, grant: Grant, reason: str) -> None:
        log.info(
            "no batch backend: grant %s (job %s) is released without a signal",
            grant.id,
            grant.request.holder,
        )

    async def job_alive(self, grant: Grant) -> bool | None:
        return None


class NoticeHub:
    """Fan-out of preemption notices to stream subscribers."""

    def __init__(self) -> None:
        self.subscribers: set[asyncio.Queue[dict[str, Any]]] = set()

    def subscribe(self) -> asyncio.Queue[dict[str, Any]]:
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(maxsize=1000)
        self.subscribers.add(queue)
        return queue

    def unsubscribe(self, queue: asyncio.Queue[dict[str, Any]]) -> None:
        self.subscribers.discard(queue)

    @staticmethod
    def wake(queue: asyncio.Queue[dict[str, Any]], marker: dict[str, Any]) -> None:
        """Wake one subscriber's loop (its client left) without telling anyone else."""
        with contextlib.suppress(asyncio.QueueFull):
            queue.put_nowait(marker)

    def publish(self, notice: dict[str, Any]) -> None:
        for queue in list(self.subscribers):
            with contextlib.suppress(asyncio.QueueFull):
                queue.put_nowait(notice)


def _loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


class PreemptionRunner:
    """The service's :class:`~.service.Effects`: timers and calls to hub and batch backend."""

    def __init__(
        self,
        hub: HubClient | None,
        backend: BatchBackend | None,
        notices: NoticeHub | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.hub = hub
        self.backend = backend or BatchBackend()
        self.notices = notices or NoticeHub()
        self.broker: Broker | None = None
        self.timers: dict[str, asyncio.TimerHandle] = {}
        self.tasks: set[asyncio.Task[Any]] = set()
        self.clock = clock

    # Effects -------------------------------------------------------------------------------

    def notice(self, notice: dict[str, Any]) -> None:
        self.notices.publish(notice)

    def preemption_planned(self, request_id: str, victims: list[Grant], deadline: float) -> None:
        loop = _loop()
        if loop is None or self.broker is None:
            return
        old = self.timers.pop(request_id, None)
        if old:
            old.cancel()
        delay = max(0.0, deadline - self.broker.clock())
        self.timers[request_id] = loop.call_later(delay, self._spawn, request_id)

    def preemption_cancelled(self, request_id: str) -> None:
        timer = self.timers.pop(request_id, None)
        if timer:
            timer.cancel()

    def retry_soon(self, request_id: str) -> None:
        loop = _loop()
        if loop is None:
            return
        self.preemption_cancelled(request_id)
        loop.call_soon(self._retry, request_id)

    # work ----------------------------------------------------------------------------------

    def _retry(self, request_id: str) -> None:
        if self.broker is None:
            return
        try:
            self.broker.retry(request_id)
        except Exception:
            log.exception("retrying request %s failed", request_id)

    def _spawn(self, request_id: str) -> None:
        self.timers.pop(request_id, None)
        task = asyncio.ensure_future(self.execute(request_id))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def execute(self, request_id: str) -> None:
        """The deadline passed: stop the victims that are still there, then retry."""
        broker = self.broker
        if broker is None:
            return
        pend = broker.pending.get(request_id)
        if pend is None:
            return
        victims = [broker.state.grants[v] for v in sorted(pend.victims) if v in broker.state.grants]
        for grant in victims:
            reason = broker.preempt_info.get(grant.id, (pend.reason, 0.0))[0]
            try:
                if grant.request.kind is Kind.INTERACTIVE:
                    if self.hub is not None:
                        await self.hub.stop_server(
                            grant.user, grant.request.holder, let_spawn_answer_s=SPAWN_ANSWER_S
                        )
                else:
                    await self.backend.preempt(grant, reason)
            except (HubError, OSError) as exc:
                log.warning(
                    "could not stop the holder of grant %s: %s (releasing anyway)", grant.id, exc
                )
            except Exception:
                log.exception(
                    "batch backend failed to preempt grant %s (releasing anyway)", grant.id
                )
        for grant in victims:
            if grant.id in broker.state.grants:
                why = f"preempted: {pend.reason}"
                end = GrantEnd(EndKind.PREEMPTED, why, request_id, pend.request.team)
                broker.release(grant.id, why, drain=False, end=end)
                log.info(
                    "preempted grant %s of %s for request %s", grant.id, grant.user, request_id
                )
        try:
            broker.retry(request_id)
            broker.drain_queue(pend.request.pool)
        except Exception:
            log.exception("granting request %s after preemption failed", request_id)

    def close(self) -> None:
        for timer in self.timers.values():
            timer.cancel()
        self.timers.clear()
