"""``GET /gpushare/api/jobs/{id}/output``: a batch job's executed notebook, for its owner.

Where the broker has the notebook (the local and Slurm backends keep a copy in the job
folder, YTsaurus in the output table) the broker's answer is relayed as it is. Where the
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
3. the file is read through the contents manager (which keeps to the root and hides what it
   hides), at most ``c.GPUShareServerApp.max_output_bytes``.
"""

from __future__ import annotations

import json
import os
import posixpath
from typing import Any
from urllib.parse import quote

from jupyter_server.auth.decorator import authorized
from tornado import web

from .jobs import _JobsHandler, _maybe_await

DEFAULT_MAX_OUTPUT_BYTES = 256 * 1024 * 1024


class JobOutputHandler(_JobsHandler):
    """The executed notebook (see the module docstring)."""

    @web.authenticated
    @authorized
    async def get(self, job_id: str) -> None:
        qid = quote(job_id, safe="")
        status, data, ctype = await self.broker("GET", f"/jobs/{qid}/output", timeout=120.0)
        if status != 404:
            self._send(status, data, ctype)
            return
        found, jbody, jtype = await self.broker("GET", f"/jobs/{qid}")
        if found != 200:  # not this user's job, or no such job: the broker's answer
            self._send(found, jbody, jtype)
            return
        job = json.loads(jbody)
        backend = await self._backend(str(job.get("backend") or ""))
        if backend is None or not backend.get("output_in_user_files_only"):
            self._send(status, data, ctype)  # the broker's 404: no output yet
            return
        await self._from_user_files(job, str(backend.get("user_files_mount") or ""))

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
        where = os.path.join(mount, rel)
        inside = os.path.relpath(os.path.realpath(where), os.path.realpath(str(root)))
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
            model = await _maybe_await(cm.get(rel, content=False, type="file"))
            size = model.get("size")
            if isinstance(size, int) and size > limit:
                self._fail(413, f"the output notebook {rel} is {size} bytes, over this "
                           f"route's limit of {limit} (c.GPUShareServerApp.max_output_bytes); "
                           "open it in JupyterLab")
                return
            model = await _maybe_await(cm.get(rel, content=True, type="file", format="text"))
        except web.HTTPError as exc:
            if exc.status_code != 404:
                raise
            self._fail(404, f"job {job.get('id')} has no output notebook in your files yet "
                       f"({job.get('state')}): it is written to {rel}")
            return
        body = str(model.get("content") or "").encode()
        if len(body) > limit:  # it grew between the two looks
            self._fail(413, f"the output notebook {rel} is over this route's limit of {limit} "
                       "bytes (c.GPUShareServerApp.max_output_bytes); open it in JupyterLab")
            return
        name = posixpath.basename(rel).replace('"', "")
        self.set_header("Content-Disposition", f'attachment; filename="{name}"')
        self.set_header("X-Gpushare-Output-Path", quote(rel))
        self.finish(body, set_content_type="application/x-ipynb+json")
