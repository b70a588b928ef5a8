"""Notices to the holders of grants (a coming preemption, an idle warning, a policy change):
``GET /api/v1/notices`` and the server-sent event stream ``/api/v1/notices/stream``.

A user reads only their own notices (a service acting for users may name one); each stream
counts against its caller (``BrokerLimits.max_notice_streams_per_user``) and all of them
against ``max_notice_subscribers``.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from tornado.iostream import StreamClosedError

from ..errors import BrokerError
from ..service.fields import shorten
from .handler_base import BaseHandler


class NoticesHandler(BaseHandler):
    def _user_filter(self) -> str | None:
        user = self.arg("user")
        if not self.identity.act_as:
            self.require(user in (None, self.identity.name), "you may read only your own notices")
            user = self.identity.name
        return user

    def get(self) -> None:
        user = self._user_filter()
        self.send({"notices": self.ctx.broker.notices(user=user, grant_id=self.arg("grant_id"))})


_WAKE: dict[str, Any] = {}  # put in a stream's own queue when its client leaves


class NoticeStreamHandler(NoticesHandler):
    _queue: asyncio.Queue[dict[str, Any]] | None = None

    async def get(self) -> None:  # type: ignore[override]
        user = self._user_filter()
        grant_id = self.arg("grant_id")
        owner = self._claim_stream()
        try:
            await self._stream(user, grant_id)
        finally:
            self._release_stream(owner)

    def _claim_stream(self) -> str:
        """Count this stream against its caller: 429 past ``max_notice_streams_per_user``
        (so one client cannot hold every slot), 503 past ``max_notice_subscribers``."""
        limits = self.ctx.broker.limits
        ident = self.identity
        owner = f"{ident.kind}:{ident.name}"
        per_user = limits.max_notice_streams_per_user
        if per_user > 0 and self.ctx.streams_by_owner[owner] >= per_user:
            raise BrokerError(
                429,
                f"{shorten(ident.name)} already holds {per_user} notice streams, the most "
                "one user may hold (BrokerLimits.max_notice_streams_per_user); close one",
                headers={"Retry-After": "15"},
                code="max_notice_streams_per_user",
            )
        if len(self.ctx.notices.subscribers) >= limits.max_notice_subscribers:
            raise BrokerError(503, "too many notice streams open; try again later")
        self.ctx.streams_by_owner[owner] += 1
        return owner

    def _release_stream(self, owner: str) -> None:
        counts = self.ctx.streams_by_owner
        counts[owner] -= 1
        if counts[owner] <= 0:
            del counts[owner]

    async def _stream(self, user: str | None, grant_id: str | None) -> None:
        self.set_header("Content-Type", "text/event-stream")
        queue = self._queue = self.ctx.notices.subscribe()
        try:
            for notice in self.ctx.broker.notices(user=user, grant_id=grant_id):
                self.write(f"event: preemption\ndata: {json.dumps(notice)}\n\n")
            self.write(": connected\n\n")
            await self.flush()
            while True:
                try:
                    notice = await asyncio.wait_for(queue.get(), timeout=15)
                except asyncio.TimeoutError:
                    self.write(": keep-alive\n\n")
                    await self.flush()
                    continue
                if notice is _WAKE:
                    break
                if user and notice.get("user") != user:
                    continue
                if grant_id and notice.get("grant_id") != grant_id:
                    continue
                self.write(f"event: {notice.get('kind', 'preemption')}\n")
                self.write(f"data: {json.dumps(notice)}\n\n")
                await self.flush()
        except StreamClosedError:
            pass
        finally:
            self.ctx.notices.unsubscribe(queue)

    def on_connection_close(self) -> None:
        # wake only this stream's loop (never a message to the other subscribers)
        if self._queue is not None:
            self.ctx.notices.wake(self._queue, _WAKE)
