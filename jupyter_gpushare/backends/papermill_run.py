"""One attempt of a job, run by papermill: ``python -m <this module> DIR``.

``DIR`` holds ``spec.json`` (written by the backend) and the notebook snapshot
``input.ipynb``. This process is the head of the job's own process group (session); it

* executes the snapshot with papermill (parameters injected papermill-style, cell
  outputs streamed to the job's log, the notebook saved after every cell);
* on SIGTERM (preemption notice, cancel) forwards the signal to every descendant, the
  kernel included (jupyter_client starts kernels in their own session, so a signal to the
  process group alone would miss it), and lets the notebook save its checkpoint;
* keeps the executed notebook even when a cell fails, and writes the failing cell and
  its error (ANSI codes stripped) into ``status.json``, written atomically last: its
  presence means the attempt ended and says how;
* copies the executed notebook into the user's files (``output_path``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

TERMINATED = {"flag": False}


def _descendants() -> list[Any]:
    import psutil

    try:
        return list(psutil.Process().children(recursive=True))
    except psutil.Error:
        return []


def _on_term(signum: int, _frame: Any) -> None:
    TERMINATED["flag"] = True
    for proc in _descendants():
        with contextlib.suppress(Exception):  # a child may be gone already
            proc.send_signal(signum)


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def _injected_before(executed: Path, index: int) -> bool:
    """Whether papermill injected its parameters cell before cell ``index``."""
    try:
        cells = json.loads(executed.read_text())["cells"][:index]
    except (OSError, ValueError, KeyError):
        return False
    return any("injected-parameters" in (c.get("metadata") or {}).get("tags", []) for c in cells)


def _error_of(exc: BaseException, executed: Path) -> dict[str, Any]:
    from papermill.exceptions import PapermillExecutionError

    from ..core.jobs import cell_error, strip_ansi

    if isinstance(exc, PapermillExecutionError):
        # name the cell as the user knows it: its place in the notebook they submitted
        index = exc.cell_index - (1 if _injected_before(executed, exc.cell_index) else 0)
        out = cell_error(
            index, exc.exec_count, exc.ename, exc.evalue, exc.traceback, exc.source
        ).to_json()
        out["executed_cell_index"] = exc.cell_index
        return out
    text = strip_ansi(f"{type(exc).__name__}: {exc}").strip()
    return {"summary": text.splitlines()[0][:500] if text else type(exc).__name__,
            "ename": type(exc).__name__, "evalue": text[:2000], "traceback": "",
            "cell_index": None, "execution_count": None, "source": ""}


def _ipc_kernel_manager(sockets: str) -> type:
    """A kernel manager whose kernel talks over Unix sockets in ``sockets``, not TCP: with
    TCP the manager picks free ports and the kernel binds them later, and on a busy node
    another process can take one in between ("Address already in use", the kernel dies
    before it answers: seen when many jobs start at once)."""
    from jupyter_client.manager import AsyncKernelManager

    class IPCKernelManager(AsyncKernelManager):  # type: ignore[misc]
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(transport="ipc", ip=os.path.join(sockets, "k"), **kwargs)

    return IPCKernelManager


def run(attempt_dir: Path) -> int:
    spec = json.loads((attempt_dir / "spec.json").read_text())
    started = time.time()
    print(f"--- gpushare job {spec['job_id']} attempt {spec['attempt']} "
          f"started {time.strftime('%Y-%m-%d %H:%M:%S')} ---", flush=True)
    signal.signal(signal.SIGTERM, _on_term)
    local_out = attempt_dir / "output.ipynb"
    from .job_watchdog import JobWatchdog

    watchdog = JobWatchdog(os.environ, spec.get("name") or "the job's notebook")
    watchdog.start()
    error: dict[str, Any] | None = None
    code = 0
    stack = contextlib.ExitStack()
    try:
        if spec.get("cwd"):
            os.makedirs(spec["cwd"], exist_ok=True)
        import papermill

        # short paths (a Unix socket's is limited to 107 bytes), removed after the run
        sockets = tempfile.mkdtemp(prefix="gpushare-kernel-")
        stack.callback(shutil.rmtree, sockets, True)
        papermill.execute_notebook(
            str(attempt_dir / "input.ipynb"),
            str(local_out),
            parameters=spec.get("parameters") or {},
            kernel_name=spec.get("kernel_name") or None,
            log_output=True,
            stdout_file=sys.stdout,
            stderr_file=sys.stderr,
            progress_bar=False,
            cwd=spec.get("cwd") or None,
            request_save_on_cell_execute=True,
            kernel_manager_class=_ipc_kernel_manager(sockets),
        )
    except BaseException as exc:  # noqa: BLE001 - every failure is reported in status.json
        error = _error_of(exc, local_out)
        code = 143 if TERMINATED["flag"] else 1
        if watchdog.message:  # the watchdog stopped the kernel: say why, as to a kernel
            error = dict(error, summary=watchdog.message, ename="GPUMemoryLimitExceeded",
                         evalue=watchdog.message)
            code = 1
        print(f"--- {error.get('summary')} ---", flush=True)
    stack.close()
    watchdog.stop()
    out = spec.get("output_path")
    copied = None
    if out and local_out.exists():
        try:
            Path(out).parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(out).with_name(Path(out).name + ".partial")
            shutil.copyfile(local_out, tmp)
            os.replace(tmp, out)
            copied = out
        except OSError as exc:
            print(f"--- could not write the output notebook {out}: {exc} ---", flush=True)
            if error is None:
                error = {"summary": f"could not write the output notebook: {exc}"}
                code = 1
    _write_json(
        attempt_dir / "status.json",
        {
            "exit_code": code,
            "error": error,
            "output_path": copied,
            "started_at": started,
            "ended_at": time.time(),
            "terminated": TERMINATED["flag"],
        },
    )
    print(f"--- attempt {spec['attempt']} ended with exit code {code} ---", flush=True)
    return code


def main() -> None:
    sys.exit(run(Path(sys.argv[1])))


if __name__ == "__main__":
    main()
