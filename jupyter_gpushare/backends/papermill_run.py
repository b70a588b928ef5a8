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
* copies the executed notebook into the user's files (``output_path``): walking down from
  the user's root (``output_root``) without following a link (a link swapped in while the
  job ran is refused, not followed out of the user's files), at most ``max_output_bytes``
  (a larger notebook fails the job with that reason and is not copied).
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

from ..userfiles import Folder, OverLimit, copy_fd, human_bytes, parts_of

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
    with Folder.root(str(path.parent)) as folder:
        folder.write_atomic(path.name, json.dumps(data).encode())


def over_output_limit(size: int, limit: int) -> str:
    """The reason a job fails with when its executed notebook is over the bound."""
    return (f"the executed notebook is {human_bytes(size)}, over JobManager.max_output_bytes "
            f"= {human_bytes(limit)}: not copied into your files")


def deliver(local_out: Path, spec: dict[str, Any]) -> str:
    """Copy the executed notebook to ``output_path`` in the user's files; returns where.
    With ``output_root`` the folders below it are walked (and made) one at a time without
    following a link; over ``max_output_bytes`` raises :class:`OverLimit`."""
    limit = int(spec.get("max_output_bytes") or 0)
    size = local_out.stat().st_size
    if limit and size > limit:
        raise OverLimit(over_output_limit(size, limit))
    root, rel = spec.get("output_root") or "", spec.get("output_rel") or ""
    if not (root and rel):  # a backend that gives only a path (e.g. Slurm's shared files)
        out = str(spec["output_path"])
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(out).with_name(Path(out).name + ".partial")
        shutil.copyfile(local_out, tmp)
        os.replace(tmp, out)
        return out
    parts = parts_of(rel)
    with Folder.root(root) as top:
        folder = top.sub("/".join(parts[:-1]), create=True) if len(parts) > 1 else Folder(
            os.dup(top.fd), top.shown)
        with folder, Folder.root(str(local_out.parent)) as here:
            src = here.open(local_out.name)
            partial = parts[-1] + ".partial"
            try:
                folder.unlink(partial)
                dst = folder.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                try:
                    copy_fd(src, dst, limit or None)
                finally:
                    os.close(dst)
            except OverLimit as exc:
                folder.unlink(partial)
                raise OverLimit(over_output_limit(limit + 1, limit)) from exc
            finally:
                os.close(src)
            os.replace(partial, parts[-1], src_dir_fd=folder.fd, dst_dir_fd=folder.fd)
    return os.path.join(os.path.realpath(root), *parts)


def _make_cwd(spec: dict[str, Any]) -> None:
    """The output's folder, where the notebook runs: made below the user's root without
    following a link where the spec says the root."""
    root, rel = spec.get("output_root") or "", spec.get("output_rel") or ""
    if root and rel:
        parts = parts_of(rel)
        if len(parts) > 1:
            Folder.under(root, "/".join(parts[:-1]), create=True).close()
    elif spec.get("cwd"):
        os.makedirs(spec["cwd"], exist_ok=True)


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
        _make_cwd(spec)
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
        if TERMINATED["flag"] and not watchdog.message:
            # asked to stop (cancel, preemption or the runtime limit), not a crash
            print("--- stopped on request (SIGTERM): the kernel was shut down; the output "
                  "notebook keeps the cells run so far ---", flush=True)
        else:
            print(f"--- {error.get('summary')} ---", flush=True)
    stack.close()
    watchdog.stop()
    out = spec.get("output_path")
    copied = None
    if out and local_out.exists():
        try:
            copied = deliver(local_out, spec)
        except OverLimit as exc:
            print(f"--- {exc} ---", flush=True)
            error = {"summary": str(exc), "ename": "OutputTooLarge", "evalue": str(exc)}
            code = 1
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
