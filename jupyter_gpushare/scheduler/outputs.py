"""A finished broker job's files in jupyter-scheduler's staging folder: the executed
notebook (``ipynb``), its HTML rendering (``html``) and the job's log (``log``), each where
:meth:`Scheduler.get_staging_paths` says, so "Download job files" copies them."""

from __future__ import annotations

import json
import os
from urllib.parse import quote

import nbconvert
import nbformat

from .broker_http import call_broker


def write(path: str, data: bytes) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.part"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def as_html(notebook: bytes) -> bytes:
    node = nbformat.reads(notebook.decode("utf-8"), as_version=4)
    body, _ = nbconvert.HTMLExporter().from_notebook_node(node)
    return str(body).encode("utf-8")


async def stage_outputs(job_id: str, formats: list[str], staging: dict[str, str]) -> None:
    """Fetch what the job left (a job that failed before its notebook ran has no notebook:
    its log says why) and put each asked-for format in its staging path, once."""
    wanted = [f for f in formats if f in staging and not os.path.exists(staging[f])]
    if not wanted:
        return
    jid = quote(job_id, safe="")
    if {"ipynb", "html"} & set(wanted):
        answer = await call_broker("GET", f"/jobs/{jid}/output", timeout_s=120.0)
        if answer.status == 200:
            json.loads(answer.body)  # a notebook, not an error page
            if "ipynb" in wanted:
                write(staging["ipynb"], answer.body)
            if "html" in wanted:
                write(staging["html"], as_html(answer.body))
    if "log" in wanted:
        answer = await call_broker("GET", f"/jobs/{jid}/log", timeout_s=120.0)
        if answer.status == 200:
            write(staging["log"], answer.body)
