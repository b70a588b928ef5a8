"""The Slurm batch backend: each attempt of a job is one ``sbatch`` job.

The broker admits and places the job (team quotas, priorities, the node and GPUs); this
backend asks Slurm to run that attempt exactly there, with the grant's GRES
(:mod:`.slurm_args` builds the command line), and reads back what Slurm and the runner say
(:mod:`.slurm_state`). The batch script runs the same runner as the local backend
(``python -m jupyter_gpushare.backends.papermill_run DIR``) with the same layout under
``jobs_dir``, which must be a filesystem the broker and every node share::

    <job id>/                   the broker's (mode 0711): the job cannot swap what is in it
    <job id>/log.txt            every attempt's output (sbatch --output, appended); made
                                by the broker, handed to the user (Slurm opens it as the user)
    <job id>/checkpoint/        $GPUSHARE_CHECKPOINT_DIR, kept across attempts (the user's)
    <job id>/attempt-<n>/       spec.json, input.ipynb, job.sh, launched, slurm_id,
                                output.ipynb, status.json (the folder is the user's)

**Whose folders** (``run_as = "user"``: the broker runs as root and ``sbatch`` runs as the
user through ``runuser``; ``slurmstepd`` opens ``--output`` and enters ``--chdir`` *as the
user*, by path, on the node). The job folder stays root's (0711): the user can traverse it
but never add, remove or swap a name in it, so no link can appear at ``log.txt``,
``checkpoint`` or ``attempt-<n>`` (one left by an older version, which handed the whole job
folder to the user, is refused at the next use). Only what the job must write is the
user's: ``checkpoint/`` and its attempt folder (made by the broker, handed over with
``fchown`` on their own descriptors) and the log *file* (made by the broker, never through a
link, and handed over the same way, since Slurm appends to it as the user and the user could
not create it in a root folder). The user owns the log's bytes, not its name: a user who
hard-links it elsewhere only makes the broker refuse to serve it (``has other hard links``).

Every mkdir, write, chown and read the broker does there, at every submit (a requeue
included) and poll, goes through :mod:`~jupyter_gpushare.userfiles` (``openat`` with
``O_NOFOLLOW`` from the jobs folder down, ``fchown`` on the opened descriptor): a link
found fails the attempt with :class:`~jupyter_gpushare.userfiles.UnsafeFile`, whose message
names the path (the broker's job loop fails the job with it: ``could not start: refused:
.../attempt-2 is a symbolic link ...``), before anything is created, written or handed
over through it. ``status.json`` and ``slurm_id`` are read the same way with a size bound,
and a Slurm id read from the user's attempt folder is only used (to ``scancel``) when
Slurm names that job ``gpushare-<job>-a<n>`` (found by name, only the user's own jobs count:
anyone may name a Slurm job so). ``spec.json`` carries ``output_root`` (the
user's root) and ``output_rel``, so the runner delivers the executed notebook by walking
down from the user's root without following a link, as on the local backend.

* **submit** is idempotent per job and attempt: the Slurm job is looked up (``slurm_id``,
  else by its name ``gpushare-<job>-a<n>`` in ``squeue``) before anything is submitted, and
  an attempt marked ``launched`` is never submitted again;
* **refusal**: a request Slurm could never run (a node it does not know, more GPUs than the
  node has, more shards than one GPU has) is refused before ``sbatch`` with the reason;
* **poll**: Slurm's view of the job plus the runner's ``status.json``. Job and node state
  are read with ``squeue --json`` and ``sinfo --json`` (:mod:`.slurm_json`) where the
  installed Slurm answers them (found out at the first read, then kept); a Slurm without
  ``--json`` is read from ``scontrol show job -o`` / ``show node -o`` text
  (``state_format``);
* **signal**: ``scancel --signal=TERM --full`` (the runner passes it to the kernel);
  **kill**: SIGKILL to every step, then ``scancel``;
* Slurm's requeue is off (``--no-requeue``): a node failure ends the attempt
  (``NODE_FAIL``, with Slurm's reason), the broker releases the grant and decides; each
  new attempt is a new Slurm job.

Every Slurm command runs in the broker's worker thread (the broker calls backends off its
event loop), with a timeout.

This module holds the backend's settings, the refusal and the submit; next to it are the
attempt folder's files (:mod:`.slurm_files`), and the parts the backend holds: running
Slurm's commands and reading state with them (:mod:`.slurm_commands`, ``backend.commands``),
and finding, watching and stopping a submitted attempt's Slurm job (:mod:`.slurm_watch`,
``backend.watch``).
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from traitlets import Bool, Enum, Float, Integer, List, Unicode, observe

from ..userfiles import Folder
from .base import Capabilities, ConfigurableJobBackend, RunHandle, RunSpec, RunStatus
from .jobfolder import LOG, JobFolder
from .local import RUNNER, _keep_broker_owned, _runner_spec, _with_cell_ids
from .slurm_args import (
    SbatchOptions,
    SlurmNodeInfo,
    batch_script,
    build_request,
    gres_for,
    job_name,
    parse_parsable,
    refusal,
    sbatch_argv,
)
from .slurm_commands import SlurmCommandError, SlurmCommands
from .slurm_files import (
    ID_MAX_BYTES,
    STATUS_MAX_BYTES,
    _attempt_name,
    prepare_log,
    read_status,
    write_file,
)
from .slurm_state import SlurmJob
from .slurm_watch import SlurmWatch

__all__ = [
    "DROPPED_ENV",
    "ID_MAX_BYTES",
    "STATUS_MAX_BYTES",
    "SlurmBackend",
    "SlurmCommandError",
    "prepare_log",
    "read_status",
    "write_file",
]

DROPPED_ENV = (
    "CUDA_VISIBLE_DEVICES",
    "NVIDIA_VISIBLE_DEVICES",
    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
    "CUDA_MPS_PIPE_DIRECTORY",
)
"""Grant variables Slurm sets itself on the node (from the GRES), or that name a local MPS."""


class SlurmBackend(JobFolder, ConfigurableJobBackend):
    """Jobs as Slurm batch jobs on the node the broker placed them on (module docstring)."""

    name = "slurm"

    jobs_dir = Unicode(
        "",
        config=True,
        help="Folder on a filesystem shared by the broker and every Slurm node, for each "
        "job's snapshot, log, checkpoints and result (default: c.JobManager.jobs_dir).",
    )
    partition = Unicode(
        "",
        config=True,
        help="Slurm partition for jobs (default: the policy's slurm.partition, else the "
        "cluster's default partition).",
    )
    shards_per_gpu = Integer(
        0,
        config=True,
        help="GRES shards per GPU for fractions (shard:K, K = fraction x this); 0: the "
        "policy's slurm.shards_per_gpu.",
    )
    sbatch = Unicode("sbatch", config=True, help="Path of sbatch.")
    squeue = Unicode("squeue", config=True, help="Path of squeue.")
    scontrol = Unicode("scontrol", config=True, help="Path of scontrol.")
    sinfo = Unicode("sinfo", config=True, help="Path of sinfo.")
    state_format = Enum(
        ["auto", "json", "text"],
        "auto",
        config=True,
        help="How job and node state is read: 'json' (squeue --json, sinfo --json: every "
        "value whole, Slurm 21.08 and later), 'text' (scontrol show job/node -o: values with "
        "spaces are cut), or 'auto': JSON unless the installed Slurm does not answer --json "
        "(found out at the first read, then kept). Slurm 22.05's squeue --json ignores "
        "filters and returns every job slurmctld knows (about 3 KB and 0.7 ms a job); one "
        "answer serves every job polled within min_poll_interval_s. On a cluster with tens "
        "of thousands of jobs, 'text' (one job per call) costs less.",
    )
    scancel = Unicode("scancel", config=True, help="Path of scancel.")
    slurm_conf = Unicode(
        "",
        config=True,
        help="SLURM_CONF for the Slurm commands (default: the broker's own SLURM_CONF, else "
        "Slurm's built-in path).",
    )
    extra_sbatch_args = List(
        Unicode(),
        config=True,
        help="Further sbatch arguments for every job, e.g. ['--exclusive'] or "
        "['--constraint=h100'] (put before the script).",
    )
    python = Unicode(
        sys.executable,
        config=True,
        help="Python on the nodes that has jupyter-gpushare and papermill installed (runs "
        "the job's runner); default: the broker's own interpreter.",
    )
    partition_per_pool = Bool(
        False,
        config=True,
        help="Without a partition (this setting's or the policy's slurm.partition), submit "
        "to the partition named after the grant's pool, as jupyter-gpushare export slurm "
        "writes them (one per pool). Off: Slurm's default partition.",
    )
    pass_account = Bool(
        False,
        config=True,
        help="Pass the team's account as --account: the team's own account with a site "
        "partition, else the team's account in the pool ('<team>_<pool>'), as the export "
        "names them and SlurmGPUShareSpawner charges servers. Slurm with accounting "
        "(slurmdbd) refuses an account it does not know: turn this on once the accounts "
        "exist (jupyter-gpushare export slurm writes them).",
    )
    pass_qos = Bool(
        False,
        config=True,
        help="Pass the priority class as --qos (needs the QOS in Slurm's accounting, as "
        "jupyter-gpushare export slurm writes them).",
    )
    pass_cpu_memory = Bool(
        True,
        config=True,
        help="Pass the grant's CPU cores and memory as --cpus-per-task and --mem.",
    )
    min_poll_interval_s = Float(
        1.0,
        config=True,
        help="Shortest time between two reads of a job's state (squeue --json, or 'scontrol "
        "show job' for text; the broker's job loop polls more often; answers are reused in "
        "between).",
    )
    node_cache_s = Float(
        30.0,
        config=True,
        help="How long the node list (for refusing impossible requests) is reused.",
    )
    node_return_interval_s = Float(  # type: ignore[assignment]
        30.0,
        config=True,
        help="How often the broker asks Slurm whether a node it drained after NODE_FAIL is "
        "back in service (IDLE, MIXED or ALLOCATED, not DOWN, DRAIN or NOT_RESPONDING); it "
        "resumes such a node then. A node an admin drained is never resumed.",
    )
    command_timeout_s = Float(30.0, config=True, help="Timeout of one Slurm command (seconds).")

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        settings = self.parent
        if not self.jobs_dir:
            self.jobs_dir = str(
                getattr(settings, "jobs_dir", "") or os.path.abspath("gpushare-jobs")
            )
        Path(self.jobs_dir).mkdir(parents=True, exist_ok=True)
        self.run_as = str(getattr(settings, "run_as", "hub") or "hub")
        broker = getattr(settings, "broker", None)
        self.policy_getter: Callable[[], Any] | None = (
            (lambda: broker.policy) if broker is not None else None
        )
        self.commands = SlurmCommands(
            squeue=self.squeue,
            scontrol=self.scontrol,
            sinfo=self.sinfo,
            state_format=str(self.state_format),
            slurm_conf=self.slurm_conf,
            min_poll_interval_s=self.min_poll_interval_s,
            node_cache_s=self.node_cache_s,
            command_timeout_s=self.command_timeout_s,
            run_as=lambda: self.run_as,
            log=self.log,
        )
        self.watch = SlurmWatch(self.commands, self.job_folder, self.scancel, self.log)

    @observe(
        "squeue",
        "scontrol",
        "sinfo",
        "state_format",
        "slurm_conf",
        "min_poll_interval_s",
        "node_cache_s",
        "command_timeout_s",
        "scancel",
    )
    def _hand_setting_to_parts(self, change: Any) -> None:
        """A setting changed once the parts were built: the parts that hold it get it."""
        for part in (getattr(self, "commands", None), getattr(self, "watch", None)):
            if part is not None and hasattr(part, change["name"]):
                setattr(part, change["name"], change["new"])

    def capabilities(self) -> Capabilities:
        return Capabilities(
            name=self.name,
            enforces=(
                "node placement (--nodelist: the broker's node)",
                "whole GPUs as GRES gpu:N (Slurm sets CUDA_VISIBLE_DEVICES to the job's GPUs)",
                "fractions as GRES shard:K (a count of a GPU's shards; Slurm sets "
                "CUDA_VISIBLE_DEVICES and SLURM_SHARDS_ON_NODE)",
                "framework memory caps (PyTorch, JAX, TensorFlow)",
                "time limit (--time) with SIGTERM the grace period before it (--signal)",
                *(("account = team (--account)",) if self.pass_account else ()),
                *(("QOS = priority class (--qos)",) if self.pass_qos else ()),
            ),
            memory_isolation="framework caps (shards isolate neither memory nor compute)",
            runs_as_user=self.run_as == "user",
            survives_broker_restart=True,
            own_process_group=True,
            notes="device files are fenced only where Slurm's cgroup plugin constrains them "
            "(ConstrainDevices=yes in cgroup.conf); without it a job sees the GPUs Slurm gave "
            "it in CUDA_VISIBLE_DEVICES but could open the others",
        )

    # -- reading and watching: the parts' ------------------------------------------------

    @property
    def state_reader(self) -> str:
        """``json`` or ``text``: how state is read now (``auto`` before the first read)."""
        return self.commands.state_reader

    def nodes(self) -> dict[str, SlurmNodeInfo]:
        """The cluster's nodes (cached for ``node_cache_s``)."""
        return self.commands.nodes()

    def slurm_job(self, handle: RunHandle, *, fresh: bool = False) -> SlurmJob | None:
        """Slurm's view of the run (None: not submitted, or slurmctld forgot it)."""
        return self.watch.slurm_job(handle, fresh=fresh)

    def poll(self, handle: RunHandle) -> RunStatus:
        return self.watch.poll(handle)

    def signal(self, handle: RunHandle) -> None:
        self.watch.signal(handle)

    def kill(self, handle: RunHandle) -> None:
        self.watch.kill(handle)

    def nodes_in_service(self, nodes: Sequence[str]) -> set[str]:
        """Of ``nodes`` (drained by the broker after ``NODE_FAIL``), those Slurm has back."""
        return self.watch.nodes_in_service(nodes)

    # -- settings from the policy -----------------------------------------------------------

    def _policy_slurm(self) -> Any:
        policy = self.policy_getter() if self.policy_getter is not None else None
        return getattr(policy, "slurm", None)

    def _shards_per_gpu(self) -> int:
        if self.shards_per_gpu > 0:
            return int(self.shards_per_gpu)
        return int(getattr(self._policy_slurm(), "shards_per_gpu", 8) or 8)

    def _partition(self) -> str | None:
        return self.partition or getattr(self._policy_slurm(), "partition", None) or None

    def options(self) -> SbatchOptions:
        return SbatchOptions(
            partition=self._partition(),
            partition_per_pool=self.partition_per_pool,
            pass_account=self.pass_account,
            pass_qos=self.pass_qos,
            pass_cpu_memory=self.pass_cpu_memory,
            extra_args=tuple(self.extra_sbatch_args),
        )

    # -- refusing and submitting ------------------------------------------------------------

    def refusal(self, spec: RunSpec) -> str | None:
        """Why Slurm could never run ``spec`` (checked before anything is submitted)."""
        gres = gres_for(spec.grant, self._shards_per_gpu())
        node = str(spec.grant.get("node") or "")
        try:
            nodes = self.nodes()
            if node and node not in nodes:
                self.commands.forget_nodes()
                nodes = self.nodes()  # a node added since the last look
        except SlurmCommandError as exc:
            self.log.warning("cannot list Slurm nodes (%s): submitting without the check", exc)
            return None
        return refusal(gres, node, nodes, self._partition())

    def _handle(self, spec: RunSpec, adir: Path, slurm_id: str | None) -> RunHandle:
        ref: dict[str, Any] = {
            "dir": str(adir),
            "name": job_name(spec.job_id, spec.attempt),
            "user": spec.user,
        }
        if slurm_id:
            ref["slurm_job_id"] = slurm_id
        return RunHandle(self.name, spec.job_id, spec.attempt, ref)

    def _account(self, user: str) -> pwd.struct_passwd | None:
        return pwd.getpwnam(user) if self.run_as == "user" else None

    def submit(self, spec: RunSpec) -> RunHandle:
        """Prepare the attempt's folders and files (see the module docstring: through
        :mod:`~jupyter_gpushare.userfiles`, a link anywhere raises :class:`UnsafeFile` before
        anything is made or handed over through it), then ``sbatch`` it."""
        adir = self.attempt_dir(spec.job_id, spec.attempt)
        account = self._account(spec.user)
        owner = (account.pw_uid, account.pw_gid) if account is not None else None
        with contextlib.ExitStack() as stack:
            top = stack.enter_context(Folder.root(str(self.jobs_dir)))
            jdir = stack.enter_context(top.child(spec.job_id, create=True, mode=0o711))
            _keep_broker_owned(jdir)
            attempt = stack.enter_context(
                jdir.child(_attempt_name(spec.attempt), create=True, mode=0o755, owner=owner)
            )
            existing = self.watch.find_in(attempt, spec.job_id, spec.attempt, spec.user)
            if existing or attempt.exists("launched"):
                return self._handle(spec, adir, existing)  # never a second run of one attempt
            jdir.child("checkpoint", create=True, mode=0o700, owner=owner).close()
            prepare_log(jdir, owner)
            write_file(attempt, "input.ipynb", json.dumps(_with_cell_ids(spec.notebook)).encode())
            write_file(attempt, "spec.json", json.dumps(_runner_spec(spec)).encode())
            write_file(
                attempt, "job.sh", batch_script(self.python, RUNNER, str(adir)).encode(), 0o755
            )
            argv, env = self._sbatch(spec, account)
            attempt.write_atomic("launched", b"1")
            try:
                done = self.commands.run(argv, env=self.commands.env(env))
                slurm_id = parse_parsable(done.stdout)
            except (SlurmCommandError, ValueError):
                attempt.unlink("launched")  # nothing runs: it may be tried again
                raise
            attempt.write_atomic("slurm_id", slurm_id.encode())
        self.log.info(
            "job %s attempt %s is Slurm job %s: %s",
            spec.job_id,
            spec.attempt,
            slurm_id,
            " ".join(argv[1:-1]),
        )
        return self._handle(spec, adir, slurm_id)

    def _sbatch(
        self, spec: RunSpec, account: pwd.struct_passwd | None
    ) -> tuple[list[str], dict[str, str]]:
        """The ``sbatch`` command line (as the user through ``runuser`` where the job runs
        as the user) and its environment."""
        adir = self.attempt_dir(spec.job_id, spec.attempt)
        req = build_request(
            job_name(spec.job_id, spec.attempt),
            str(adir / "job.sh"),
            str(self.job_dir(spec.job_id) / LOG),
            str(adir),
            spec.grant,
            spec.max_runtime_s,
            self._shards_per_gpu(),
        )
        argv = sbatch_argv(req, self.options(), self.sbatch)
        env = {k: v for k, v in spec.env.items() if k not in DROPPED_ENV}
        env.update(
            GPUSHARE_JOB_ID=spec.job_id,
            GPUSHARE_JOB_ATTEMPT=str(spec.attempt),
            GPUSHARE_CHECKPOINT_DIR=self.checkpoint_dir(spec.job_id),
            PYTHONUNBUFFERED="1",
        )
        if account is not None:
            env.update(HOME=account.pw_dir, USER=account.pw_name, LOGNAME=account.pw_name)
            argv = ["runuser", "-u", account.pw_name, "--", *argv]
        return argv, env

    # -- results: log, output and clean-up come from JobFolder ------------------------------

    def close(self) -> None:
        self.commands.forget_jobs()  # the Slurm jobs go on; a restarted broker finds them
