"""The watchdog does not restart the same kernel over and over.

A kernel that goes over its GPU memory limit again right after the watchdog restarted it
(its start-up code allocates again, or an import does) would be restarted every cooldown
(10 s) forever, each time with the same message. Within ``window_s`` of a restart, the
second violation of the same kernel shuts it down instead, and says why.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RepeatGuard:
    """Per kernel: when the watchdog last restarted it and how often it acted on it."""

    window_s: float = 120.0
    _restarted_at: dict[str, float] = field(default_factory=dict)
    _count: dict[str, int] = field(default_factory=dict)

    def decide(self, kernel_id: str, configured: str, now: float) -> tuple[str, str]:
        """The action to take now and the words that explain a change of action."""
        self._count[kernel_id] = self._count.get(kernel_id, 0) + 1
        last = self._restarted_at.get(kernel_id)
        if configured == "restart" and last is not None and now - last <= self.window_s:
            self._restarted_at.pop(kernel_id, None)
            return "shutdown", (
                f" (it was restarted {now - last:.0f} s before and went over the limit again, "
                "so it was shut down instead of being restarted again)"
            )
        if configured == "restart":
            self._restarted_at[kernel_id] = now
        return configured, ""

    def count(self, kernel_id: str) -> int:
        """How many times the watchdog acted on this kernel."""
        return self._count.get(kernel_id, 0)
