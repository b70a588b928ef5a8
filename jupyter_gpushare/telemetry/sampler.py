"""Sampler base class: a background thread that fills a ring buffer of samples.

A concrete sampler implements :meth:`Sampler.setup` (called once, in the sampler's
own thread: this is where NVML is opened) and :meth:`Sampler.collect` (one sample).
Listeners are called from the sampler thread; an event-loop consumer must hand the
sample over with ``loop.call_soon_threadsafe``.
"""

from __future__ import annotations

import logging
import threading
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable
from typing import Any

from .model import Sample

log = logging.getLogger(__name__)

Listener = Callable[[Sample], None]

DEFAULT_INTERVAL_S = 1.0
DEFAULT_HISTORY_S = 15 * 60.0


class RingBuffer:
    """Fixed-size, thread-safe history of samples (oldest dropped first)."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("ring buffer capacity must be at least 1")
        self.capacity = capacity
        self._items: deque[Sample] = deque(maxlen=capacity)
        self._lock = threading.Lock()

    def append(self, sample: Sample) -> None:
        with self._lock:
            self._items.append(sample)

    def latest(self) -> Sample | None:
        with self._lock:
            return self._items[-1] if self._items else None

    def snapshot(self, since: float | None = None) -> list[Sample]:
        """All samples (oldest first), or those with ``ts > since``."""
        with self._lock:
            items = list(self._items)
        if since is None:
            return items
        return [s for s in items if s.ts > since]

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)


def capacity_for(history_s: float, interval_s: float) -> int:
    """How many samples cover ``history_s`` at one sample per ``interval_s``."""
    return max(1, int(round(history_s / max(interval_s, 1e-3))))


class Sampler(ABC):
    """Base of all samplers: history, listeners and the background thread."""

    source: str = "base"

    def __init__(
        self, interval_s: float = DEFAULT_INTERVAL_S, history_s: float = DEFAULT_HISTORY_S
    ) -> None:
        if interval_s <= 0:
            raise ValueError("sample interval must be positive")
        self.interval_s = float(interval_s)
        self.history_s = float(history_s)
        self.buffer = RingBuffer(capacity_for(history_s, interval_s))
        self.ready = threading.Event()
        self.setup_error: str | None = None
        self.cpu_seconds = 0.0
        self.ticks = 0
        self._listeners: list[Listener] = []
        self._listeners_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- to implement -------------------------------------------------------------
    @property
    def simulated(self) -> bool:
        """True when the figures are simulated rather than read from a GPU."""
        return False

    def setup(self) -> None:  # noqa: B027 - optional hook
        """Open the data source; runs in the sampler thread. Raise to fail."""

    @abstractmethod
    def collect(self) -> Sample:
        """Take one sample (blocking; never call on the event loop for NVML)."""

    def teardown(self) -> None:  # noqa: B027 - optional hook
        """Close the data source; runs in the sampler thread."""

    def describe(self) -> dict[str, Any]:
        """Facts about the sampler for API answers."""
        return {
            "source": self.source,
            "simulated": self.simulated,
            "interval_s": self.interval_s,
            "history_s": self.history_s,
            "error": self.setup_error,
        }

    # -- listeners -----------------------------------------------------------------
    def add_listener(self, fn: Listener) -> None:
        with self._listeners_lock:
            self._listeners.append(fn)

    def remove_listener(self, fn: Listener) -> None:
        with self._listeners_lock:
            if fn in self._listeners:
                self._listeners.remove(fn)

    def _notify(self, sample: Sample) -> None:
        with self._listeners_lock:
            listeners = list(self._listeners)
        for fn in listeners:
            try:
                fn(sample)
            except Exception:  # a broken listener must not stop sampling
                log.exception("telemetry listener failed")

    # -- reading -------------------------------------------------------------------
    def latest(self) -> Sample | None:
        return self.buffer.latest()

    def history(self, since: float | None = None) -> list[Sample]:
        return self.buffer.snapshot(since)

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Wait until :meth:`setup` has run (successfully or not)."""
        return self.ready.wait(timeout)

    # -- thread --------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        """Start the sampling thread (idempotent)."""
        if self.running:
            return
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._run, name=f"gpushare-sampler-{self.source}", daemon=True
        )
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the sampling thread and wait for it."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        self._thread = None

    def tick(self) -> Sample:
        """Take one sample, store it and tell the listeners (sampler thread only)."""
        sample = self._safe_collect()
        self.buffer.append(sample)
        self.ticks += 1
        self._notify(sample)
        return sample

    def _safe_collect(self) -> Sample:
        try:
            return self.collect()
        except Exception as exc:  # the driver can fail transiently; keep sampling
            log.warning("telemetry sample failed: %s", exc)
            return Sample(
                ts=time.time(), gpus=(), simulated=self.simulated, source=self.source,
                error=f"sample failed: {exc}",
            )

    def _run(self) -> None:
        try:
            self.setup()
        except Exception as exc:
            self.setup_error = str(exc) or type(exc).__name__
            log.error("telemetry sampler %s failed to start: %s", self.source, exc)
            self.ready.set()
            return
        self.ready.set()
        cpu0 = time.thread_time()  # steady-state cost: setup (NVML init) not counted
        next_t = time.monotonic()
        try:
            while not self._stop.is_set():
                self.tick()
                self.cpu_seconds = time.thread_time() - cpu0
                next_t += self.interval_s
                now = time.monotonic()
                if next_t < now:  # fell behind: skip, never burst
                    next_t = now
                self._stop.wait(next_t - now)
        finally:
            try:
                self.teardown()
            except Exception:
                log.exception("telemetry sampler teardown failed")
