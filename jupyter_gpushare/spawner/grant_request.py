"""Asking the broker for a grant when a server starts: the request (with its idempotency
key), the wait in the broker's queue with the position, the expected wait or the countdown
while borrowed capacity is reclaimed shown on the progress page, and the spawn errors that
end it (refused, queue timeout, broker unreachable).

A mixin of :class:`~.mixin.GPUShareSpawner`, whose settings and progress events it uses.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import TYPE_CHECKING, Any, TypeAlias

from jupyter_gpushare.broker.client import BrokerError, GrantInfo, RequestAnswer
from jupyter_gpushare.spawner import form as formlib
from jupyter_gpushare.spawner.errors import spawn_error
from jupyter_gpushare.spawner.time_text import _clock, _duration, _iso, _parse_iso

if TYPE_CHECKING:
    from jupyterhub.spawner import Spawner

    from jupyter_gpushare.broker.client import BrokerClient

    _SpawnerPart: TypeAlias = Spawner  # what it is mixed into: mypy checks its attributes
else:
    _SpawnerPart = object  # no traits of its own: the settings are GPUShareSpawner's

REASON_CHARS = 400
"""Characters of a broker's reason that a spawn error or progress message (and so the hub's
log) quotes; the rest is cut ("… (N characters)"): a reason may echo what a user sent."""


class GrantRequestMixin(_SpawnerPart):
    """A grant asked of the broker, waited for in its queue (mixed into the spawner)."""

    if TYPE_CHECKING:
        queue_timeout: float
        queue_poll_interval: float
        countdown_interval: float
        gpushare_request_id: str | None

        @property
        def broker(self) -> BrokerClient: ...

        def user_groups(self) -> list[str]: ...

        def _event(self, progress: int, message: str, **extra: Any) -> None: ...

    def _waiting_event(self, answer: RequestAnswer, label: str) -> None:
        data: dict[str, Any] = {
            "status": answer.status,
            "position": answer.position,
            "request_id": answer.request_id,
        }
        if answer.status == "preempting":
            msg = f"Reclaiming borrowed GPU capacity for {label}: " + (
                answer.reason or "the borrowing servers get their grace period"
            )
            deadline = _parse_iso(answer.raw.get("deadline"))
            if deadline is None and answer.expected_wait_s is not None:
                deadline = time.time() + float(answer.expected_wait_s)
            if deadline is not None:
                # the broker's own deadline: the victims' grace period ends then
                left = max(0.0, deadline - time.time())
                data["deadline"] = _iso(deadline)
                data["seconds_left"] = round(left)
                msg += (
                    f"; the borrowers are stopped at {_clock(deadline)} "
                    f"(in {_duration(left)}), then your server starts"
                )
        else:
            pos = f"position {answer.position}" if answer.position else "waiting"
            wait = (
                f", expected wait about {max(1, round(answer.expected_wait_s / 60))} min"
                if answer.expected_wait_s
                else ""
            )
            msg = f"Queued for {label}: {pos}{wait}" + (
                f" ({formlib.clip(answer.reason, REASON_CHARS)})" if answer.reason else ""
            )
        self._event(10, msg, gpushare=data)

    async def _wait_in_queue(self, answer: RequestAnswer, label: str) -> RequestAnswer:
        deadline = time.monotonic() + self.queue_timeout
        last: tuple[Any, ...] | None = None
        told = float("-inf")
        while answer.pending:
            note = (answer.status, answer.position)
            now = time.monotonic()
            left = answer.expected_wait_s
            if answer.status == "preempting" and answer.raw.get("deadline"):
                left = (_parse_iso(answer.raw.get("deadline")) or time.time()) - time.time()
            every = self.countdown_interval if (left or 0) > 10 else 1.0
            countdown = answer.status == "preempting" and left is not None and now - told >= every
            if note != last or countdown:
                last, told = note, now
                self._waiting_event(answer, label)
            if time.monotonic() > deadline:
                await self._cancel_request(answer.request_id)
                raise spawn_error(
                    f"No GPU share for {label} after waiting {self.queue_timeout:.0f} s in the "
                    "queue; the request was withdrawn. Try a smaller profile or later.",
                    reason="gpushare-queue-timeout",
                    status_code=503,
                )
            await asyncio.sleep(self.queue_poll_interval)
            answer = await self.broker.get_request(answer.request_id)
        return answer

    async def _cancel_request(self, request_id: str) -> None:
        try:
            await self.broker.cancel_request(request_id)
        except BrokerError as exc:
            self.log.warning("gpushare: could not cancel request %s: %s", request_id, exc)

    async def acquire_grant(self, slug: str, label: str) -> GrantInfo:
        key = f"{self.user.name}/{self.name}/{uuid.uuid4().hex}"
        try:
            answer = await self.broker.request(
                user=self.user.name,
                server=self.name,
                groups=self.user_groups(),
                profile=slug,
                idempotency_key=key,
            )
        except BrokerError as exc:
            status = exc.status if 400 <= exc.status < 500 else 503
            raise spawn_error(
                f"The GPU broker could not take the request for {label}: "
                f"{formlib.clip(exc.reason, REASON_CHARS)}",
                reason="gpushare-broker",
                status_code=status,
            ) from None
        self.gpushare_request_id = answer.request_id
        try:
            answer = await self._wait_in_queue(answer, label)
        except asyncio.CancelledError:
            # the hub gave up (start_timeout) or the user cancelled: leave the queue
            await asyncio.shield(self._cancel_request(answer.request_id))
            raise
        except BrokerError as exc:
            await self._cancel_request(answer.request_id)
            raise spawn_error(
                f"Lost contact with the GPU broker while waiting for {label}: "
                f"{formlib.clip(exc.reason, REASON_CHARS)}",
                reason="gpushare-broker",
                status_code=503,
            ) from None
        if answer.status != "granted" or answer.grant is None:
            code = (answer.code or "").lower()
            status = 403 if code in ("forbidden", "not_allowed", "not-allowed") else 409
            raise spawn_error(
                f"Cannot start {label}: "
                f"{formlib.clip(answer.reason or 'refused by the GPU broker', REASON_CHARS)}",
                reason=f"gpushare-{code or 'refused'}",
                status_code=status,
            )
        return answer.grant
