"""The garbage collector on a broker that holds many live grants.

The broker freezes what it loaded on start (``gc.freeze()``: the permanent generation is
never scanned). Grants admitted later are not frozen: each one is about ten objects that
stay alive as long as the grant, so they pile up in the oldest generation, and CPython
scans all of it in each full collection, which it runs whenever that generation has grown
by a quarter. At 500 admissions/s, 13,000 grants since start made a full pass of 112 ms on
the event loop; after a day it would be the whole site's grants again (~1 s at 100,000).

:class:`CollectorPacer` keeps the unfrozen heap small instead: every ``interval_s`` (0.1 s)
it runs one full collection, which scans only what is not frozen (what was allocated since
the last step: 2-4 ms at 500 admissions/s over HTTP, 0.2 ms for 125 admissions in-process),
and then freezes what survived. Cyclic garbage is collected before it could be frozen; what
the step freezes is alive at that moment: grants (freed by their reference count when
released, frozen or not) and whatever a request in flight holds. A request in flight that
later ends as a reference cycle would stay in memory (frozen objects are never collected):
the step runs between two callbacks of the loop, when no admission is half done, so that is
only the few connections and waits open at that instant; ``benchmarks/broker.py`` counts it
(the garbage found when the broker unfreezes at exit: none after 99 steps and 17,000
admissions). ``interval_s = 0`` leaves the collector as CPython runs it.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable
from typing import TypeVar


class CollectorPacer:
    """Every ``interval_s`` on the event loop: collect what is not frozen, freeze the rest."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self.steps = 0
        self.collected = 0
        self.longest_s = 0.0
        self._handle: asyncio.TimerHandle | None = None

    def start(self) -> None:
        if self.interval_s > 0 and self._handle is None:
            self._handle = asyncio.get_running_loop().call_later(self.interval_s, self._tick)

    def stop(self) -> None:
        """Stop stepping; give what the steps froze back to the collector (a broker run
        inside another program, e.g. the tests, leaves no frozen garbage behind)."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if self.steps:
            gc.unfreeze()

    def step(self) -> int:
        """One full collection of the unfrozen objects, then freeze the survivors; returns
        the number of unreachable objects found."""
        t0 = time.perf_counter()
        found = gc.collect()
        gc.freeze()
        took = time.perf_counter() - t0
        self.steps += 1
        self.collected += found
        self.longest_s = max(self.longest_s, took)
        return found

    def _tick(self) -> None:
        self._handle = None
        try:
            if gc.isenabled():  # something paused the collector on purpose: leave it
                self.step()
        finally:
            self.start()


T = TypeVar("T")


def load_frozen(load: Callable[[], T]) -> T:
    """``load()`` with the collector paused, then everything alive frozen
    (``BrokerApp.gc_freeze``): collect before, while the heap is small (imports, policy),
    and freeze right after with the collector still paused; what the load built holds no
    garbage worth a full pass over 100,000 grants (~0.5 s), and nothing is in flight yet
    (the broker does not listen), so only live state gets frozen."""
    gc.collect()
    gc.disable()
    try:
        loaded = load()
        gc.freeze()
    finally:
        gc.enable()
    return loaded
