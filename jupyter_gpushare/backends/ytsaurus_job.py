"""One attempt inside a YTsaurus job: ``python -m <this module> NOTEBOOK SPEC``.

Run by the vanilla operation's command in the job's sandbox, where YTsaurus put the
notebook snapshot and the runner's ``spec.json`` (``file_paths``, read-only links). It

* moves its own stdout aside first: file descriptor 1 is the attempt's output table
  (format ``json``, one row per line), and everything the run prints goes to stderr, the
  job's log (``get_job_stderr``);
* runs :func:`jupyter_gpushare.backends.papermill_run.run` on a writable copy of the
  snapshot (SIGTERM, YTsaurus's ``interruption_signal``, reaches the kernel through it);
* writes one ``status`` row (the runner's ``status.json``) and the executed notebook as
  ``notebook`` rows of base64 parts (ASCII, so YTsaurus's JSON string rules never bite);
* exits 0 whenever those rows are written, also for a failed or stopped notebook: a
  failed job's output table is not committed, so the run's true exit code, error and
  ``terminated`` flag travel in the status row, and the broker reads them from there.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

PART_BYTES = 1024 * 1024
"""Raw bytes of the executed notebook per output row (YTsaurus limits a row's weight)."""


def rows(status: dict[str, Any], notebook: bytes | None) -> Iterator[dict[str, Any]]:
    """The output table's rows for one attempt."""
    yield {"kind": "status", "part": 0, "data": json.dumps(status)}
    if notebook is not None:
        for i in range(0, max(1, len(notebook)), PART_BYTES):
            chunk = notebook[i:i + PART_BYTES]
            yield {"kind": "notebook", "part": i // PART_BYTES,
                   "data": base64.b64encode(chunk).decode("ascii")}


def parse_rows(table: list[dict[str, Any]]) -> tuple[dict[str, Any] | None, bytes | None]:
    """(status, executed notebook) from an output table's rows (None where absent)."""
    status = None
    parts: list[tuple[int, bytes]] = []
    for row in table:
        kind = row.get("kind")
        if kind == "status":
            try:
                status = json.loads(str(row.get("data") or "{}"))
            except ValueError:
                status = {"exit_code": 1, "error": {"summary": "unreadable status row"}}
        elif kind == "notebook":
            parts.append((int(row.get("part") or 0), base64.b64decode(str(row.get("data")))))
    notebook = b"".join(p for _, p in sorted(parts)) if parts else None
    return status, notebook


def _write_rows(out: IO[str], status: dict[str, Any], notebook: bytes | None) -> None:
    for row in rows(status, notebook):
        out.write(json.dumps(row) + "\n")
    out.flush()


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2:
        print("usage: python -m jupyter_gpushare.backends.ytsaurus_job NOTEBOOK SPEC",
              file=sys.stderr)
        return 2
    sys.stdout.flush()
    table_fd = os.dup(1)
    os.dup2(2, 1)  # all the run prints goes to the job's stderr
    out = os.fdopen(table_fd, "w", encoding="ascii")
    adir = Path("attempt").resolve()
    adir.mkdir(exist_ok=True)
    shutil.copyfile(args[0], adir / "input.ipynb")
    shutil.copyfile(args[1], adir / "spec.json")
    ckpt = Path(os.environ.get("GPUSHARE_CHECKPOINT_DIR") or "checkpoint").resolve()
    ckpt.mkdir(parents=True, exist_ok=True)
    os.environ["GPUSHARE_CHECKPOINT_DIR"] = str(ckpt)
    from .papermill_run import run

    try:
        code = run(adir)
    except BaseException as exc:  # noqa: BLE001 - the status row says what broke
        code = 1
        print(f"--- the runner failed: {type(exc).__name__}: {exc} ---", file=sys.stderr)
    try:
        status = json.loads((adir / "status.json").read_text())
    except (OSError, ValueError):
        status = {"exit_code": code, "error": {"summary": "the runner wrote no status"}}
    try:
        notebook: bytes | None = (adir / "output.ipynb").read_bytes()
    except OSError:
        notebook = None
    _write_rows(out, status, notebook)
    out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
