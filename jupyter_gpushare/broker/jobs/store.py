"""The job store: batch jobs in the database, one transaction per change of state.

Live jobs (not in a terminal state) are also kept in memory (:attr:`JobStore.live`), so
the runner's loop reads no database; finished jobs are read from the database when
asked. Every change of state goes through :meth:`JobStore.transition`, which checks it
against the core's rules (:func:`~jupyter_gpushare.core.jobs.check_transition`) and
writes the job row and its event in **one** transaction before memory is changed.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

from sqlalchemy import Engine, delete, func, select

from ...backends.base import RunHandle
from ...core.jobs import TERMINAL, JobState, check_transition
from ..store.db import job_events_table, job_notebooks_table, jobs_table
from ..store.serial import iso


@dataclass
class Job:
    """One job as stored (a row of ``gpushare_jobs``)."""

    id: str
    user: str
    team: str
    name: str
    pool: str
    priority: str
    request_spec: dict[str, Any]
    max_runtime_s: int
    checkpoint: bool
    backend: str
    output_path: str
    state: JobState
    attempt: int = 1
    server: str = ""
    path: str = ""
    profile: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)
    reason: str = ""
    request_id: str | None = None
    grant_id: str | None = None
    handle: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    gpu_hours: float = 0.0
    preempt_signalled: bool = False
    cancel_requested: bool = False
    created_at: float = 0.0
    updated_at: float = 0.0
    started_at: float | None = None
    ended_at: float | None = None
    idempotency_key: str | None = None  # the submitter's, to find the job when it asks again

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL

    def row(self) -> dict[str, Any]:
        out = {
            "id": self.id, "username": self.user, "team": self.team, "server": self.server,
            "name": self.name, "path": self.path, "profile": self.profile, "pool": self.pool,
            "priority": self.priority, "request_spec": self.request_spec,
            "parameters": self.parameters, "max_runtime_s": self.max_runtime_s,
            "checkpoint": self.checkpoint, "backend": self.backend,
            "output_path": self.output_path, "state": self.state.value, "reason": self.reason,
            "attempt": self.attempt, "request_id": self.request_id, "grant_id": self.grant_id,
            "handle": self.handle, "error": self.error, "gpu_hours": self.gpu_hours,
            "preempt_signalled": self.preempt_signalled,
            "cancel_requested": self.cancel_requested, "created_at": self.created_at,
            "updated_at": self.updated_at, "started_at": self.started_at,
            "ended_at": self.ended_at, "idempotency_key": self.idempotency_key,
        }
        return out

    @classmethod
    def from_row(cls, row: Any) -> Job:
        m = row._mapping
        return cls(
            id=m["id"], user=m["username"], team=m["team"], server=m["server"] or "",
            name=m["name"], path=m["path"] or "", profile=m["profile"] or "", pool=m["pool"],
            priority=m["priority"], request_spec=m["request_spec"],
            parameters=m["parameters"] or {}, max_runtime_s=m["max_runtime_s"],
            checkpoint=bool(m["checkpoint"]), backend=m["backend"],
            output_path=m["output_path"], state=JobState(m["state"]), reason=m["reason"] or "",
            attempt=m["attempt"], request_id=m["request_id"], grant_id=m["grant_id"],
            handle=m["handle"], error=m["error"], gpu_hours=m["gpu_hours"] or 0.0,
            preempt_signalled=bool(m["preempt_signalled"]),
            cancel_requested=bool(m["cancel_requested"]), created_at=m["created_at"],
            updated_at=m["updated_at"], started_at=m["started_at"], ended_at=m["ended_at"],
            idempotency_key=m["idempotency_key"],
        )


_COLUMNS = {f.name: f.name for f in fields(Job)} | {"user": "username"}


def _column_values(changes: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for key, value in changes.items():
        out[_COLUMNS[key]] = value.value if isinstance(value, JobState) else value
    return out


class JobStore:
    """Jobs and their history in the database, live ones mirrored in memory."""

    def __init__(self, engine: Engine, clock: Callable[[], float] = time.time) -> None:
        self.engine = engine
        self.clock = clock
        self.live: dict[str, Job] = {}

    def load(self) -> list[Job]:
        """Read every job that is not finished into memory (on start)."""
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(jobs_table)
                .where(jobs_table.c.state.not_in([s.value for s in TERMINAL]))
                .order_by(jobs_table.c.created_at, jobs_table.c.id)
            )
            self.live = {job.id: job for job in map(Job.from_row, rows)}
        return list(self.live.values())

    def insert(
        self, job: Job, notebook_text: str, history: list[tuple[str | None, str, str]]
    ) -> None:
        """Store a new job, its snapshot and its first events in one transaction."""
        now = job.created_at
        with self.engine.begin() as conn:
            conn.execute(jobs_table.insert(), job.row())
            conn.execute(
                job_notebooks_table.insert(),
                {"job_id": job.id, "notebook": notebook_text, "size": len(notebook_text)},
            )
            for old, new, reason in history:
                conn.execute(
                    job_events_table.insert(),
                    {"job_id": job.id, "ts": now, "from_state": old, "to_state": new,
                     "attempt": job.attempt, "reason": reason},
                )
        if not job.terminal:
            self.live[job.id] = job

    def transition(self, job: Job, new: JobState, reason: str, **changes: Any) -> None:
        """Change ``job``'s state (checked), with its event, in one transaction."""
        check_transition(job.state, new)
        self._write(job, job.state, new, reason, dict(changes, state=new, reason=reason))

    def note(self, job: Job, reason: str, **changes: Any) -> None:
        """Record an event that changes no state (a preemption notice, a reattach)."""
        self._write(job, job.state, job.state, reason, changes)

    def update(self, job: Job, **changes: Any) -> None:
        """Change fields of ``job`` without an event."""
        self._write(job, None, None, None, changes)

    def _write(
        self, job: Job, old: JobState | None, new: JobState | None, reason: str | None,
        changes: dict[str, Any],
    ) -> None:
        now = self.clock()
        changes["updated_at"] = now
        if new is not None and new in TERMINAL and job.ended_at is None:
            changes.setdefault("ended_at", now)
        with self.engine.begin() as conn:
            conn.execute(
                jobs_table.update().where(jobs_table.c.id == job.id),
                _column_values(changes),
            )
            if new is not None:
                conn.execute(
                    job_events_table.insert(),
                    {"job_id": job.id, "ts": now, "from_state": old.value if old else None,
                     "to_state": new.value, "attempt": changes.get("attempt", job.attempt),
                     "reason": reason or ""},
                )
        for key, value in changes.items():
            setattr(job, key, value)
        if job.terminal:
            self.live.pop(job.id, None)

    # -- reading ----------------------------------------------------------------------------

    def get(self, job_id: str) -> Job | None:
        job = self.live.get(job_id)
        if job is not None:
            return job
        with self.engine.connect() as conn:
            row = conn.execute(select(jobs_table).where(jobs_table.c.id == job_id)).first()
        return Job.from_row(row) if row else None

    def find_idempotent(self, user: str, key: str) -> Job | None:
        """The job ``user`` submitted with idempotency key ``key``, if any."""
        c = jobs_table.c
        with self.engine.connect() as conn:
            row = conn.execute(
                select(jobs_table).where(c.username == user, c.idempotency_key == key)
            ).first()
        return (self.live.get(row.id) or Job.from_row(row)) if row else None

    def recent(self, user: str | None = None, limit: int = 200) -> list[Job]:
        query = select(jobs_table).order_by(jobs_table.c.created_at.desc()).limit(limit)
        if user is not None:
            query = query.where(jobs_table.c.username == user)
        with self.engine.connect() as conn:
            rows = list(conn.execute(query))
        return [self.live.get(r.id) or Job.from_row(r) for r in rows]

    def events(self, job_id: str) -> list[dict[str, Any]]:
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(job_events_table)
                .where(job_events_table.c.job_id == job_id)
                .order_by(job_events_table.c.id)
            )
            return [
                {"ts": iso(r.ts), "from": r.from_state, "to": r.to_state, "attempt": r.attempt,
                 "reason": r.reason}
                for r in rows
            ]

    def notebook(self, job_id: str) -> dict[str, Any]:
        with self.engine.connect() as conn:
            text = conn.execute(
                select(job_notebooks_table.c.notebook).where(
                    job_notebooks_table.c.job_id == job_id
                )
            ).scalar_one()
        return dict(json.loads(text))

    def waiting_of(self, user: str) -> int:
        """Jobs of ``user`` that are not finished (bounded per user)."""
        return sum(1 for j in self.live.values() if j.user == user)

    def prune(self, user: str, keep: int) -> list[str]:
        """Delete the oldest finished jobs of ``user`` beyond ``keep`` finished ones (queued
        and running jobs are neither counted nor touched); return their ids."""
        with self.engine.begin() as conn:
            total = conn.execute(
                select(func.count()).select_from(jobs_table)
                .where(jobs_table.c.username == user, _finished())
            ).scalar_one()
            if total <= keep:
                return []
            ids = [
                r.id
                for r in conn.execute(
                    select(jobs_table.c.id)
                    .where(jobs_table.c.username == user, _finished())
                    .order_by(jobs_table.c.created_at)
                    .limit(total - keep)
                )
            ]
            _delete(conn, ids)
        return ids

    def prune_all(self, keep: int) -> list[str]:
        """:meth:`prune` for every user with more than ``keep`` jobs (the retention pass)."""
        with self.engine.connect() as conn:
            users = [
                r.username for r in conn.execute(
                    select(jobs_table.c.username)
                    .where(_finished())
                    .group_by(jobs_table.c.username)
                    .having(func.count() > keep)
                )
            ]
        out: list[str] = []
        for user in users:
            out += self.prune(user, keep)
        return out

    def delete_ended_before(self, cutoff: float) -> list[str]:
        """Delete finished jobs that ended before ``cutoff`` (never a live one)."""
        with self.engine.begin() as conn:
            ids = [
                r.id for r in conn.execute(
                    select(jobs_table.c.id).where(
                        _finished(), jobs_table.c.ended_at.is_not(None),
                        jobs_table.c.ended_at < cutoff,
                    )
                )
            ]
            ids = [i for i in ids if i not in self.live]
            _delete(conn, ids)
        return ids


def _finished() -> Any:
    return jobs_table.c.state.in_([s.value for s in TERMINAL])


def _delete(conn: Any, ids: list[str]) -> None:
    """Delete jobs, their history and snapshots (in chunks: bounded statements)."""
    for i in range(0, len(ids), 500):
        part = ids[i:i + 500]
        conn.execute(delete(job_events_table).where(job_events_table.c.job_id.in_(part)))
        conn.execute(delete(job_notebooks_table).where(job_notebooks_table.c.job_id.in_(part)))
        conn.execute(delete(jobs_table).where(jobs_table.c.id.in_(part)))


def handle_of(job: Job) -> RunHandle | None:
    """The backend's handle of the job's current run (None before it started)."""
    if not job.handle:
        return None
    try:
        return RunHandle.from_json(job.handle)
    except (KeyError, TypeError, ValueError):
        return None
