"""The refusal tables made ahead on the broker's event loop (``broker/ops/whywarm.py``): once a
pool is near full, the warmer makes the tables of the asks the broker was sent, so that the
first refusal of each reads no node again; ``why_warm_interval_s = 0`` never steps."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from brokerkit import call, start_broker, static_tokens
from brokerpolicies import crash, small
from test_why_warm import counting_reads

from jupyter_gpushare.core import placement_why
from jupyter_gpushare.core.model import SharingMode
from jupyter_gpushare.core.why_table import table_key


def _ask(user: str, gpu: dict[str, Any], team: str = "a") -> dict[str, Any]:
    return {"user": user, "server": "", "groups": [team], "pool": "shared", "gpu": gpu}


async def _fill(app: Any) -> None:
    """Whole GPUs of the shared pool's node until three of its four are held (75 %)."""
    for i in range(3):
        ask = _ask(f"u{i}", {"count": 1})
        status, body = await call(app, "POST", "/requests", "tok-spawner", ask)
        assert status == 201 and body["status"] == "granted", body


async def _tables_made(app: Any, within_s: float = 20.0) -> Any:
    """The refusal tables kept for the broker's state, once the warmer has made one for
    every ask seen (or ``within_s`` has passed: the caller's assertion then says so)."""
    deadline = time.monotonic() + within_s
    while True:
        kept = placement_why._KEPT.get(app.broker.state)
        if kept is not None and kept.asks:
            want = {table_key(r, SharingMode.SHARED) for _, r in kept.asks.values()}
            made = set(kept.tables) >= want
            if made and not any(kept.tables[k].building for k in want):
                return kept
        if time.monotonic() > deadline:
            assert kept is not None, "no refusal tables kept"
            return kept
        await asyncio.sleep(0.02)


def test_the_warmer_makes_the_tables_before_the_first_refusal(tmp_path: Any) -> None:
    async def scenario() -> tuple[int, list[int], str]:
        app = await start_broker(
            small(), f"sqlite:///{tmp_path}/w.sqlite", static_tokens({"alice": ["a"]}),
            why_warm_interval_s=0.01, why_warm_nodes=1,
        )
        try:
            await _fill(app)
            warmer = app.background.warmer
            kept = await _tables_made(app)  # (polled: a fixed sleep was flaky under load)
            want = {table_key(r, SharingMode.SHARED) for _, r in kept.asks.values()}
            assert set(kept.tables) >= want and len(want) == 1
            with counting_reads() as reads:
                _, body = await call(
                    app, "POST", "/requests", "tok-spawner", _ask("v", {"count": 2}, team="b")
                )
            before = warmer.steps
            status, text = await call(app, "GET", "/metrics", "tok-metrics")
            after = warmer.steps  # (the warmer may step while the answer travels)
            assert status == 200
            shown = [ln for ln in text.splitlines()
                     if ln.startswith("gpushare_why_warm_steps_total ")]
            assert shown and before <= float(shown[0].split()[1]) <= after, (shown, before, after)
            seconds = [ln for ln in text.splitlines()
                       if ln.startswith("gpushare_why_warm_seconds_total ")]
            assert seconds and float(seconds[0].split()[1]) > 0, seconds
            return warmer.steps, reads, str(body)
        finally:
            await app.stop_async()

    steps, reads, body = asyncio.run(scenario())
    assert steps >= 1
    assert "no free capacity in the pool: 1 of 4 GPUs free, 2 asked" in body, body
    # the refusal of the 2-GPU ask, seen for the first time, makes its table (one node);
    # the warmer had made the 1-GPU ask's, which this test checked above
    assert reads == [1], reads


def test_interval_zero_never_warms(tmp_path: Any) -> None:
    async def scenario() -> tuple[int, int]:
        app = await start_broker(
            small(), f"sqlite:///{tmp_path}/z.sqlite", static_tokens({"alice": ["a"]}),
            why_warm_interval_s=0,
        )
        try:
            await _fill(app)
            await asyncio.sleep(0.2)
            kept = placement_why._KEPT.get(app.broker.state)
            return app.background.warmer.steps, len(kept.tables) if kept else 0
        finally:
            await app.stop_async()

    assert asyncio.run(scenario()) == (0, 0)


def test_the_warmer_makes_the_next_targets_lists_before_it_is_taken(tmp_path: Any) -> None:
    """The same steps make each pool's next placement target ahead (core/packnext.py): a new
    target waits while its short lists are made, a window of positions per step, and is
    taken with them; with why_warm_positions = 0 it is taken at once."""
    import jupyter_gpushare.core.placement as placement_mod

    async def scenario(positions: int) -> tuple[bool, bool, set, int]:
        app = await start_broker(
            crash(), f"sqlite:///{tmp_path}/n{positions}.sqlite", static_tokens({}),
            why_warm_interval_s=0.01, why_warm_positions=positions,
        )
        try:
            await asyncio.sleep(0.05)  # (a first step: from now on new targets wait)
            # checkpoints at 1 and 2 requests: a whole GPU, then a half (the mix moved)
            for user, gpu in (("u0", {"count": 1}), ("u1", {"fraction": 0.5})):
                status, body = await call(app, "POST", "/requests", "tok-spawner",
                                          _ask(user, gpu, team="t0"))
                assert status == 201 and body["status"] == "granted", body
            pidx = placement_mod._index(app.broker.state).pools["shared"]
            waiting = pidx.next
            table = waiting.table if waiting is not None else None
            for _ in range(100):  # 10 nodes, a position per step: 2 lists in ~0.2 s
                if pidx.next is None:
                    break
                await asyncio.sleep(0.01)
            return waiting is not None, pidx.table is table, set(pidx._cache), pidx.next is None
        finally:
            await app.stop_async()

    waited, taken, lists, done = asyncio.run(scenario(1))
    assert waited and taken and done
    assert lists == {(0, 1000, 1, ()), (0, 500, 1, ())}  # the lists came with it
    waited, _, _, done = asyncio.run(scenario(0))
    assert not waited and done
