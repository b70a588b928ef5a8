"""Finding a submitted attempt's Slurm job again and watching it, for the Slurm backend: its
Slurm id (the handle's, the attempt folder's ``slurm_id`` when Slurm names that job so, else
found by name), its status from Slurm and the runner, a job pending on a dead node, nodes
back in service, and ``scancel`` to signal or kill it.

:class:`SlurmWatch` is held by :class:`~.slurm.SlurmBackend` (``backend.watch``); it is
handed the backend's Slurm commands, the way to open a job's folder and ``scancel``'s path.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import Any

from ..userfiles import Folder, UnsafeFile
from .base import RunHandle, RunStatus
from .slurm_args import job_name, scancel_argv, scancel_signal_argv
from .slurm_commands import SlurmCommandError, SlurmCommands
from .slurm_files import ID_MAX_BYTES, _attempt_name, read_status
from .slurm_state import SlurmJob, node_in_service, status_from, stuck_on


class SlurmWatch:
    """An attempt's Slurm job found, watched, signalled and killed."""

    def __init__(
        self,
        commands: SlurmCommands,
        job_folder: Callable[..., Folder],
        scancel: str,
        log: logging.Logger | logging.LoggerAdapter[Any],
    ) -> None:
        self.commands = commands
        self.job_folder = job_folder  # (job id, *names in it) -> the folder, opened safely
        self.scancel = scancel
        self.log = log

    # -- finding ----------------------------------------------------------------------------

    def _find(self, job_id: str, attempt: int, user: str = "") -> str | None:
        """The Slurm id of an attempt (None: never submitted, or its folder is unsafe)."""
        try:
            folder = self.job_folder(job_id, _attempt_name(attempt))
        except OSError:
            return None
        with folder:
            return self.find_in(folder, job_id, attempt, user)

    def find_in(self, folder: Folder, job_id: str, attempt: int, user: str = "") -> str | None:
        """The Slurm id in the attempt folder's ``slurm_id`` (the user's folder: used only
        when Slurm names that job as this attempt), else found by name in ``squeue``."""
        name = job_name(job_id, attempt)
        with contextlib.suppress(OSError, ValueError):
            text = folder.read("slurm_id", ID_MAX_BYTES).decode().strip()
            if text.isdigit() and self._is_named(text, name):
                return text
        if not folder.exists("launched"):
            return None
        found = self.commands.by_name(name, user)
        if found:  # the broker died between sbatch and writing slurm_id
            with contextlib.suppress(OSError):
                folder.write_atomic("slurm_id", found.encode())
        return found

    def _is_named(self, slurm_id: str, name: str) -> bool:
        """Whether Slurm's job ``slurm_id`` is ``name`` (one slurmctld forgot is taken:
        nothing can be signalled through it)."""
        try:
            job = self.commands.show_job(slurm_id)
        except SlurmCommandError as exc:
            self.log.warning("cannot check slurm_id %s (%s): found by name instead", slurm_id, exc)
            return False
        if job is None or job.name == name:
            return True
        self.log.warning("slurm_id %s is Slurm's job %r, not %r: ignored", slurm_id, job.name, name)
        return False

    # -- watching ---------------------------------------------------------------------------

    def _slurm_id(self, handle: RunHandle) -> str | None:
        sid = handle.ref.get("slurm_job_id")
        if sid:
            return str(sid)
        return self._find(handle.job_id, handle.attempt, str(handle.ref.get("user") or ""))

    def slurm_job(self, handle: RunHandle, *, fresh: bool = False) -> SlurmJob | None:
        """Slurm's view of the run (None: not submitted, or slurmctld forgot it).

        A job of another name under the run's Slurm id is not the run: a slurmctld killed
        before it saved its state gives the ids it had handed out again after its restart
        (seen in the soak: two attempts told "Slurm job 103"), so the run is gone."""
        sid = self._slurm_id(handle)
        job = self.commands.show_job(sid, fresh=fresh) if sid else None
        expected = job_name(handle.job_id, handle.attempt)
        if job is not None and job.name and job.name != expected:
            self.log.warning(
                "Slurm job %s is %r now, not %r: slurmctld forgot the run (it restarted "
                "without its state) and gave the id again", sid, job.name, expected,
            )
            return None
        return job

    def _read_attempt(self, handle: RunHandle) -> tuple[bool, dict[str, Any] | None]:
        """(launched, the runner's status.json) of the attempt, read through userfiles."""
        try:
            with self.job_folder(handle.job_id, _attempt_name(handle.attempt)) as folder:
                launched = folder.exists("launched")
                return launched, read_status(folder) if launched else None
        except FileNotFoundError:
            return False, None

    def poll(self, handle: RunHandle) -> RunStatus:
        try:
            launched, result = self._read_attempt(handle)
            job = self.slurm_job(handle) if launched else None
            if job is None and launched and result is None:
                # not in a listing that may be older than the job itself (taken before its
                # sbatch): ask slurmctld again before calling it gone
                job = self.slurm_job(handle, fresh=True)
            if job is None and launched and result is None or (
                job is not None and not job.alive and result is None
            ):
                _, result = self._read_attempt(handle)  # written just as the job ended
        except UnsafeFile as exc:  # the job swapped its attempt folder or status file
            job = self.slurm_job(handle)
            if job is not None and job.alive:
                return RunStatus(alive=True)
            return RunStatus(
                alive=False,
                finished=True,
                exit_code=1,
                error={"summary": f"the attempt's files were tampered with: {exc}"},
            )
        if job is not None and job.queued and job.reason.startswith("ReqNodeNotAvail"):
            lost = self._pending_on_dead_node(handle, job)
            if lost is not None:
                return lost
        return status_from(job, result, launched)

    def nodes_in_service(self, nodes: Sequence[str]) -> set[str]:
        """Of ``nodes`` (drained by the broker after ``NODE_FAIL``), those Slurm has back:
        ``IDLE``/``MIXED``/``ALLOCATED`` without ``DOWN``/``DRAIN``/``NOT_RESPONDING``
        (a fresh ``scontrol show node``)."""
        self.commands.forget_nodes()
        try:
            known = self.commands.nodes()
        except SlurmCommandError as exc:
            self.log.warning("cannot list Slurm nodes (%s): drained nodes stay drained", exc)
            return set()
        return {n for n in nodes if n in known and node_in_service(known[n].state)}

    def _pending_on_dead_node(self, handle: RunHandle, job: SlurmJob) -> RunStatus | None:
        """A job still pending on the node the broker chose, which Slurm has down or
        drained: cancel it in Slurm and end the attempt as lost with its node, so the
        broker releases the grant (and places a new attempt elsewhere)."""
        self.commands.forget_nodes()  # a fresh look at the nodes: this is rare
        try:
            states = {n: i.state for n, i in self.commands.nodes().items()}
        except SlurmCommandError:
            return None
        node = stuck_on(job, states)
        if node is None:
            return None
        self.kill(handle)
        summary = (
            f"Slurm job {job.job_id} could not start: its node {node} is "
            f"{states[node]} (reason: {job.reason})"
        )
        return RunStatus(
            alive=False,
            finished=False,
            node_failed=node,
            error={
                "summary": summary,
                "slurm_state": job.state,
                "slurm_reason": job.reason,
                "slurm_job_id": job.job_id,
            },
        )

    def signal(self, handle: RunHandle) -> None:
        sid = self._slurm_id(handle)
        if sid:
            self.commands.run(scancel_signal_argv(sid, self.scancel), check=False)
            self.commands.forget_job(sid)

    def kill(self, handle: RunHandle) -> None:
        sid = self._slurm_id(handle)
        if sid:
            for argv in scancel_argv(sid, self.scancel):
                self.commands.run(argv, check=False)
            self.commands.forget_job(sid)
