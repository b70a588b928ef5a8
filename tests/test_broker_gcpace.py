"""The garbage collector's pacer (``broker/ops/gcpace.py``): each step collects what is not frozen
and freezes the survivors, so that the grants admitted since start never pile up for one
long full collection; cyclic garbage is collected, never frozen; a stopped broker gives
what it froze back."""

from __future__ import annotations

import asyncio
import gc
import weakref
from typing import Any

from brokerkit import call, start_broker, static_tokens
from brokerpolicies import bench, small
from corefactory import request

from jupyter_gpushare.broker.ops.gcpace import CollectorPacer
from jupyter_gpushare.broker.service.broker import Broker
from jupyter_gpushare.broker.store.db import make_engine


class _Node:
    def __init__(self) -> None:
        self.other: Any = None


def _unfrozen() -> int:
    return len(gc.get_objects())  # gen 0-2 only: frozen objects are not listed


def test_step_freezes_what_lives_and_collects_cycles_first(tmp_path: Any) -> None:
    pacer = CollectorPacer(0)
    try:
        engine = make_engine(f"sqlite:///{tmp_path}/gc.sqlite")
        b = Broker(bench(), engine)
        b.load()
        pacer.step()
        before = _unfrozen()
        for i in range(600):  # live grants: ~10 objects each that the collector would scan
            b.submit(request(f"t{i % 20}", "shared", fraction=0.125, user=f"u{i}"))
        for i in range(300):  # and admissions released at once
            b.submit(request("t1", "shared", fraction=0.25, user=f"r{i}"))
            b.release(next(reversed(b.state.grants)))
        assert len(b.state.grants) == 600
        grown = _unfrozen() - before
        assert grown > 3000
        # a garbage cycle made just before the step is collected, not frozen
        a, c = _Node(), _Node()
        a.other, c.other = c, a
        dead = weakref.ref(a)
        del a, c
        found = pacer.step()
        assert dead() is None
        assert found >= 2
        # what survived is frozen: the next full collection has almost nothing to scan
        assert _unfrozen() - before < grown // 20, (grown, _unfrozen() - before)
        # a released grant's objects are freed by their reference count, frozen or not
        gid = next(iter(b.state.grants))
        ref = weakref.ref(b.state.grants[gid])
        b.release(gid)
        assert ref() is None
        b.close()
        engine.dispose()
    finally:
        pacer.steps = max(1, pacer.steps)
        pacer.stop()  # unfreezes


def test_the_broker_steps_on_its_loop_and_gives_back_on_stop(tmp_path: Any) -> None:
    async def scenario() -> tuple[int, int, int]:
        app = await start_broker(
            small(), f"sqlite:///{tmp_path}/app.sqlite", static_tokens({"alice": ["a"]}),
            gc_pace_interval_s=0.05,
        )
        try:
            for i in range(20):
                status, _ = await call(app, "POST", "/requests", "tok-spawner", {
                    "user": f"u{i}", "server": "", "groups": ["a"], "pool": "shared",
                    "gpu": {"fraction": 0.125},
                })
                assert status == 201
            await asyncio.sleep(0.3)
            steps, frozen = app.gc_pacer.steps, gc.get_freeze_count()
        finally:
            await app.stop_async()
        return steps, frozen, gc.get_freeze_count()

    steps, frozen, after = asyncio.run(scenario())
    assert steps >= 2
    assert frozen > 0
    assert after == 0  # stop gave everything back to the collector


def test_interval_zero_never_steps() -> None:
    async def scenario() -> int:
        pacer = CollectorPacer(0)
        pacer.start()
        await asyncio.sleep(0.05)
        pacer.stop()
        return pacer.steps

    assert asyncio.run(scenario()) == 0
