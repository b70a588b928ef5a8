"""A finished YTsaurus operation's result, for the YTsaurus backend: the status row and the
executed notebook read from the attempt's output table, the notebook delivered to the user's
files (and a Cypress folder where one is configured), and why an operation failed.

:class:`YTsaurusResults` is held by :class:`~.ytsaurus.YTsaurusBackend` (``backend.results``);
it is handed the way to the client, the settings it uses and the way to know which operations
jupyter-gpushare interrupted itself.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .base import RunHandle, RunStatus
from .ytsaurus_job import parse_rows

INTERRUPTED_BY_YT = (
    "interrupted by YTsaurus, not by jupyter-gpushare: its scheduler preempted the job "
    "(e.g. its pool was above its fair share while another pool starved); align the pools "
    "with the policy (jupyter-gpushare export ytsaurus) and submit it again"
)


class YTsaurusResults:
    """A finished operation's result and output."""

    def __init__(
        self,
        client: Callable[[], Any],
        *,
        deliver_output: bool,
        output_cypress_dir: str,
        signalled: Callable[[str], bool],
        log: logging.Logger | logging.LoggerAdapter[Any],
    ) -> None:
        self.get_client = client  # the yt.wrapper client (made at its first use)
        self.deliver_output = deliver_output
        self.output_cypress_dir = output_cypress_dir
        self.signalled = signalled  # whether jupyter-gpushare interrupted the operation
        self.log = log

    @property
    def client(self) -> Any:
        return self.get_client()

    def final(self, handle: RunHandle, op_id: str, state: str, info: dict[str, Any]) -> RunStatus:
        if state == "completed":
            table = str(handle.ref.get("output_table") or "")
            try:
                status, notebook = parse_rows(list(self.client.read_table(table, format="json")))
            except Exception as exc:  # noqa: BLE001
                self.log.warning("YTsaurus: cannot read %s: %s", table, exc)
                status, notebook = None, None
            if status is not None:
                delivered = self._deliver(handle, notebook) if notebook is not None else None
                error = status.get("error")
                if status.get("terminated") and not self.signalled(op_id):
                    error = dict(error or {}, summary=INTERRUPTED_BY_YT)
                return RunStatus(
                    alive=False,
                    finished=True,
                    exit_code=int(status.get("exit_code", 1)),
                    error=error,
                    output_path=delivered,
                    started_at=status.get("started_at"),
                    ended_at=status.get("ended_at"),
                    terminated=bool(status.get("terminated")),
                )
            return RunStatus(
                alive=False,
                error={"summary": f"YTsaurus operation {op_id} completed without a status row"},
            )
        error = (info.get("result") or {}).get("error") or {}
        message = str(error.get("message") or state)
        inner = [
            str(e.get("message"))
            for e in error.get("inner_errors") or []
            if isinstance(e, dict) and e.get("message")
        ]
        text = "; ".join([message, *inner[:2]])[:500]
        return RunStatus(
            alive=False,
            terminated=self.signalled(op_id),
            error={"summary": f"YTsaurus operation {op_id} {state}: {text}"},
        )

    def _deliver(self, handle: RunHandle, notebook: bytes) -> str | None:
        """Put the executed notebook where the user finds it; the local path written."""
        user = str(handle.ref.get("user") or "")
        if self.output_cypress_dir and user:
            folder = self.output_cypress_dir.format(username=user).rstrip("/")
            name = (
                os.path.basename(str(handle.ref.get("output_path") or ""))
                or f"{handle.job_id}.ipynb"
            )
            try:
                self.client.create("map_node", folder, recursive=True, ignore_existing=True)
                self.client.write_file(f"{folder}/{name}", notebook)
            except Exception as exc:  # noqa: BLE001
                self.log.warning(
                    "YTsaurus: cannot copy the output of %s to %s: %s", handle.job_id, folder, exc
                )
        out = str(handle.ref.get("output_path") or "")
        if not (self.deliver_output and out):
            return None
        try:
            target = Path(out)
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(target.name + ".partial")
            tmp.write_bytes(notebook)
            owner = target.parent.stat()
            if os.geteuid() == 0:  # the broker runs as root: the file is the user's
                os.chown(tmp, owner.st_uid, owner.st_gid)
            os.replace(tmp, target)
            return str(target)
        except OSError as exc:
            self.log.warning("cannot write the output of job %s to %s: %s", handle.job_id, out, exc)
            return None

    def fetch_output(self, handle: RunHandle) -> bytes | None:
        table = str(handle.ref.get("output_table") or "")
        if not table:
            return None
        try:
            _, notebook = parse_rows(list(self.client.read_table(table, format="json")))
        except Exception:  # noqa: BLE001 - no table (yet)
            return None
        return notebook
