"""This server's kernels as the telemetry service sees and tells them: which kernels run (id,
process, notebook), when they were last active, the notice watcher started in each, and
messages written into their output.

:class:`KernelTable` is held by :class:`~.service.TelemetryService` (``service.kernels``); it
owns the kernels last read, the kernels that run the notice watcher and the messages on their
way, and is handed everything else it needs when it is built.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from ..telemetry.attribution import KernelInfo
from ..telemetry.broker_link import BrokerLink
from ..telemetry.grant import GrantInfo
from .kernel_messages import run_in_kernel, watcher_code
from .service_config import ServiceConfig

if TYPE_CHECKING:
    from ..telemetry.simulated import SimulatedSampler


class KernelTable:
    """This server's kernels: read from the kernel and session managers, watched and told."""

    def __init__(
        self,
        config: ServiceConfig,
        grant: GrantInfo,
        broker: BrokerLink,
        kernel_manager: Any,
        session_manager: Any,
        simulated_sampler: Callable[[], SimulatedSampler | None],
    ) -> None:
        self.config = config
        self.grant = grant
        self.broker = broker
        self.kernel_manager = kernel_manager
        self.session_manager = session_manager
        self.simulated_sampler = simulated_sampler  # the simulated sampler in use, if any
        self.running: tuple[KernelInfo, ...] = ()  # as last read
        self._telling: set[asyncio.Future[Any]] = set()  # messages on their way
        self._watched: set[str] = set()  # kernels that run the notice watcher

    def __iter__(self) -> Iterator[KernelInfo]:
        return iter(self.running)

    @property
    def telling(self) -> set[asyncio.Future[Any]]:
        """The messages on their way to the kernels (cancelled when the service stops)."""
        return self._telling

    async def refresh(self) -> None:
        """Read this server's kernels: id, process id and notebook path."""
        km = self.kernel_manager
        if km is None:
            return
        paths: dict[str, str] = {}
        if self.session_manager is not None:
            with contextlib.suppress(Exception):
                for s in await self.session_manager.list_sessions():
                    kid = (s.get("kernel") or {}).get("id")
                    if kid:
                        paths[kid] = s.get("path") or s.get("name") or ""
        infos = []
        for kid in list(km.list_kernel_ids()):
            try:
                k = km.get_kernel(kid)
            except KeyError:
                continue
            proc = getattr(getattr(k, "provisioner", None), "process", None)
            pid = getattr(proc, "pid", None)
            name = getattr(k, "kernel_name", "")
            infos.append(KernelInfo(kid, pid, paths.get(kid) or None, name))
        self.running = tuple(infos)
        self._watch_kernels()
        self._simulate_kernel_memory()

    def activity_ts(self) -> float | None:
        """The latest activity of this server's kernels (epoch seconds; now if one is busy)."""
        km = self.kernel_manager
        if km is None:
            return None
        latest: float | None = None
        for kid in list(km.list_kernel_ids()):
            try:
                k = km.get_kernel(kid)
            except KeyError:
                continue
            if getattr(k, "execution_state", "") == "busy":
                return time.time()
            last = getattr(k, "last_activity", None)
            if last is not None and hasattr(last, "timestamp"):
                latest = max(latest or 0.0, last.timestamp())
        return latest

    def _simulate_kernel_memory(self) -> None:
        sim = self.simulated_sampler()
        mib = self.config.simulated_kernel_memory_mib
        if sim is None or mib <= 0:
            return
        have = sim.process_memory()
        for k in self.running:
            if k.pid is not None and k.pid not in have:
                sim.set_process_memory(k.pid, mib)

    def _watch_kernels(self) -> None:
        """Start the notice watcher in each new kernel of a server with a grant."""
        ids = {k.kernel_id for k in self.running}
        self._watched &= ids  # bounded by the live kernels
        if not (self.config.notices_to_kernels and self.grant.grant_id and self.broker.configured):
            return
        code = watcher_code(
            self.config.notices_interval_s, max(15.0, 2 * self.config.notices_interval_s)
        )
        for kid in sorted(ids - self._watched):
            self._watched.add(kid)
            self._in_background(self.run_code(kid, code))

    def _in_background(self, work: Any) -> None:
        task = asyncio.ensure_future(work)
        self._telling.add(task)
        task.add_done_callback(self._telling.discard)

    async def tell(self, kernel_id: str, text: str) -> bool:
        """Write the message to the kernel's stderr (it reaches every attached frontend)."""
        code = (
            "import sys as _gs_sys; "
            f"_gs_sys.stderr.write({json.dumps('[gpushare] ' + text)} + '\\n'); "
            "_gs_sys.stderr.flush(); del _gs_sys"
        )
        return await self.run_code(kernel_id, code)

    async def run_code(self, kernel_id: str, code: str) -> bool:
        """Run ``code`` in the kernel, silently for the history, and wait for the reply."""
        return await run_in_kernel(self.kernel_manager, kernel_id, code)

    def tell_soon(self, text: str) -> None:
        """Tell the kernels in the background: a busy kernel answers only after its cell, and
        the notice poll (and the stream) must not wait for it."""
        self._in_background(self.tell_all(text))

    async def tell_all(self, text: str) -> None:
        """Write ``text`` into every kernel's output (preemption notices)."""
        if not self.config.notices_to_kernels or self.kernel_manager is None:
            return
        await asyncio.gather(
            *(self.tell(k.kernel_id, text) for k in self.running),
            return_exceptions=True,
        )
