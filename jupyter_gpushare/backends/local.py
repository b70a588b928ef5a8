"""The local backend (the embedded default): jobs as processes on the broker's machine.

Each attempt runs ``python -m jupyter_gpushare.backends.papermill_run DIR`` in its own
session and process group (``start_new_session``), so

* it outlives the user's server and a ``kill -9`` of the broker or the hub (nothing the
  hub kills is its parent group);
* preemption and cancel reach every child: the group gets the signal, and the runner
  forwards it to its descendants (the kernel runs in a session of its own), and
  :meth:`LocalBackend.kill` kills every descendant it finds as well.

It runs as the job's system user where ``run_as`` is ``"user"`` (the broker runs as
root, as with JupyterHub's ``LocalProcessSpawner``), else as the broker's own user
(the demo and tests, as with ``SimpleLocalProcessSpawner``).

Layout under ``jobs_dir``::

    <job id>/log.txt            every attempt's output, appended
    <job id>/checkpoint/        $GPUSHARE_CHECKPOINT_DIR, kept across attempts
    <job id>/attempt-<n>/       spec.json, input.ipynb, launched, pid, output.ipynb, status.json

``launched`` is written before the process starts and ``pid`` (pid and process start
time, so a reused pid is not mistaken for the job) right after: after a restart a run is
found again by its pid file, or by its command line where the broker died in between.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from .base import Capabilities, JobBackend, RunHandle, RunSpec, RunStatus
from .jobfolder import JobFolder

RUNNER = "jupyter_gpushare.backends.papermill_run"


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def _with_cell_ids(nb: dict[str, Any]) -> dict[str, Any]:
    """nbformat 4.5 wants an id on every cell; older snapshots get one."""
    cells = []
    for i, cell in enumerate(nb.get("cells") or []):
        cells.append(cell if cell.get("id") else dict(cell, id=f"cell-{i}"))
    return dict(nb, cells=cells, nbformat_minor=max(5, int(nb.get("nbformat_minor") or 0)))


class LocalBackend(JobFolder, JobBackend):
    """Jobs as local processes (see the module docstring)."""

    name = "local"

    def __init__(
        self, jobs_dir: str, *, run_as: str = "hub", python: str = sys.executable,
        mps: bool = False,
    ) -> None:
        self.jobs_dir = Path(jobs_dir)
        self.jobs_dir.mkdir(parents=True, exist_ok=True)
        self.run_as = run_as
        self.python = python
        self.mps = mps
        self._procs: dict[tuple[str, int], subprocess.Popen[bytes]] = {}
        self.on_exit: Callable[[], None] | None = None  # called (from a thread) when a run ends

    @classmethod
    def create(cls, settings: Any) -> LocalBackend:
        return cls(settings.jobs_dir, run_as=settings.run_as)

    def capabilities(self) -> Capabilities:
        return Capabilities(
            name=self.name,
            enforces=(
                "CUDA_VISIBLE_DEVICES (granted GPU UUIDs)",
                "framework memory caps (PyTorch, JAX, TensorFlow)",
                *(("MPS memory and thread limits",) if self.mps else ()),
                "GPUSHARE_* grant variables",
                "maximum runtime",
            ),
            memory_isolation="hard (MPS)" if self.mps else "framework caps",
            runs_as_user=self.run_as == "user",
            survives_broker_restart=True,
            notes="one machine; each job in its own process group",
        )

    # -- running ----------------------------------------------------------------------------

    def _account(self, user: str) -> pwd.struct_passwd | None:
        if self.run_as != "user":
            return None
        return pwd.getpwnam(user)  # KeyError: no such system user

    def submit(self, spec: RunSpec) -> RunHandle:
        adir = self.attempt_dir(spec.job_id, spec.attempt)
        handle = RunHandle(self.name, spec.job_id, spec.attempt, {"dir": str(adir)})
        if (adir / "launched").exists():
            return self._with_pid(handle)  # never a second run of the same attempt
        account = self._account(spec.user)
        jdir = self.job_dir(spec.job_id)
        ckpt = Path(self.checkpoint_dir(spec.job_id))
        adir.mkdir(parents=True, exist_ok=True)
        ckpt.mkdir(parents=True, exist_ok=True)
        (adir / "input.ipynb").write_text(json.dumps(_with_cell_ids(spec.notebook)))
        _write_json(
            adir / "spec.json",
            {
                "job_id": spec.job_id,
                "attempt": spec.attempt,
                "parameters": spec.parameters,
                "output_path": spec.output_path,
                "cwd": spec.cwd,
                "kernel_name": spec.kernel_name,
                "name": spec.name or os.path.basename(spec.output_path) or spec.job_id,
            },
        )
        env = dict(spec.env)
        env.update(
            GPUSHARE_JOB_ID=spec.job_id,
            GPUSHARE_JOB_ATTEMPT=str(spec.attempt),
            GPUSHARE_CHECKPOINT_DIR=str(ckpt),
            PYTHONUNBUFFERED="1",
        )
        env.setdefault("PATH", os.environ.get("PATH", "/usr/bin:/bin"))
        kwargs: dict[str, Any] = {}
        if account is not None:
            for path in (jdir, adir, ckpt):
                os.chown(path, account.pw_uid, account.pw_gid)
            kwargs.update(user=account.pw_uid, group=account.pw_gid, extra_groups=[])
            env.update(HOME=account.pw_dir, USER=account.pw_name, LOGNAME=account.pw_name)
        cwd = spec.cwd if spec.cwd and os.path.isdir(spec.cwd) else str(adir)
        (adir / "launched").write_text("1")
        log = open(jdir / "log.txt", "ab")  # noqa: SIM115 - handed to the child
        try:
            proc = subprocess.Popen(
                [self.python, "-m", RUNNER, str(adir)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=cwd,
                start_new_session=True,
                **kwargs,
            )
        finally:
            log.close()
        self._procs[(spec.job_id, spec.attempt)] = proc
        threading.Thread(target=self._wait, args=(proc,), daemon=True).start()
        created = psutil.Process(proc.pid).create_time()
        _write_json(adir / "pid", {"pid": proc.pid, "create_time": created})
        return RunHandle(
            self.name, spec.job_id, spec.attempt,
            {"dir": str(adir), "pid": proc.pid, "create_time": created},
        )

    def _wait(self, proc: subprocess.Popen[bytes]) -> None:
        proc.wait()
        if self.on_exit is not None:
            with contextlib.suppress(Exception):
                self.on_exit()

    def _with_pid(self, handle: RunHandle) -> RunHandle:
        adir = Path(handle.ref.get("dir") or self.attempt_dir(handle.job_id, handle.attempt))
        ref = dict(handle.ref, dir=str(adir))
        try:
            ref.update(json.loads((adir / "pid").read_text()))
        except (OSError, ValueError):
            proc = self._find_by_cmdline(adir)
            if proc is not None:
                ref.update(pid=proc.pid, create_time=proc.create_time())
        return RunHandle(handle.backend, handle.job_id, handle.attempt, ref)

    @staticmethod
    def _find_by_cmdline(adir: Path) -> psutil.Process | None:
        """The runner of ``adir`` where the broker died before writing its pid file."""
        for proc in psutil.process_iter(["cmdline"]):
            cmd = proc.info.get("cmdline") or []
            if RUNNER in cmd and str(adir) in cmd:
                return proc
        return None

    def _process(self, handle: RunHandle) -> psutil.Process | None:
        ref = handle.ref if "pid" in handle.ref else self._with_pid(handle).ref
        pid = ref.get("pid")
        if not pid:
            return None
        try:
            proc = psutil.Process(int(pid))
            if abs(proc.create_time() - float(ref.get("create_time", 0))) > 1.0:
                return None  # the pid was reused by another process
            if proc.status() == psutil.STATUS_ZOMBIE:
                self._reap(handle)
                return None
            return proc
        except psutil.Error:
            return None

    def _reap(self, handle: RunHandle) -> int | None:
        proc = self._procs.get((handle.job_id, handle.attempt))
        if proc is None:
            return None
        code = proc.poll()
        if code is not None:
            self._procs.pop((handle.job_id, handle.attempt), None)
        return code

    def poll(self, handle: RunHandle) -> RunStatus:
        adir = Path(handle.ref.get("dir") or self.attempt_dir(handle.job_id, handle.attempt))
        if not (adir / "launched").exists():
            return RunStatus(alive=False, started=False)
        code = self._reap(handle)
        status_file = adir / "status.json"
        proc = self._process(handle) if code is None else None
        if status_file.exists():
            if proc is not None and proc.is_running():
                return RunStatus(alive=True)  # writing its last words: wait for the exit
            try:
                data = json.loads(status_file.read_text())
            except ValueError:
                data = {}
            return RunStatus(
                alive=False,
                finished=True,
                exit_code=int(data.get("exit_code", 1)),
                error=data.get("error"),
                output_path=data.get("output_path"),
                started_at=data.get("started_at"),
                ended_at=data.get("ended_at"),
                terminated=bool(data.get("terminated")),
            )
        if proc is not None:
            return RunStatus(alive=True)
        return RunStatus(alive=False, exit_code=code)

    def _targets(self, handle: RunHandle) -> list[psutil.Process]:
        proc = self._process(handle)
        if proc is None:
            return []
        try:
            return [proc, *proc.children(recursive=True)]
        except psutil.Error:
            return [proc]

    def _send(self, handle: RunHandle, sig: int) -> None:
        targets = self._targets(handle)
        if not targets:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(targets[0].pid, sig)  # the runner leads its own group
        for proc in targets:
            with contextlib.suppress(psutil.Error):
                proc.send_signal(sig)
                if sig == signal.SIGKILL:
                    with contextlib.suppress(ProcessLookupError, PermissionError, OSError):
                        os.killpg(os.getpgid(proc.pid), sig)  # the kernel's own group

    def signal(self, handle: RunHandle) -> None:
        """SIGTERM to the runner's process group; the runner passes it on to its
        descendants in other sessions (the kernel), so each gets it exactly once."""
        proc = self._process(handle)
        if proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGTERM)

    def kill(self, handle: RunHandle) -> None:
        self._send(handle, signal.SIGKILL)
        self._reap(handle)

    # -- results ----------------------------------------------------------------------------

    def close(self) -> None:
        self._procs.clear()  # the runs go on; a restarted broker finds them by pid
