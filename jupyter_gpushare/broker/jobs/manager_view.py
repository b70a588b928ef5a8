"""What the job manager's parts read of it (:class:`~.runner.JobManager` composes them).

The parts (:mod:`.start`, :mod:`.watch`, :mod:`.outcome`, :mod:`.retention`) are typed
against these Protocols, not against ``JobManager`` itself, so none of them imports
:mod:`.runner`, which imports them all (no import cycle: ``tests/test_import_layers.py``).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Protocol

from .busy import BusyJobs
from .spec import AttemptSource
from .store import Job, JobStore

if TYPE_CHECKING:
    from ...backends.base import JobBackend, RunStatus
    from ...core.model import Grant
    from ..service.broker import Broker
    from .node_return import NodeReturn


class Outcomes(Protocol):
    """What the start and the watch ask of :class:`~.outcome.JobOutcomes`."""

    def settle(self, job: Job, status: RunStatus, *, drain: bool = True) -> None: ...

    def release_grant(self, job: Job, reason: str, *, drain: bool = True) -> float: ...

    def release_reason(self, grant_id: str | None) -> str | None: ...

    def ask_again(self, job: Job, attempt: int, reason: str) -> None: ...


class JobManagerView(AttemptSource, Protocol):
    """The job manager as its parts see it: its collaborators and settings (read only)."""

    @property
    def broker(self) -> Broker: ...

    @property
    def store(self) -> JobStore: ...

    @property
    def backend(self) -> JobBackend: ...

    @property
    def wake(self) -> asyncio.Event: ...

    @property
    def busy(self) -> BusyJobs: ...

    @property
    def outcomes(self) -> Outcomes: ...

    @property
    def node_return(self) -> NodeReturn: ...

    @property
    def max_attempts(self) -> int: ...

    @property
    def max_jobs_kept_per_user(self) -> int: ...

    @property
    def cancel_grace_s(self) -> float: ...

    @property
    def max_log_bytes(self) -> int: ...

    @property
    def job_retention_days(self) -> float: ...

    @property
    def log_retention_days(self) -> float: ...

    async def call_backend(self, fn: Any, *args: Any) -> Any: ...

    def grant_of(self, job: Job) -> Grant | None: ...

    def job_of_grant(self, grant: Grant) -> Job | None: ...
