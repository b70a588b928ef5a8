"""Running Slurm's commands and reading job and node state with them, for the Slurm
backend: the commands' environment and timeout, ``squeue --json`` / ``sinfo --json`` where
the installed Slurm answers them (:mod:`.slurm_json`), else ``scontrol show job/node -o``
text (:mod:`.slurm_state`), each answer reused for a while.

:class:`SlurmCommands` is held by :class:`~.slurm.SlurmBackend` (``backend.commands``): it
is handed the backend's settings (command paths, ``state_format``, timeouts) when it is built
and owns the answers it reuses.
"""

from __future__ import annotations

import logging
import os
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any

from .slurm_args import SlurmNodeInfo
from .slurm_json import (
    JsonSupport,
    SlurmJsonError,
    SlurmJsonUnavailable,
    parse_sinfo_json,
    parse_squeue_json,
)
from .slurm_state import SlurmJob, parse_scontrol_job, parse_scontrol_nodes


class SlurmCommandError(RuntimeError):
    """A Slurm command failed; the message carries its stderr."""


class SlurmCommands:
    """Slurm's commands and the state they read, each answer reused for a while."""

    def __init__(
        self,
        *,
        squeue: str,
        scontrol: str,
        sinfo: str,
        state_format: str,
        slurm_conf: str,
        min_poll_interval_s: float,
        node_cache_s: float,
        command_timeout_s: float,
        run_as: Callable[[], str],
        log: logging.Logger | logging.LoggerAdapter[Any],
    ) -> None:
        self.squeue = squeue
        self.scontrol = scontrol
        self.sinfo = sinfo
        self.state_format = state_format
        self.slurm_conf = slurm_conf
        self.min_poll_interval_s = min_poll_interval_s
        self.node_cache_s = node_cache_s
        self.command_timeout_s = command_timeout_s
        self.run_as = run_as  # how jobs run now: "hub" or "user" (the backend's, read live)
        self.log = log
        self._jobs: dict[str, tuple[float, SlurmJob | None]] = {}
        self._nodes: tuple[float, dict[str, SlurmNodeInfo]] | None = None
        self._queue: tuple[float, list[tuple[SlurmJob, str]]] | None = None  # squeue --json
        self._json = JsonSupport(state_format)
        self._lock = threading.Lock()

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {
            k: os.environ[k]
            for k in ("PATH", "LANG", "LC_ALL", "TZ", "SLURM_CONF")
            if k in os.environ
        }
        env.setdefault("PATH", "/usr/bin:/bin:/usr/sbin:/sbin")
        if extra:
            env.update(extra)
        if self.slurm_conf:
            env["SLURM_CONF"] = self.slurm_conf
        elif "SLURM_CONF" in os.environ:
            env["SLURM_CONF"] = os.environ["SLURM_CONF"]
        return env

    def run(
        self, argv: list[str], *, env: dict[str, str] | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        try:
            done = subprocess.run(
                argv,
                env=env or self.env(),
                capture_output=True,
                text=True,
                timeout=self.command_timeout_s,
                stdin=subprocess.DEVNULL,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SlurmCommandError(f"{argv[0]}: {exc}") from exc
        if check and done.returncode != 0:
            err = (done.stderr or done.stdout).strip().splitlines()
            raise SlurmCommandError(
                f"{os.path.basename(argv[0])}: {err[-1] if err else f'exit code {done.returncode}'}"
            )
        return done

    # -- reading state: --json where Slurm answers it, else text ----------------------------

    @property
    def state_reader(self) -> str:
        """``json`` or ``text``: how state is read now (``auto`` before the first read)."""
        return self._json.reader

    def _read_json(self, argv: list[str], parse: Callable[[str], Any]) -> Any | None:
        """``parse`` of what ``argv`` (a ``--json`` command) prints; None: read the text."""
        if not self._json.wanted():
            return None
        done = self.run(argv, check=False)
        first = self._json.answers is None
        try:
            parsed = self._json.take(done.returncode, done.stdout, done.stderr, parse)
        except SlurmJsonUnavailable as exc:
            if self.state_format == "json":
                raise SlurmCommandError(f"state_format is 'json', but: {exc}") from exc
            self.log.warning(
                "this Slurm answers no --json (%s): reading scontrol's text "
                "instead (values with spaces are cut)",
                exc,
            )
            return None
        except SlurmJsonError as exc:
            raise SlurmCommandError(f"{os.path.basename(argv[0])}: {exc}") from exc
        if first:
            self.log.info("reading Slurm job and node state with --json")
        return parsed

    def _squeue_json(self, *, fresh: bool = False) -> list[tuple[SlurmJob, str]] | None:
        """Every job slurmctld knows, with its user (``squeue --json``, one answer reused
        for ``min_poll_interval_s``); None: read the text instead."""
        now = time.monotonic()
        with self._lock:
            queue = self._queue
        if queue is not None and not fresh and now - queue[0] < self.min_poll_interval_s:
            return queue[1]
        jobs = self._read_json([self.squeue, "--json", "--states=all"], parse_squeue_json)
        if jobs is not None:
            with self._lock:
                self._queue = (now, jobs)
        return jobs

    def show_job(self, slurm_id: str, *, fresh: bool = False) -> SlurmJob | None:
        now = time.monotonic()
        with self._lock:
            cached = self._jobs.get(slurm_id)
        if cached is not None and not fresh and now - cached[0] < self.min_poll_interval_s:
            return cached[1]
        queue = self._squeue_json(fresh=fresh)
        if queue is not None:
            found = [job for job, _ in queue if job.job_id == slurm_id]
            with self._lock:
                self._jobs[slurm_id] = (now, found[0] if found else None)
            return found[0] if found else None
        return self._show_job_text(slurm_id, now)

    def _show_job_text(self, slurm_id: str, now: float) -> SlurmJob | None:
        done = self.run([self.scontrol, "show", "job", "-o", slurm_id], check=False)
        job = None
        if done.returncode == 0:
            for line in done.stdout.splitlines():
                parsed = parse_scontrol_job(line)
                if parsed is not None and parsed.job_id == slurm_id:
                    job = parsed
        elif "Invalid job id" not in done.stderr:
            raise SlurmCommandError(f"scontrol: {done.stderr.strip()}")
        with self._lock:
            self._jobs[slurm_id] = (now, job)
        return job

    def by_name(self, name: str, user: str = "") -> str | None:
        """The id of the newest Slurm job named ``name`` that slurmctld still knows (of
        ``user`` where jobs run as the user: anyone may name a Slurm job so)."""
        queue = self._squeue_json(fresh=True)
        if queue is not None:
            mine = self.run_as() != "user" or not user
            named = [
                int(job.job_id)
                for job, owner in queue
                if job.name == name and (mine or owner == user)
            ]
            return str(max(named)) if named else None
        argv = [self.squeue, "-h", "--states=all", f"--name={name}", "-o", "%i"]
        if self.run_as() == "user" and user:
            argv.append(f"--user={user}")
        done = self.run(argv, check=False)
        ids = [w for w in done.stdout.split() if w.isdigit()]
        return max(ids, key=int) if ids else None

    def nodes(self) -> dict[str, SlurmNodeInfo]:
        """The cluster's nodes (cached for ``node_cache_s``)."""
        now = time.monotonic()
        if self._nodes is not None and now - self._nodes[0] < self.node_cache_s:
            return self._nodes[1]
        out = self._read_json([self.sinfo, "--json"], parse_sinfo_json)
        if out is None:
            out = parse_scontrol_nodes(self.run([self.scontrol, "show", "node", "-o"]).stdout)
        self._nodes = (now, out)
        return out

    def forget_nodes(self) -> None:
        """Read the nodes afresh next time."""
        self._nodes = None

    def forget_job(self, sid: str) -> None:
        """Read Slurm's job ``sid`` afresh next time."""
        with self._lock:
            self._jobs.pop(sid, None)
            self._queue = None

    def forget_jobs(self) -> None:
        """Read every job afresh next time."""
        with self._lock:
            self._queue = None
            self._jobs.clear()
