"""``GET /gpushare/api/jobs/{id}/output``: a batch job's executed notebook, for its owner.

Where the broker has the notebook (the local and Slurm backends keep a copy in the job
folder, YTsaurus in the output table) the broker's answer is relayed, a range of
``RELAY_CHUNK`` bytes at a time (``Range:`` requests, each sent on before the next is
asked for: a 1 GB notebook never sits in this server's memory). Where the
backend writes it only into the user's own files (``output_in_user_files_only`` in the
backend's capabilities: on Kubernetes the job pod writes into the user's volume, which the
broker does not mount) the broker answers 404, and this server, which mounts that volume,
serves it from its own files:

1. the broker is asked for the job with this server's token, so it says whose job it is:
   another user's job is refused there (403/404, relayed) and nothing is read;
2. the job's ``output_path`` (relative to the user's files) under the backend's
   ``user_files_mount`` (where the job sees them, e.g. ``/home/jovyan``) is mapped into this
   server's root; a path outside the root, or a file missing there, answers 404 with where
   the job wrote it;
3. the contents manager says whether the file is there (it keeps to the root and hides
   what it hides) and how large; at most ``c.GPUShareServerApp.max_output_bytes``;
4. it is read below the root without following a link (:mod:`~jupyter_gpushare.userfiles`),
   streamed in chunks, named with :func:`~jupyter_gpushare.disposition.attachment`.
"""

from __future__ import annotations

import asyncio
import json
import os
import posixpath
from typing import Any
from urllib.parse import quote

from jupyter_server.auth.decorator import authorized
from tornado import web
from tornado.iostream import StreamClosedError

from ..disposition import attachment
from ..userfiles import UnsafeFile, open_file_under
from .job_relay import JobsRelayHandler, maybe_await

DEFAULT_MAX_OUTPUT_BYTES = 256 * 1024 * 1024
RELAY_CHUNK = 4 * 1024 * 1024  # bytes of the broker's notebook asked for (and held) at a time
STREAM_CHUNK = 256 * 1024  # bytes of a file in the user's files read and sent at a time


class JobOutputHandler(JobsRelayHandler):
    """The executed notebook (see the module docstring)."""

    @web.authenticated
    @authorized
    async def get(self, job_id: str) -> None:
        qid = quote(job_id, safe="")
        status, data, headers = await self._range(qid, 0)
        if status != 404:
            await self._relay(qid, status, data, headers)
            return
        found, jbody, jtype = await self.broker("GET", f"/jobs/{qid}")
        if found != 200:  # not this user's job, or no such job: the broker's answer
            self._send(found, jbody, jtype)
            return
        job = json.loads(jbody)
        backend = await self._backend(str(job.get("backend") or ""))
        if backend is None or not backend.get("output_in_user_files_only"):
            self._send(status, data, headers.get("Content-Type", "application/json"))
            return  # the broker's 404: no output yet
        await self._from_user_files(job, str(backend.get("user_files_mount") or ""))

    async def _range(self, qid: str, start: int) -> tuple[int, bytes, dict[str, str]]:
        return await self.broker_call(
            "GET", f"/jobs/{qid}/output", timeout=120.0,
            headers={"Range": f"bytes={start}-{start + RELAY_CHUNK - 1}"},
        )

    async def _relay(self, qid: str, status: int, data: bytes, headers: dict[str, str]) -> None:
        """The broker's answer, then the rest of the file a range at a time."""
        if status != 206:  # the whole answer (an error, or a broker without ranges)
            self._send(status, data, headers.get("Content-Type", "application/json"))
            return
        total = _total(headers.get("Content-Range", ""))
        self.set_status(200)
        for name in ("Content-Type", "Content-Disposition"):
            if name in headers:
                self.set_header(name, headers[name])
        offset = 0
        try:
            while True:
                self.write(data)
                await self.flush()
                offset += len(data)
                if not data or total is None or offset >= total:
                    break
                status, data, headers = await self._range(qid, offset)
                if status != 206:  # it changed under us: end the answer short
                    self.request.connection.close()  # type: ignore[union-attr]
                    return
        except StreamClosedError:
            return
        self.finish()

    def _send(self, status: int, data: bytes, ctype: str) -> None:
        self.set_status(status)
        self.finish(data, set_content_type=ctype)

    async def _backend(self, name: str) -> dict[str, Any] | None:
        """The capabilities of the broker's backend ``name`` (from ``/jobs/options``)."""
        status, data, _ = await self.broker("GET", "/jobs/options")
        if status != 200:
            return None
        try:
            backends = json.loads(data).get("backends") or []
        except (ValueError, AttributeError):
            return None
        return next((b for b in backends if isinstance(b, dict) and b.get("name") == name),
                    None)

    def _relative(self, output_path: str, mount: str) -> str | None:
        """``output_path`` (relative to the user's files, as the job wrote it under
        ``mount``) relative to this server's root; None when it is outside the root."""
        rel = posixpath.normpath(output_path.replace("\\", "/").lstrip("/"))
        if rel.startswith("..") or rel in ("", "."):
            return None
        root = getattr(self.contents_manager, "root_dir", None)
        if not mount or not root:
            return rel
        # the mount and the root are resolved (the admin's); the path below them is not:
        # it is walked without following links when read
        where = os.path.join(os.path.realpath(mount), rel)
        inside = os.path.relpath(where, os.path.realpath(str(root)))
        if inside == os.pardir or inside.startswith(os.pardir + os.sep) or os.path.isabs(inside):
            return None
        return inside.replace(os.sep, "/")

    async def _from_user_files(self, job: dict[str, Any], mount: str) -> None:
        output_path = str(job.get("output_path") or "")
        where = posixpath.join(mount, output_path) if mount else output_path
        rel = self._relative(output_path, mount) if output_path else None
        if rel is None:
            self._fail(404, f"job {job.get('id')} wrote its notebook to {where} in your "
                       "files, which this server does not show (outside its root)")
            return
        cm = self.contents_manager
        limit = int(self.settings.get("gpushare_max_output_bytes", DEFAULT_MAX_OUTPUT_BYTES))
        try:
            model = await maybe_await(cm.get(rel, content=False, type="file"))
        except web.HTTPError as exc:
            if exc.status_code != 404:
                raise
            self._fail(404, f"job {job.get('id')} has no output notebook in your files yet "
                       f"({job.get('state')}): it is written to {rel}")
            return
        size = model.get("size")
        if isinstance(size, int) and size > limit:
            self._fail(413, self._too_large(rel, size, limit))
            return
        root = getattr(cm, "root_dir", None)
        try:
            fd, size = await asyncio.get_running_loop().run_in_executor(
                None, open_file_under, str(root or "."), rel)
        except UnsafeFile as exc:
            self._fail(403, f"the output notebook {rel} is not served: {exc}")
            return
        except OSError:
            self._fail(404, f"job {job.get('id')} has no output notebook in your files yet "
                       f"({job.get('state')}): it is written to {rel}")
            return
        try:
            if size > limit:  # it grew between the two looks
                self._fail(413, self._too_large(rel, size, limit))
                return
            self.set_header("Content-Disposition", attachment(rel))
            self.set_header("X-Gpushare-Output-Path", quote(rel))
            self.set_header("Content-Type", "application/x-ipynb+json")
            self.set_header("Content-Length", str(size))
            await self._stream(fd, size)
        finally:
            os.close(fd)

    async def _stream(self, fd: int, size: int) -> None:
        loop = asyncio.get_running_loop()
        offset = 0
        try:
            while offset < size:
                piece = await loop.run_in_executor(None, os.pread, fd,
                                                   min(STREAM_CHUNK, size - offset), offset)
                if not piece:  # it shrank meanwhile: end the answer short
                    self.request.connection.close()  # type: ignore[union-attr]
                    return
                offset += len(piece)
                self.write(piece)
                await self.flush()
        except StreamClosedError:
            return
        self.finish()

    @staticmethod
    def _too_large(rel: str, size: int, limit: int) -> str:
        return (f"the output notebook {rel} is {size} bytes, over this route's limit of {limit} "
                "(c.GPUShareServerApp.max_output_bytes); open it in JupyterLab")


def _total(content_range: str) -> int | None:
    """The whole size in ``Content-Range: bytes A-B/SIZE``."""
    try:
        return int(content_range.rsplit("/", 1)[1])
    except (IndexError, ValueError):
        return None
