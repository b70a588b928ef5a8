"""The refusal tables made ahead, between requests (``core/placement_why.warm``).

A refusal says why nothing fits from a table of its pool and GPU ask, kept up to date from
the nodes changed since it was last asked. The first refusal of an ask had to make its
table: a pass over the pool, 15-60 ms on the event loop at ten times the Alibaba cluster
(``benchmarks/placement_broker.py --scale 10``: 17-23 such decisions per run, all late,
when the pool was full). :class:`WhyWarmer` does that work before it is needed, in slices
between two callbacks of the loop: once a pool is near full (``placement_why.WARM_AT``), each
step brings the tables made up to date (the nodes changed since the last step) and reads at
most ``nodes_per_step`` nodes into the tables of the asks seen there that are still being
made. A step that found nothing to do waits ten times longer for the next.
``interval_s = 0`` never steps: every first refusal makes its table, as before.

The same steps make each pool's next placement target ahead (``core/placement.make_ahead``,
``core/packnext.py``): a new target waits until the short lists of the shapes asked lately
are made for it, at most ``positions_per_step`` node positions read per step, so that no
request after it pays for a full scan with cold memos (on cpu-heavy at ``--scale 10`` most
of the decisions over 10 ms left); with what a step has left, the short lists in use are
kept up (brought up to date, carried on where they run low: ``ShortLists.freshen`` in
``core/packshort.py``). ``positions_per_step = 0``: a new target is taken at once and no
list is kept up, as before.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from ...core.placement import make_ahead
from ...core.placement_why import warm
from ...core.state import ClusterState


class WhyWarmer:
    """Every ``interval_s`` on the event loop (ten times that after an idle step): one slice
    of the refusal tables' work, at most ``nodes_per_step`` nodes read, and of the next
    targets' lists, at most ``positions_per_step`` positions read."""

    IDLE_FACTOR = 10

    def __init__(
        self,
        state: Callable[[], ClusterState],
        interval_s: float,
        nodes_per_step: int,
        at: float | None = None,
        positions_per_step: int = 0,
    ) -> None:
        """``state``: the broker's state now (a policy change replaces it); ``at``: the
        pool load from which tables are made (``placement_why.WARM_AT`` by default);
        ``positions_per_step``: node positions read per step into the next targets' lists
        (0: none made ahead)."""
        self.state = state
        self.interval_s = interval_s
        self.nodes_per_step = nodes_per_step
        self.positions_per_step = positions_per_step
        self.at = at
        self.steps = 0  # steps that read something
        self.nodes_read = 0
        self.longest_s = 0.0
        self.busy_s = 0.0
        self._handle: asyncio.TimerHandle | None = None

    def start(self, delay: float | None = None) -> None:
        if self.interval_s > 0 and self._handle is None:
            wait = self.interval_s if delay is None else delay
            self._handle = asyncio.get_running_loop().call_later(wait, self._tick)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def step(self) -> int:
        """One slice now; returns the nodes read (0: nothing was to be done)."""
        t0 = time.perf_counter()
        state = self.state()
        read = warm(state, self.nodes_per_step, self.at)
        if self.positions_per_step:
            read += make_ahead(state, self.positions_per_step)
        took = time.perf_counter() - t0
        if read:
            self.steps += 1
            self.nodes_read += read
            self.busy_s += took
            self.longest_s = max(self.longest_s, took)
        return read

    def _tick(self) -> None:
        self._handle = None
        read = 0
        try:
            read = self.step()
        finally:
            self.start(self.interval_s if read else self.interval_s * self.IDLE_FACTOR)
