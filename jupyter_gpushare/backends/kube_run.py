"""The command of a Kubernetes job's container: ``python -m <this module> INPUT WORK``.

``INPUT`` is the attempt's ConfigMap, mounted read-only (``spec.json`` and the
gzip-compressed snapshot ``input.ipynb.gz``); ``WORK`` is the attempt's folder in the
user's storage. It unpacks the snapshot into ``WORK``, runs the attempt with the same
papermill runner as the local backend (:mod:`.papermill_run`: SIGTERM forwarded to the
kernel, the notebook saved after every cell and copied into the user's files) and writes
the runner's ``status.json``, shortened to fit, to the container's termination message
(``/dev/termination-log``): the broker reads the result there, from the pod's status,
without access to the user's files.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

TERMINATION_LOG = "/dev/termination-log"
MESSAGE_LIMIT = 4000  # Kubernetes keeps at most 4096 bytes of a termination message


def termination_message(status: dict[str, Any], limit: int = MESSAGE_LIMIT) -> str:
    """``status`` as compact JSON of at most ``limit`` bytes: the traceback and source go
    first, then long texts are cut; exit code, summary and flags always stay."""
    data = dict(status)
    error = dict(data.get("error") or {}) if data.get("error") else None
    data["error"] = error
    text = json.dumps(data, separators=(",", ":"))
    for key in ("traceback", "source", "evalue"):
        if len(text.encode()) <= limit or error is None:
            break
        error[key] = ""
        text = json.dumps(data, separators=(",", ":"))
    if len(text.encode()) > limit and error is not None:
        error["summary"] = str(error.get("summary") or "")[:500]
        text = json.dumps(data, separators=(",", ":"))
    if len(text.encode()) > limit:
        text = json.dumps({"exit_code": data.get("exit_code"),
                           "terminated": data.get("terminated")})
    return text


def prepare(input_dir: Path, work: Path) -> None:
    """Unpack the ConfigMap's files into the attempt's folder."""
    work.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(input_dir / "spec.json", work / "spec.json")
    (work / "input.ipynb").write_bytes(gzip.decompress((input_dir / "input.ipynb.gz")
                                                       .read_bytes()))
    for name in ("status.json", "output.ipynb"):  # a rerun of the same folder starts clean
        with contextlib.suppress(FileNotFoundError):
            (work / name).unlink()
    checkpoint = os.environ.get("GPUSHARE_CHECKPOINT_DIR")
    if checkpoint:
        Path(checkpoint).mkdir(parents=True, exist_ok=True)
    if os.environ.get("GPUSHARE_TORCH_MEMORY_FRACTION"):
        # PyTorch's memory fraction, applied in every Python process (the kernel too)
        from ..spawner.enforcement import PYHOOK_DIR

        parts = [PYHOOK_DIR, *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                               if p]]
        os.environ["PYTHONPATH"] = os.pathsep.join(parts)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m jupyter_gpushare.backends.kube_run INPUT_DIR WORK_DIR",
              file=sys.stderr)
        return 2
    input_dir, work = Path(args[0]), Path(args[1])
    log_path = os.environ.get("GPUSHARE_TERMINATION_LOG", TERMINATION_LOG)
    try:
        prepare(input_dir, work)
    except (OSError, ValueError) as exc:
        status: dict[str, Any] = {"exit_code": 1, "terminated": False,
                                  "error": {"summary": f"could not prepare the job: {exc}"}}
        code = 1
    else:
        from .papermill_run import run

        code = run(work)
        try:
            status = json.loads((work / "status.json").read_text())
        except (OSError, ValueError):
            status = {"exit_code": code, "error": None}
    with contextlib.suppress(OSError):
        Path(log_path).write_text(termination_message(status))
    return code


if __name__ == "__main__":
    sys.exit(main())
