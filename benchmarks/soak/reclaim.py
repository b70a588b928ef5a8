"""The reclaim scenario of a soak run: two teams without a training guarantee borrow both
training GPUs, then a team whose guarantee covers one asks for it, as the spawner would.

The owner's request is inside its guarantee, so the broker must preempt a borrower (with
its grace period) and admit it within the stated time; the audit checks both from the
stored rows. Everything goes through the spawner's own ``BrokerClient`` and token.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from .drivers import Faults
from .history import History
from .stack import Stack

HOLDER = "reclaim"  # the server name the scenario's grants are held for


class Reclaimer(threading.Thread):
    def __init__(
        self,
        stack: Stack,
        history: History,
        faults: Faults,
        borrowers: list[str],
        owner: str,
        stop: threading.Event,
        interval_s: float = 30.0,
    ) -> None:
        super().__init__(daemon=True, name="reclaimer")
        self.stack, self.h, self.faults = stack, history, faults
        self.borrowers, self.owner, self.stopping, self.interval_s = (
            borrowers,
            owner,
            stop,
            interval_s,
        )

    def run(self) -> None:
        asyncio.run(self.loop())

    async def loop(self) -> None:
        from jupyter_gpushare.broker.client import BrokerClient

        client = BrokerClient(
            self.stack.broker_url,
            self.stack.tokens()["spawner"],
            request_timeout=30,
            connect_timeout=2,
            retry_window_s=10,
        )
        n = 0
        while not self.stopping.wait(self.interval_s):
            n += 1
            await self.round(client, n)

    async def ask(self, client: Any, user: str, key: str) -> tuple[int, Any]:
        from jupyter_gpushare.broker.client import BrokerError

        t0 = time.time()
        body = {"user": user, "profile": "train-1", "server": HOLDER, "idempotency_key": key}
        try:
            status, answer = await client.call("POST", "/requests", body)
        except BrokerError as exc:
            status, answer = exc.status, str(exc)
        self.h.record(
            "call",
            t=t0,
            client="reclaimer",
            what=f"request {user}",
            method="POST",
            path="/requests",
            status=status,
            ms=round((time.time() - t0) * 1000, 2),
            counts=not self.faults.hit(t0 - 1, time.time() + 1, ("hub",)),
            body=answer if status >= 400 else None,
        )
        return status, answer

    async def round(self, client: Any, n: int) -> None:
        held: list[str] = []
        waiting: list[str] = []
        for user in self.borrowers:
            status, answer = await self.ask(client, user, f"soak-reclaim-{n}-{user}")
            self._keep(answer, held, waiting)
        await asyncio.sleep(1.0)
        t0 = time.time()
        status, answer = await self.ask(client, self.owner, f"soak-reclaim-{n}-{self.owner}")
        mine = self._keep(answer, held, waiting)
        while mine and mine in waiting and time.time() - t0 < 30:
            await asyncio.sleep(0.25)
            granted = await self._granted(client, mine)
            if granted:
                waiting.remove(mine)
                held.append(granted)
        self.h.record(
            "reclaim",
            t=t0,
            owner_waited_s=round(time.time() - t0, 2),
            admitted=bool(mine) and mine not in waiting,
        )
        await self._let_go(client, held, waiting)

    @staticmethod
    def _keep(answer: Any, held: list[str], waiting: list[str]) -> str | None:
        if not isinstance(answer, dict):
            return None
        if answer.get("grant"):
            held.append(answer["grant"]["id"])
            return None
        if answer.get("status") in ("queued", "preempting", "pending") and answer.get("request_id"):
            waiting.append(answer["request_id"])
            return str(answer["request_id"])
        return None

    async def _granted(self, client: Any, request_id: str) -> str | None:
        from jupyter_gpushare.broker.client import BrokerError

        try:
            _, answer = await client.call("GET", f"/requests/{request_id}")
        except BrokerError:
            return None
        grant = (answer or {}).get("grant") if isinstance(answer, dict) else None
        return str(grant["id"]) if grant else None

    async def _let_go(self, client: Any, held: list[str], waiting: list[str]) -> None:
        from jupyter_gpushare.broker.client import BrokerError

        for path in [f"/grants/{g}" for g in held] + [f"/requests/{r}" for r in waiting]:
            t0 = time.time()
            try:
                status, _ = await client.call("DELETE", path)
            except BrokerError as exc:
                status = exc.status
            self.h.record(
                "call",
                t=t0,
                client="reclaimer",
                what="release",
                method="DELETE",
                path=path.split("/")[1],
                status=status,
                ms=round((time.time() - t0) * 1000, 2),
                counts=not self.faults.hit(t0 - 1, time.time() + 1, ("hub",)),
                released=path.rsplit("/", 1)[-1],
            )
