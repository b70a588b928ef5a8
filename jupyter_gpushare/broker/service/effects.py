"""What the broker's service asks of the outside world, and what it reports to metrics.

The service never talks to the hub or a batch system itself: it calls an :class:`Effects`
(implemented by :class:`~.preempt.PreemptionRunner`) and an :class:`Observer` (implemented
by :class:`~.metrics.BrokerMetrics`). The ``No…`` classes do nothing (tests, tools).
"""

from __future__ import annotations

from typing import Any, Protocol

from ...core.model import Grant


class Effects(Protocol):
    """What the service asks the outside world to do (implemented in :mod:`.preempt`)."""

    def preemption_planned(
        self, request_id: str, victims: list[Grant], deadline: float
    ) -> None: ...

    def preemption_cancelled(self, request_id: str) -> None: ...

    def notice(self, notice: dict[str, Any]) -> None: ...

    def retry_soon(self, request_id: str) -> None: ...


class NoEffects:
    """Effects that do nothing."""

    def preemption_planned(self, request_id: str, victims: list[Grant], deadline: float) -> None:
        pass

    def preemption_cancelled(self, request_id: str) -> None:
        pass

    def notice(self, notice: dict[str, Any]) -> None:
        pass

    def retry_soon(self, request_id: str) -> None:
        pass


class Observer(Protocol):
    """What the service reports as it decides (implemented in :mod:`.metrics`)."""

    def admission(self, pool: str, outcome: str, code: str) -> None: ...

    def decision(self, pool: str, cpu_s: float) -> None:
        """One decision of the core on a request of ``pool`` took ``cpu_s`` of CPU."""

    def preemption(self, reason: str, count: int) -> None: ...

    def release(self, reason: str) -> None: ...


class NoObserver:
    """An observer that records nothing."""

    def admission(self, pool: str, outcome: str, code: str) -> None:
        pass

    def decision(self, pool: str, cpu_s: float) -> None:
        pass

    def preemption(self, reason: str, count: int) -> None:
        pass

    def release(self, reason: str) -> None:
        pass
