"""The broker with an event-loop lag probe, for ``benchmarks/broker.py`` (not for production).

    python benchmarks/broker_lagprobe.py --BrokerApp.… (the broker's own options)

Runs ``jupyter_gpushare.broker``'s ``main`` unchanged, plus one task on its event loop that
sleeps ``TICK`` seconds at a time while it is switched on (``SIGUSR2`` switches it on and
off). Each wake-up records how long the loop took to come back, as wall time and as the
CPU time of the loop's thread (``time.thread_time``) spent in between: the CPU figure is
the work that held the loop, the wall figure adds the time the process waited for a core
(a shared machine). On exit the records, ``[unix time, wall s, CPU s]`` per wake-up, are
written as JSON to ``$GPUSHARE_LAG_FILE``, and the garbage collector's passes of over a
millisecond (``[unix time at the end, generation, CPU s]``, while the probe is on) to the
same name plus ``.gc``: a hold with a collection in it is the collector's, not the code's.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import signal
import time
from typing import Any

from jupyter_gpushare.broker import app as broker_app

TICK = 0.001


def main() -> None:
    records: list[tuple[float, float, float]] = []
    collections: list[tuple[float, int, float]] = []
    state: dict[str, Any] = {"task": None, "gc_start": 0.0}

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        if state["task"] is None:
            return
        if phase == "start":
            state["gc_start"] = time.thread_time()
            return
        took = time.thread_time() - state["gc_start"]
        if took > 0.001:
            collections.append((time.time(), int(info["generation"]), took))

    gc.callbacks.append(on_gc)

    async def probe() -> None:
        last_wall, last_cpu = time.perf_counter(), time.thread_time()
        while True:
            await asyncio.sleep(TICK)
            wall, cpu = time.perf_counter(), time.thread_time()
            records.append((time.time(), wall - last_wall - TICK, cpu - last_cpu))
            last_wall, last_cpu = wall, cpu

    def toggle() -> None:
        task = state["task"]
        if task is None:
            state["task"] = asyncio.ensure_future(probe())
        else:
            task.cancel()
            state["task"] = None

    original = broker_app.BrokerApp.start_async

    async def start_async(self: broker_app.BrokerApp) -> None:
        await original(self)
        asyncio.get_running_loop().add_signal_handler(signal.SIGUSR2, toggle)

    broker_app.BrokerApp.start_async = start_async  # type: ignore[method-assign]
    try:
        broker_app.main()
    finally:
        with open(os.environ["GPUSHARE_LAG_FILE"], "w") as out:
            json.dump(records, out)
        with open(os.environ["GPUSHARE_LAG_FILE"] + ".gc", "w") as out:
            json.dump(collections, out)


if __name__ == "__main__":
    main()
