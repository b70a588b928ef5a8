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
* carries the checkpoint folder across attempts: it starts from the archive of the
  previous attempt where the backend passed one (``GPUSHARE_CHECKPOINT_ARCHIVE``) and
  leaves the folder as ``checkpoint`` rows (a gzipped tar, at most
  ``GPUSHARE_CHECKPOINT_MAX_BYTES``; 0 or unset: none), since the sandbox is gone after
  the job;
* exits 0 whenever those rows are written, also for a failed or stopped notebook: a
  failed job's output table is not committed, so the run's true exit code, error and
  ``terminated`` flag travel in the status row, and the broker reads them from there.
"""

from __future__ import annotations

import base64
import io
import json
import os
import shutil
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

PART_BYTES = 1024 * 1024
"""Raw bytes of the executed notebook per output row (YTsaurus limits a row's weight)."""


def _parts(kind: str, data: bytes) -> Iterator[dict[str, Any]]:
    for i in range(0, max(1, len(data)), PART_BYTES):
        yield {"kind": kind, "part": i // PART_BYTES,
               "data": base64.b64encode(data[i:i + PART_BYTES]).decode("ascii")}


def rows(status: dict[str, Any], notebook: bytes | None,
         checkpoint: bytes | None = None) -> Iterator[dict[str, Any]]:
    """The output table's rows for one attempt."""
    yield {"kind": "status", "part": 0, "data": json.dumps(status)}
    if notebook is not None:
        yield from _parts("notebook", notebook)
    if checkpoint is not None:
        yield from _parts("checkpoint", checkpoint)


def joined(table: list[dict[str, Any]], kind: str) -> bytes | None:
    """The bytes of the ``kind`` rows (``notebook``, ``checkpoint``), None if there are none."""
    parts = sorted((int(r.get("part") or 0), base64.b64decode(str(r.get("data"))))
                   for r in table if r.get("kind") == kind)
    return b"".join(p for _, p in parts) if parts else None


def parse_rows(table: list[dict[str, Any]]) -> tuple[dict[str, Any] | None, bytes | None]:
    """(status, executed notebook) from an output table's rows (None where absent)."""
    status = None
    for row in table:
        if row.get("kind") == "status":
            try:
                status = json.loads(str(row.get("data") or "{}"))
            except ValueError:
                status = {"exit_code": 1, "error": {"summary": "unreadable status row"}}
    return status, joined(table, "notebook")


def pack(folder: Path, max_bytes: int) -> bytes | None:
    """``folder`` as a gzipped tar, None if it is empty or the archive exceeds ``max_bytes``."""
    if max_bytes <= 0 or not folder.is_dir() or not any(folder.iterdir()):
        return None
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for item in sorted(folder.iterdir()):
            tar.add(item, arcname=item.name)
    data = buf.getvalue()
    if len(data) > max_bytes:
        print(f"--- the checkpoint folder ({len(data)} bytes packed) is over the "
              f"{max_bytes}-byte limit: the next attempt starts without it ---", file=sys.stderr)
        return None
    return data


def unpack(archive: Path, folder: Path) -> None:
    """The previous attempt's checkpoint into ``folder`` (no path may leave it)."""
    with tarfile.open(archive, mode="r:gz") as tar:
        try:
            tar.extractall(folder, filter="data")
        except TypeError:  # a Python before 3.11.4 has no extraction filters
            root = folder.resolve()
            members = [m for m in tar.getmembers() if (m.isfile() or m.isdir()) and
                       (root / m.name).resolve().is_relative_to(root)]
            tar.extractall(folder, members=members)  # noqa: S202 - members checked above


def _write_rows(out: IO[str], status: dict[str, Any], notebook: bytes | None,
                checkpoint: bytes | None) -> None:
    for row in rows(status, notebook, checkpoint):
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
    archive = os.environ.pop("GPUSHARE_CHECKPOINT_ARCHIVE", "")
    if archive and os.path.exists(archive):
        try:
            unpack(Path(archive), ckpt)
            print("--- resumed the checkpoint folder of the previous attempt ---",
                  file=sys.stderr)
        except (OSError, tarfile.TarError) as exc:
            print(f"--- could not unpack the previous checkpoint ({exc}): starting afresh ---",
                  file=sys.stderr)
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
    max_bytes = int(os.environ.get("GPUSHARE_CHECKPOINT_MAX_BYTES") or 0)
    _write_rows(out, status, notebook, pack(ckpt, max_bytes))
    out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
