"""HTTP handlers of the jobs API (``/api/v1/jobs...``), thin like the others.

Who may do what: a user's own tokens (personal or any of their servers') submit, read and
cancel that user's jobs; ``custom:gpushare:act-as-users`` may act for any user (passing
``user``) and admins read and cancel everything (``GET /jobs?all=1``). Nobody sees another
user's job: reading one answers 404 as if it did not exist.
"""

from __future__ import annotations

import asyncio
import json
from typing import IO, TYPE_CHECKING, Any

from tornado.iostream import StreamClosedError

from ...backends.base import RunHandle
from ...core.jobs import TERMINAL, JobState
from ...disposition import attachment
from ...userfiles import UnsafeFile
from ..errors import BrokerError
from ..jobs.store import Job
from ..jobs.submit import job_view, submit_job
from ..service.fields import BadField
from .handler_base import BaseHandler, json_body

if TYPE_CHECKING:
    from ..jobs.runner import JobManager

STREAM_CHUNK = 256 * 1024  # bytes of an output download read and sent at a time


class _JobsBase(BaseHandler):
    @property
    def jobs(self) -> JobManager:
        manager = getattr(self.ctx, "jobs", None)
        if manager is None:
            raise BrokerError(404, "batch jobs are not enabled on this broker")
        return manager  # type: ignore[no-any-return]

    def _load(self, job_id: str) -> Job:
        job = self.jobs.store.get(job_id)
        if job is None or not self.identity.may_read_user(job.user):
            raise BrokerError(404, f"no job {job_id}")
        return job


class JobsHandler(_JobsBase):
    async def post(self) -> None:
        limits = self.jobs.limits
        size = len(self.request.body or b"")
        if size > limits.max_notebook_bytes + limits.max_parameters_bytes + 65536:
            raise BrokerError(413, f"the request is too large (at most "
                              f"{limits.max_notebook_bytes} bytes of notebook)", "notebook")
        body = json_body(self)
        ident = self.identity
        user = body.get("user") if ident.act_as else None
        if user is not None and not isinstance(user, str):
            raise BadField("user", "user must be a user name")
        if user is None:
            if ident.kind != "user":
                raise BrokerError(403, "a service must name the user", "user")
            user = ident.name
        server = ident_server(ident)
        teams = await self.teams_of(user)
        status, answer = submit_job(
            self.jobs, user=user, user_teams=teams, is_admin=ident.admin, server=server,
            body=body, body_bytes=len(self.request.body or b""),
        )
        self.send(answer, status)

    def get(self) -> None:
        ident = self.identity
        user = self.arg("user")
        everyone = self.arg("all") in ("1", "true")
        if everyone or (user and user != ident.name):
            self.require(ident.admin or ident.act_as, "only admins may list other users' jobs")
        who = None if everyone and user is None else user or ident.name
        try:
            limit = max(1, min(1000, int(self.arg("limit") or 200)))
        except ValueError as exc:
            raise BadField("limit", "limit must be a number") from exc
        jobs = self.jobs.store.recent(user=who, limit=limit)
        self.send({"jobs": [job_view(self.jobs, j) for j in jobs]})


def ident_server(ident: Any) -> str:
    servers = getattr(ident, "servers", None)
    return sorted(servers)[0] if servers else ""


class JobOptionsHandler(_JobsBase):
    async def get(self) -> None:
        user = self.identity.name
        if self.identity.kind != "user":
            user = self.arg("user") or ""
            self.require(self.identity.act_as, "a service must act for a user")
        teams = await self.teams_of(user)
        manager = self.jobs
        broker = manager.broker
        policy = broker.policy
        profiles = []
        for view in broker.profiles_view(teams):
            profile = policy.profile(view["slug"])
            if profile is None or profile.gpu.is_empty:
                continue
            view["priorities"] = {
                t: list(policy.allowed_priorities(t, profile)) for t in view["availability"]
            }
            profiles.append(view)
        prios = [
            {
                "name": p.name,
                "value": p.value,
                "preemptible": p.preemptible,
                "grace_period_s": p.grace_period_s,
                "checkpoint_required_after_s": p.checkpoint_required_after_s,
                "description": p.description,
            }
            for p in policy.priority_classes
        ]
        limits = manager.limits
        self.send(
            {
                "user": user,
                "teams": list(teams),
                "profiles": profiles,
                "priorities": prios,
                "backends": [manager.backend.capabilities().to_json()],
                "limits": {
                    "default_max_runtime": limits.default_max_runtime_s,
                    "max_runtime": limits.max_runtime_s,
                    "max_notebook_bytes": limits.max_notebook_bytes,
                    "max_parameters_bytes": limits.max_parameters_bytes,
                    "max_unfinished_jobs": limits.max_queued_per_user,
                    "unfinished_jobs": manager.store.waiting_of(user),
                },
            }
        )


class JobHandler(_JobsBase):
    def get(self, job_id: str) -> None:
        self.send(job_view(self.jobs, self._load(job_id)))

    async def delete(self, job_id: str) -> None:
        job = self._load(job_id)
        ident = self.identity
        self.require(
            ident.admin or ident.act_as or (ident.kind == "user" and ident.name == job.user),
            "not your job",
        )
        job = await self.jobs.cancel(job)
        self.send(job_view(self.jobs, job))


class JobEventsHandler(_JobsBase):
    def get(self, job_id: str) -> None:
        job = self._load(job_id)
        self.send({"job_id": job.id, "state": job.state.value,
                   "events": self.jobs.store.events(job.id)})


class JobOutputHandler(_JobsBase):
    """The executed notebook, streamed in chunks from a file opened without following a
    link (never read whole into memory: a 1 GB notebook must not grow the broker)."""

    async def get(self, job_id: str) -> None:
        job = self._load(job_id)
        manager = self.jobs
        loop = asyncio.get_running_loop()
        f: IO[bytes] | None = None
        if job.handle:
            handle = RunHandle.from_json(job.handle)
            try:
                f = await loop.run_in_executor(None, manager.backend.open_output, handle)
            except UnsafeFile as exc:
                raise BrokerError(403, f"job {job_id}'s output notebook is not served: "
                                  f"{exc}") from None
        if f is None and manager.backend.capabilities().output_in_user_files_only:
            raise BrokerError(404, f"job {job_id} writes its notebook only into your own files, "
                              f"at {job.output_path}: open it from your server (GET "
                              f"/gpushare/api/jobs/{job_id}/output there)")
        if f is None:
            raise BrokerError(404, f"job {job_id} has no output notebook yet ({job.state.value})")
        try:
            await self._stream(f, job.output_path or f"{job.id}.ipynb")
        except StreamClosedError:
            return
        finally:
            f.close()
        self.finish()

    async def _stream(self, f: IO[bytes], name: str) -> None:
        """Send ``f`` (or the one ``Range: bytes=A-B`` asked for) a chunk at a time."""
        loop = asyncio.get_running_loop()
        size = await loop.run_in_executor(None, _size_of, f)
        start, end = _byte_range(self.request.headers.get("Range"), size)
        self.set_header("Content-Type", "application/x-ipynb+json")
        self.set_header("Content-Disposition", attachment(name))
        self.set_header("Accept-Ranges", "bytes")
        if (start, end) != (0, size):
            self.set_status(206)
            self.set_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
        self.set_header("Content-Length", str(end - start))
        await loop.run_in_executor(None, f.seek, start)
        left = end - start
        while left > 0:
            piece = await loop.run_in_executor(None, f.read, min(STREAM_CHUNK, left))
            if not piece:  # it shrank meanwhile: end the answer short rather than pad it
                self.request.connection.close()  # type: ignore[union-attr]
                return
            left -= len(piece)
            self.write(piece)
            await self.flush()  # one chunk in memory at a time


def _size_of(f: IO[bytes]) -> int:
    f.seek(0, 2)
    size = f.tell()
    f.seek(0)
    return size


def _byte_range(header: str | None, size: int) -> tuple[int, int]:
    """``[start, end)`` of one ``Range: bytes=A-B`` (or ``A-``, ``-N``); the whole file when
    there is none or it is not one simple range; 416 when it starts past the end."""
    if not header or not header.startswith("bytes=") or "," in header:
        return 0, size
    first, _, last = header[6:].strip().partition("-")
    try:
        if not first:
            start, end = max(0, size - int(last)), size
        else:
            start = int(first)
            end = min(size, int(last) + 1) if last else size
    except ValueError:
        return 0, size
    if start >= size and size > 0 or start < 0 or end < start:
        raise BrokerError(416, f"range {header} is outside the output ({size} bytes)",
                          headers={"Content-Range": f"bytes */{size}"})
    return start, end


class JobLogHandler(_JobsBase):
    """The log: ``?offset=N`` or ``?tail=BYTES``; ``?follow=1`` (or ``Accept:
    text/event-stream``) streams it as server-sent events until the job ends."""

    async def get(self, job_id: str) -> None:
        job = self._load(job_id)
        manager = self.jobs
        loop = asyncio.get_running_loop()
        size = await loop.run_in_executor(None, manager.backend.log_size, job.id)
        offset = self._int("offset", 0)
        tail = self.get_query_argument("tail", None)
        if tail is not None:
            offset = max(0, size - self._int("tail", 0))
        follow = self.get_query_argument("follow", "") in ("1", "true") or (
            "text/event-stream" in self.request.headers.get("Accept", "")
        )
        cap = manager.max_log_read_bytes
        if not follow:
            data, end = await self._read(job.id, offset, cap)
            self.set_header("Content-Type", "text/plain; charset=utf-8")
            self.set_header("X-Log-Offset", str(end))
            self.set_header("X-Log-Size", str(size))
            self.finish(data)
            return
        self.set_header("Content-Type", "text/event-stream")
        state = job.state
        self.write(f"event: state\ndata: {json.dumps({'state': state.value})}\n\n")
        idle = 0.0
        try:
            while True:
                try:
                    data, end = await self._read(job.id, offset, cap)
                except BrokerError as exc:
                    self.write(f"event: error\ndata: {json.dumps({'error': exc.message})}\n\n")
                    break
                if data:
                    text = data.decode("utf-8", errors="replace")
                    self.write(f"event: log\ndata: {json.dumps({'offset': end, 'text': text})}"
                               "\n\n")
                    offset = end
                    idle = 0.0
                current = manager.store.get(job.id)
                if current is not None and current.state is not state:
                    state = current.state
                    self.write(
                        f"event: state\ndata: "
                        f"{json.dumps({'state': state.value, 'reason': current.reason})}\n\n"
                    )
                await self.flush()
                if state in TERMINAL and not data:
                    self.write(f"event: end\ndata: {json.dumps({'state': state.value})}\n\n")
                    await self.flush()
                    break
                if not data:
                    idle += 0.5
                    if idle >= 15:
                        self.write(": keep-alive\n\n")
                        idle = 0.0
                    await asyncio.sleep(0.5)
        except StreamClosedError:
            pass
        self.finish()

    async def _read(self, job_id: str, offset: int, cap: int) -> tuple[bytes, int]:
        """Up to ``cap`` bytes of the log (a bounded read, off the loop); a log that is a
        link is refused with the reason (403), never served."""
        try:
            return await asyncio.get_running_loop().run_in_executor(  # type: ignore[no-any-return]
                None, self.jobs.backend.read_log, job_id, offset, cap)
        except UnsafeFile as exc:
            raise BrokerError(403, f"job {job_id}'s log is not served: {exc}") from None

    def _int(self, name: str, default: int) -> int:
        value = self.get_query_argument(name, None)
        if value is None:
            return default
        try:
            number = int(value)
        except ValueError as exc:
            raise BadField(name, f"{name} must be a whole number") from exc
        if number < 0 or number > 10**12:
            raise BadField(name, f"{name} must be between 0 and 10^12")
        return number


def job_routes(base: str) -> list[tuple[str, type]]:
    """Routes under ``<base_url>/api/v1``."""
    return [
        (base + r"/jobs", JobsHandler),
        (base + r"/jobs/options", JobOptionsHandler),
        (base + r"/jobs/([^/]+)", JobHandler),
        (base + r"/jobs/([^/]+)/events", JobEventsHandler),
        (base + r"/jobs/([^/]+)/log", JobLogHandler),
        (base + r"/jobs/([^/]+)/output", JobOutputHandler),
    ]


__all__ = ["JobState", "job_routes"]
