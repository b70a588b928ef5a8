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

    <job id>/                   the broker's (mode 0711): the job cannot swap what is in it
    <job id>/log.txt            every attempt's output, appended (opened by the broker)
    <job id>/checkpoint/        $GPUSHARE_CHECKPOINT_DIR, kept across attempts (the user's)
    <job id>/attempt-<n>/       spec.json, input.ipynb, launched, pid, output.ipynb, status.json
                                (the folder is the user's: the runner writes its results)

Every file and folder there is made, written, read and handed over through
:mod:`~jupyter_gpushare.userfiles` (``openat`` with ``O_NOFOLLOW`` at each use, ``fchown`` on
the folder it made), so a link the job planted is refused, never followed as root. The pid
file is the job's to write, so a pid is only signalled when its command line is this
attempt's runner. As the user, the runner starts in ``/`` and goes to its folder itself.

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
import stat
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from ..userfiles import Folder, UnsafeFile
from .base import Capabilities, JobBackend, RunHandle, RunSpec, RunStatus
from .jobfolder import LOG, JobFolder

RUNNER = "jupyter_gpushare.backends.papermill_run"


def _write_json(path: Path, data: dict[str, Any]) -> None:
    """Write ``path`` whole (a temporary file, then renamed; no link followed at the end)."""
    with Folder.root(str(path.parent)) as folder:
        folder.write_atomic(path.name, json.dumps(data).encode())


def _keep_broker_owned(folder: Folder) -> None:
    """The job folder is the broker's, mode 0711 (a folder an older version handed to the
    job's user is taken back: the user must not be able to swap what is in it)."""
    st = os.fstat(folder.fd)
    if st.st_uid != os.geteuid() or st.st_gid != os.getegid():
        os.fchown(folder.fd, os.geteuid(), os.getegid())
    if stat.S_IMODE(st.st_mode) != 0o711:
        os.fchmod(folder.fd, 0o711)


def _with_cell_ids(nb: dict[str, Any]) -> dict[str, Any]:
    """nbformat 4.5 wants an id on every cell; older snapshots get one."""
    cells = []
    for i, cell in enumerate(nb.get("cells") or []):
        cells.append(cell if cell.get("id") else dict(cell, id=f"cell-{i}"))
    return dict(nb, cells=cells, nbformat_minor=max(5, int(nb.get("nbformat_minor") or 0)))


def _runner_spec(spec: RunSpec) -> dict[str, Any]:
    """``spec.json``: what the runner needs of the spec (the output's place as the user's
    root and a path inside it, so the runner walks down to it without following links)."""
    root = spec.output_root
    rel = os.path.relpath(spec.output_path, root) if root and spec.output_path else ""
    return {
        "job_id": spec.job_id,
        "attempt": spec.attempt,
        "parameters": spec.parameters,
        "output_path": spec.output_path,
        "output_root": root if rel else "",
        "output_rel": rel,  # one that leaves the root is refused by the runner, not followed
        "max_output_bytes": spec.max_output_bytes,
        "cwd": spec.cwd,
        "kernel_name": spec.kernel_name,
        "name": spec.name or os.path.basename(spec.output_path) or spec.job_id,
    }


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
        account = self._account(spec.user)
        owner = (account.pw_uid, account.pw_gid) if account is not None else None
        # the job folder stays the broker's (the user cannot swap its log or folders); the
        # attempt and checkpoint folders are the job's, reached without a link, made here
        with contextlib.ExitStack() as stack:
            top = stack.enter_context(Folder.root(str(self.jobs_dir)))
            jdir = stack.enter_context(top.child(spec.job_id, create=True, mode=0o711))
            _keep_broker_owned(jdir)
            attempt = stack.enter_context(jdir.child(
                f"attempt-{int(spec.attempt)}", create=True, mode=0o755, owner=owner))
            if attempt.exists("launched"):
                return self._with_pid(handle)  # never a second run of the same attempt
            jdir.child("checkpoint", create=True, mode=0o700, owner=owner).close()
            attempt.write_atomic(
                "input.ipynb", json.dumps(_with_cell_ids(spec.notebook)).encode())
            attempt.write_atomic("spec.json", json.dumps(_runner_spec(spec)).encode())
            attempt.write_atomic("launched", b"1")
            log = jdir.open(LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                proc = self._popen(spec, adir, log, account)
            finally:
                os.close(log)
            self._procs[(spec.job_id, spec.attempt)] = proc
            threading.Thread(target=self._wait, args=(proc,), daemon=True).start()
            created = psutil.Process(proc.pid).create_time()
            attempt.write_atomic(
                "pid", json.dumps({"pid": proc.pid, "create_time": created}).encode())
        return RunHandle(
            self.name, spec.job_id, spec.attempt,
            {"dir": str(adir), "pid": proc.pid, "create_time": created},
        )

    def _popen(
        self, spec: RunSpec, adir: Path, log: int, account: pwd.struct_passwd | None,
    ) -> subprocess.Popen[bytes]:
        env = dict(spec.env)
        env.update(
            GPUSHARE_JOB_ID=spec.job_id,
            GPUSHARE_JOB_ATTEMPT=str(spec.attempt),
            GPUSHARE_CHECKPOINT_DIR=self.checkpoint_dir(spec.job_id),
            PYTHONUNBUFFERED="1",
        )
        env.setdefault("PATH", os.environ.get("PATH", "/usr/bin:/bin"))
        kwargs: dict[str, Any] = {}
        if account is not None:
            kwargs.update(user=account.pw_uid, group=account.pw_gid, extra_groups=[])
            env.update(HOME=account.pw_dir, USER=account.pw_name, LOGNAME=account.pw_name)
            # the runner, as the user, goes to its folder itself: a folder given here would
            # be entered by root before it becomes the user (through any link on the way)
            cwd = "/"
        else:
            cwd = spec.cwd if spec.cwd and os.path.isdir(spec.cwd) else str(adir)
        return subprocess.Popen(
            [self.python, "-m", RUNNER, str(adir)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=cwd,
            start_new_session=True,
            **kwargs,
        )

    def _wait(self, proc: subprocess.Popen[bytes]) -> None:
        proc.wait()
        if self.on_exit is not None:
            with contextlib.suppress(Exception):
                self.on_exit()

    def _attempt_folder(self, handle: RunHandle) -> Folder:
        return self.job_folder(handle.job_id, f"attempt-{int(handle.attempt)}")

    def _with_pid(self, handle: RunHandle) -> RunHandle:
        adir = self.attempt_dir(handle.job_id, handle.attempt)
        ref = dict(handle.ref, dir=str(adir))
        try:
            with self._attempt_folder(handle) as folder:
                found = json.loads(folder.read("pid", 4096))
            ref.update(pid=int(found["pid"]), create_time=float(found["create_time"]))
        except (OSError, ValueError, KeyError, TypeError):
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
            adir = str(self.attempt_dir(handle.job_id, handle.attempt))
            cmd = proc.cmdline()
            if RUNNER not in cmd or adir not in cmd:
                return None  # not this attempt's runner (the pid file is in the job's folder)
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
        try:
            with self._attempt_folder(handle) as folder:
                launched = folder.exists("launched")
                result = self._status_file(folder) if launched else None
        except UnsafeFile as exc:  # the job swapped its attempt folder or status file
            if self._process(handle) is not None:
                return RunStatus(alive=True)
            return RunStatus(alive=False, finished=True, exit_code=1,
                             error={"summary": f"the attempt's files were tampered with: {exc}"})
        except FileNotFoundError:
            launched, result = False, None
        if not launched:
            return RunStatus(alive=False, started=False)
        code = self._reap(handle)
        proc = self._process(handle) if code is None else None
        if result is not None:
            if proc is not None and proc.is_running():
                return RunStatus(alive=True)  # writing its last words: wait for the exit
            return RunStatus(
                alive=False,
                finished=True,
                exit_code=int(result.get("exit_code", 1)),
                error=result.get("error"),
                output_path=result.get("output_path"),
                started_at=result.get("started_at"),
                ended_at=result.get("ended_at"),
                terminated=bool(result.get("terminated")),
            )
        if proc is not None:
            return RunStatus(alive=True)
        return RunStatus(alive=False, exit_code=code)

    @staticmethod
    def _status_file(folder: Folder) -> dict[str, Any] | None:
        """The runner's ``status.json`` (None while it runs); unreadable reads as {}."""
        if not folder.exists("status.json"):
            return None
        try:
            data = json.loads(folder.read("status.json", 4 << 20))
        except UnsafeFile:
            raise
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

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
