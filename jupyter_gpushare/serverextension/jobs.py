"""The jobs routes JupyterLab calls (``/gpushare/api/jobs...``), relayed to the broker.

The server takes the notebook from the user's own files (through the contents manager,
so a path outside the server's root is refused), sends the snapshot to the broker with
the server's own token (``$JUPYTERHUB_API_TOKEN``), and relays the broker's answers as
they are (status, body, the field a refusal names). The executed notebook is written by
the job itself into the user's files (``output_path``, relative to the same root), so it
arrives even when this server is no longer running; ``/output`` serves it from the broker,
or from this server's files where only they have it (:mod:`.job_output`).

Routes (all authenticated, ``gpushare`` resource):

* ``POST /gpushare/api/jobs`` ``{path, profile, priority?, max_runtime?, checkpoint?,
  parameters?, team?, output_path?, backend?}``
* ``GET /gpushare/api/jobs``; ``GET|DELETE /gpushare/api/jobs/{id}``;
  ``GET /gpushare/api/jobs/{id}/events``, ``/output``, ``/log`` (``?follow=1``: SSE)
* ``GET /gpushare/api/jobs/options?path=NB`` the broker's options plus the notebook's
  ``parameters`` cell (its source and the parameters papermill finds in it)
"""

from __future__ import annotations

import contextlib
import json
import uuid
from typing import Any
from urllib.parse import quote, urlencode

from jupyter_server.auth.decorator import authorized
from tornado import web
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest
from tornado.iostream import StreamClosedError

from .job_output import JobOutputHandler
from .job_relay import JobsRelayHandler, broker_base, server_token

FIELDS = ("profile", "priority", "max_runtime", "checkpoint", "parameters", "team",
          "output_path", "backend")


class JobsHandler(JobsRelayHandler):
    @web.authenticated
    @authorized
    async def post(self) -> None:
        try:
            body = json.loads(self.request.body or b"{}")
        except ValueError:
            self._fail(400, "the body must be a JSON object", "body")
            return
        if not isinstance(body, dict):
            self._fail(400, "the body must be a JSON object", "body")
            return
        nb = await self.read_notebook(body.get("path"))
        if nb is None:
            return
        out = {k: body[k] for k in FIELDS if k in body}
        out.update(notebook=nb["content"], name=nb["name"], path=nb["path"])
        # sent again after a broker that died before answering: it finds the job made
        out["idempotency_key"] = f"lab-{uuid.uuid4().hex}"
        await self.relay("POST", "/jobs", out)

    @web.authenticated
    @authorized
    async def get(self) -> None:
        await self.relay("GET", "/jobs")


class JobOptionsHandler(JobsRelayHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        status, data, _ = await self.broker("GET", "/jobs/options")
        if status != 200:
            self.set_status(status)
            self.finish(data)
            return
        options = json.loads(data)
        path = self.get_query_argument("path", None)
        options["notebook"] = None
        if path:
            nb = await self.read_notebook(path)
            if nb is None:
                return
            options["notebook"] = {"path": nb["path"], "name": nb["name"],
                                   "kernelspec": kernelspec_of(nb["content"]),
                                   **parameters_cell(nb["content"])}
        self.finish(json.dumps(options))


def kernelspec_of(nb: dict[str, Any]) -> dict[str, str] | None:
    """The notebook's kernel (``metadata.kernelspec``: name and display name), or None when it
    names none: the broker refuses such a notebook, so the submit dialog says so first."""
    spec = (nb.get("metadata") or {}).get("kernelspec")
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str) or not spec["name"]:
        return None
    shown = spec.get("display_name")
    return {"name": spec["name"][:255],
            "display_name": (shown if isinstance(shown, str) else spec["name"])[:255]}


def parameters_cell(nb: dict[str, Any]) -> dict[str, Any]:
    """The notebook's ``parameters`` cell (papermill's tag) and the parameters in it."""
    for cell in nb.get("cells") or []:
        tags = (cell.get("metadata") or {}).get("tags") or []
        if cell.get("cell_type") == "code" and "parameters" in tags:
            source = cell.get("source") or ""
            source = "".join(source) if isinstance(source, list) else source
            found: list[dict[str, Any]] = []
            try:
                import nbformat
                from papermill.translators import papermill_translators

                kernel = ((nb.get("metadata") or {}).get("kernelspec") or {})
                language = kernel.get("language") or "python"
                translator = papermill_translators.find_translator(
                    kernel.get("name") or "python3", language
                )
                for p in translator.inspect(nbformat.v4.new_code_cell(source)):
                    found.append({"name": p.name, "type": p.inferred_type_name,
                                  "default": p.default, "help": p.help})
            except Exception:  # noqa: BLE001 - a language papermill cannot inspect
                found = []
            return {"parameters_cell": source, "parameters": found}
    return {"parameters_cell": None, "parameters": []}


class JobHandler(JobsRelayHandler):
    @web.authenticated
    @authorized
    async def get(self, job_id: str) -> None:
        await self.relay("GET", f"/jobs/{quote(job_id, safe='')}")

    @web.authenticated
    @authorized
    async def delete(self, job_id: str) -> None:
        await self.relay("DELETE", f"/jobs/{quote(job_id, safe='')}")


class JobEventsHandler(JobsRelayHandler):
    @web.authenticated
    @authorized
    async def get(self, job_id: str) -> None:
        await self.relay("GET", f"/jobs/{quote(job_id, safe='')}/events")


class JobLogHandler(JobsRelayHandler):
    """The log as text (``offset``, ``tail``), or followed as server-sent events."""

    @web.authenticated
    @authorized
    async def get(self, job_id: str) -> None:
        args = {k: self.get_query_argument(k) for k in ("offset", "tail", "follow")
                if self.get_query_argument(k, None) is not None}
        path = f"/jobs/{quote(job_id, safe='')}/log"
        if args:
            path += "?" + urlencode(args)
        if args.get("follow") not in ("1", "true"):
            status, data, ctype = await self.broker("GET", path)
            self.set_status(status)
            self.finish(data, set_content_type=ctype)
            return
        status, data, _ = await self.broker("GET", f"/jobs/{quote(job_id, safe='')}")
        if status != 200:
            self.set_status(status)
            self.finish(data)
            return
        self.set_header("Content-Type", "text/event-stream")
        self.set_header("Cache-Control", "no-cache")

        def chunk(part: bytes) -> None:
            try:
                self.write(part)
                self.flush()
            except StreamClosedError:
                pass

        req = HTTPRequest(
            broker_base() + path,
            headers={"Authorization": f"token {server_token()}", "Accept": "text/event-stream"},
            streaming_callback=chunk, request_timeout=24 * 3600.0,
        )
        with contextlib.suppress(OSError, HTTPClientError, StreamClosedError):
            await AsyncHTTPClient().fetch(req, raise_error=False)
        if not self._finished:
            self.finish()


def job_handlers() -> list[tuple[str, type]]:
    """Routes, relative to the server's base URL."""
    return [
        (r"/gpushare/api/jobs", JobsHandler),
        (r"/gpushare/api/jobs/options", JobOptionsHandler),
        (r"/gpushare/api/jobs/([^/]+)", JobHandler),
        (r"/gpushare/api/jobs/([^/]+)/events", JobEventsHandler),
        (r"/gpushare/api/jobs/([^/]+)/output", JobOutputHandler),
        (r"/gpushare/api/jobs/([^/]+)/log", JobLogHandler),
    ]
