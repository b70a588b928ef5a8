"""A reconcile pass over many grants gives the event loop back as it goes, and still
checks every grant (each user's grants in one call to the holder checker)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from brokerpolicies import bench

import jupyter_gpushare.broker.ops.reconcile as reconcile_mod
from jupyter_gpushare.broker.ops.reconcile import HolderChecker, reconcile
from jupyter_gpushare.broker.service.broker import Broker
from jupyter_gpushare.broker.store.db import make_engine
from jupyter_gpushare.core.model import GPUAsk, Grant, Kind, Request

USERS = 150
PER_USER = 4


class HalfGone(HolderChecker):
    """Holders of even-numbered users are gone; records what each call was asked."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.calls: list[list[Grant]] = []

    async def check(self, grants: list[Grant]) -> dict[str, tuple[str, str]]:
        self.calls.append(list(grants))
        return {
            g.id: ("gone", "test") if int(g.user[1:]) % 2 == 0 else ("alive", "test")
            for g in grants
        }


@pytest.fixture()
def broker(tmp_path: Path) -> Broker:
    b = Broker(bench(), make_engine(f"sqlite:///{tmp_path}/rec.sqlite"))
    b.load()
    for i in range(USERS * PER_USER):
        user = f"u{i % USERS}"  # a user's grants are spread over the whole table
        req = Request(id=f"r{i}", user=user, team=f"t{i % 20}", pool="shared",
                      gpu=GPUAsk(fraction_milli=125), priority="interactive",
                      kind=Kind.INTERACTIVE, holder=f"s{i}", created_at=time.time())  # fmt: skip
        assert b.submit(req)["status"] == "granted"
    return b


async def test_reconcile_yields_to_the_loop_and_checks_every_grant(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(reconcile_mod, "SLICE_S", 0.0)  # yield at every chance
    monkeypatch.setattr(reconcile_mod, "BATCH", 50)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    task = asyncio.ensure_future(ticker())
    await asyncio.sleep(0)
    before = ticks
    checker = HalfGone()
    gone = sorted(g.id for g in broker.state.grants.values() if int(g.user[1:]) % 2 == 0)
    result = await reconcile(broker, checker, 0)
    during = ticks - before
    task.cancel()
    # the loop ran other work all along the pass, not once at its end
    assert during >= USERS * PER_USER // 16, during
    assert result["checked"] == USERS * PER_USER
    assert sorted(r["grant_id"] for r in result["released"]) == gone
    assert len(broker.state.grants) == USERS * PER_USER - len(gone)
    # every grant checked once, in calls of about BATCH; each user's grants in one call
    seen = [g.id for call in checker.calls for g in call]
    assert len(seen) == len(set(seen)) == USERS * PER_USER
    assert all(len(call) <= 50 + PER_USER for call in checker.calls)
    assert len(checker.calls) > 1
    for call in checker.calls:
        users = {g.user for g in call}
        for other in checker.calls:
            if other is not call:
                assert not users & {g.user for g in other}


async def test_each_pause_lets_a_task_of_many_steps_through(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An HTTP answer is several steps on the loop, each woken by the one before: a pause
    of the pass must let such a task take many of them, not one (a bare ``sleep(0)`` made
    a five-step answer wait five slices of the pass)."""
    monkeypatch.setattr(reconcile_mod, "SLICE_S", 0.0)  # pause at every chance
    steps = 0

    async def stepper() -> None:
        nonlocal steps
        while True:
            steps += 1
            await asyncio.sleep(0)

    seen: list[int] = []
    original = reconcile_mod._Pause.__call__

    async def pause(self: Any, force: bool = False) -> None:
        before = steps
        await original(self, force)
        seen.append(steps - before)

    monkeypatch.setattr(reconcile_mod._Pause, "__call__", pause)
    task = asyncio.ensure_future(stepper())
    await asyncio.sleep(0)
    result = await reconcile(broker, HalfGone(), 0)
    task.cancel()
    assert result["checked"] == USERS * PER_USER
    assert len(seen) > 10
    assert sorted(seen)[len(seen) // 2] >= 5, seen[:20]  # (the median: a loaded machine)
