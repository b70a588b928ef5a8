"""What the broker keeps of finished batch jobs: the periodic retention pass.

Only finished jobs are touched, never a queued or running one: their files (log, snapshot,
checkpoints) past ``log_retention_days``; their rows, history and files past
``job_retention_days`` and beyond ``max_jobs_kept_per_user``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from sqlalchemy import select

from ...core.jobs import TERMINAL
from ..store.db import jobs_table

if TYPE_CHECKING:
    from .manager_view import JobManagerView

log = logging.getLogger("gpushare.broker.jobs")

TERMINAL_VALUES = frozenset(s.value for s in TERMINAL)
DAY_S = 86400


class JobRetention:
    """The retention pass over a :class:`~.runner.JobManager`'s finished jobs."""

    def __init__(self, manager: JobManagerView) -> None:
        self.manager = manager

    def run(self, now: float) -> dict[str, list[str]]:
        """Files of jobs past ``log_retention_days`` (:meth:`sweep`), then rows, history
        and files of jobs past ``job_retention_days`` and beyond ``max_jobs_kept_per_user``;
        the ids touched, by why."""
        m = self.manager
        out: dict[str, list[str]] = {"files": [], "aged": [], "over_count": []}
        if m.log_retention_days > 0:
            out["files"] = self.sweep(now)
        if m.job_retention_days > 0:
            out["aged"] = m.store.delete_ended_before(now - m.job_retention_days * DAY_S)
        out["over_count"] = m.store.prune_all(m.max_jobs_kept_per_user)
        for job_id in out["aged"] + out["over_count"]:
            m.backend.forget(job_id)
        if out["aged"] or out["over_count"]:
            log.info(
                "job retention: %d finished jobs past %g days, %d beyond %d per user deleted",
                len(out["aged"]),
                m.job_retention_days,
                len(out["over_count"]),
                m.max_jobs_kept_per_user,
            )
        return out

    def sweep(self, now: float) -> list[str]:
        """Forget the log, snapshot and checkpoints of jobs finished longer ago than
        ``log_retention_days`` (their rows and history stay); returns their ids."""
        m = self.manager
        cutoff = now - m.log_retention_days * DAY_S
        with m.broker.engine.connect() as conn:
            rows = conn.execute(
                select(jobs_table.c.id, jobs_table.c.state).where(
                    jobs_table.c.ended_at.is_not(None),
                    jobs_table.c.ended_at < cutoff,
                )
            )
            ids = [r.id for r in rows if r.state in TERMINAL_VALUES]
        for job_id in ids:
            m.backend.forget(job_id)
        return ids
