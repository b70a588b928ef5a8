"""What runs beside a serving broker: the loops started once it listens, stopped before it closes.

The request rows' retention (:mod:`.retention`), the GPU culler (:mod:`.culler`), the
collector's pacer (:mod:`.gcpace`), the refusal tables made ahead (:mod:`.whywarm`),
the policy file's watch (:mod:`.reload`) and the reconcile loop (:mod:`.reconcile`). The
application (``broker/app.py``) makes them and hands them here; :meth:`Background.stop`
cancels and stops them in that order.
"""

from __future__ import annotations

import asyncio
from typing import Any

from .culler import GPUCuller
from .gcpace import CollectorPacer
from .reconcile import HolderChecker, reconcile_loop
from .reload import PolicyReloader
from .retention import RequestRetention
from .whywarm import WhyWarmer


class Background:
    """The broker's background loops, started together and stopped together."""

    def __init__(
        self,
        broker: Any,
        culler: GPUCuller,
        pace_interval_s: float,
        warm_interval_s: float = 0.0,
        warm_nodes_per_step: int = 0,
        warm_at: float | None = None,
        warm_positions_per_step: int = 0,
    ) -> None:
        self.broker = broker
        self.culler = culler
        self.retention = RequestRetention(broker)  # old request rows
        self.pacer = CollectorPacer(pace_interval_s)
        self.warmer = WhyWarmer(
            lambda: broker.state, warm_interval_s, warm_nodes_per_step, warm_at,
            warm_positions_per_step,
        )
        self.tasks: set[asyncio.Task[Any]] = set()

    def start(
        self,
        reloader: PolicyReloader | None,
        checker: HolderChecker,
        reconcile_min_age_s: float,
        reconcile_interval_s: float,
        reconcile_on_start: bool,
    ) -> None:
        self.tasks.add(asyncio.ensure_future(self.retention.run()))
        self.culler.start()
        self.pacer.start()
        self.warmer.start()
        if reloader is not None:
            self.tasks.add(asyncio.ensure_future(reloader.watch()))
        if reconcile_on_start or reconcile_interval_s > 0:
            loop = reconcile_loop(
                self.broker, checker, reconcile_min_age_s, reconcile_interval_s,
                reconcile_on_start,
            )
            self.tasks.add(asyncio.ensure_future(loop))

    def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        self.culler.stop()
        self.pacer.stop()
        self.warmer.stop()
