"""The jobs that have a backend call in flight: the job loop leaves them alone meanwhile."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


class BusyJobs:
    """The ids of jobs whose start, poll, signal or kill is running in a worker thread."""

    def __init__(self) -> None:
        self._ids: set[str] = set()

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._ids

    @contextmanager
    def holding(self, *job_ids: str) -> Iterator[None]:
        """Mark ``job_ids`` busy for the ``with`` block (until it returns or raises)."""
        self._ids.update(job_ids)
        try:
            yield
        finally:
            self._ids.difference_update(job_ids)
