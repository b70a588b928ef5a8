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
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from traitlets import Bool, Enum, Float, Integer, List, Unicode

from ..userfiles import Folder, UnsafeFile
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
    scancel_argv,
    scancel_signal_argv,
)
from .slurm_json import (
    JsonSupport,
    SlurmJsonError,
    SlurmJsonUnavailable,
    parse_sinfo_json,
    parse_squeue_json,
)
from .slurm_state import (
    SlurmJob,
    node_in_service,
    parse_scontrol_job,
    parse_scontrol_nodes,
    status_from,
    stuck_on,
)

DROPPED_ENV = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
               "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "CUDA_MPS_PIPE_DIRECTORY")
"""Grant variables Slurm sets itself on the node (from the GRES), or that name a local MPS."""

STATUS_MAX_BYTES = 4 << 20
"""The most of a runner's ``status.json`` the broker reads (a larger one is refused)."""
ID_MAX_BYTES = 64


def _attempt_name(attempt: int) -> str:
    return f"attempt-{int(attempt)}"


def _hand_over(fd: int, owner: tuple[int, int] | None) -> None:
    """``fchown`` an opened file or folder to ``owner`` when it is not theirs yet."""
    if owner is None:
        return
    st = os.fstat(fd)
    if (st.st_uid, st.st_gid) != owner:
        os.fchown(fd, *owner)


def prepare_log(jdir: Folder, owner: tuple[int, int] | None) -> None:
    """Make the job's log (never through a link) and hand it to the job's user: Slurm
    opens ``--output`` as the user, who cannot create a file in the root-owned job folder."""
    fd = jdir.open(LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        _hand_over(fd, owner)
    finally:
        os.close(fd)


def write_file(folder: Folder, name: str, data: bytes, mode: int = 0o644) -> None:
    """Write ``name`` whole in ``folder`` (never through a link) with ``mode`` whatever the
    umask (the job's user must read its snapshot, spec and batch script)."""
    folder.write_atomic(name, data, mode=mode)
    fd = folder.open(name)
    try:
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def read_status(folder: Folder) -> dict[str, Any] | None:
    """The runner's ``status.json`` in the attempt folder (None while it runs), read
    without following a link and at most :data:`STATUS_MAX_BYTES`; unreadable or not a
    JSON object reads as ``{}`` (the attempt failed); a link raises :class:`UnsafeFile`."""
    if not folder.exists("status.json"):
        return None
    try:
        data = json.loads(folder.read("status.json", STATUS_MAX_BYTES))
    except UnsafeFile:
        raise
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}



class SlurmCommandError(RuntimeError):
    """A Slurm command failed; the message carries its stderr."""


class SlurmBackend(JobFolder, ConfigurableJobBackend):
    """Jobs as Slurm batch jobs on the node the broker placed them on (module docstring)."""

    name = "slurm"

    jobs_dir = Unicode(
        "", config=True,
        help="Folder on a filesystem shared by the broker and every Slurm node, for each "
        "job's snapshot, log, checkpoints and result (default: c.JobManager.jobs_dir).",
    )
    partition = Unicode(
        "", config=True,
        help="Slurm partition for jobs (default: the policy's slurm.partition, else the "
        "cluster's default partition).",
    )
    shards_per_gpu = Integer(
        0, config=True,
        help="GRES shards per GPU for fractions (shard:K, K = fraction x this); 0: the "
        "policy's slurm.shards_per_gpu.",
    )
    sbatch = Unicode("sbatch", config=True, help="Path of sbatch.")
    squeue = Unicode("squeue", config=True, help="Path of squeue.")
    scontrol = Unicode("scontrol", config=True, help="Path of scontrol.")
    sinfo = Unicode("sinfo", config=True, help="Path of sinfo.")
    state_format = Enum(
        ["auto", "json", "text"], "auto", config=True,
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
        "", config=True,
        help="SLURM_CONF for the Slurm commands (default: the broker's own SLURM_CONF, else "
        "Slurm's built-in path).",
    )
    extra_sbatch_args = List(
        Unicode(), config=True,
        help="Further sbatch arguments for every job, e.g. ['--exclusive'] or "
        "['--constraint=h100'] (put before the script).",
    )
    python = Unicode(
        sys.executable, config=True,
        help="Python on the nodes that has jupyter-gpushare and papermill installed (runs "
        "the job's runner); default: the broker's own interpreter.",
    )
    partition_per_pool = Bool(
        False, config=True,
        help="Without a partition (this setting's or the policy's slurm.partition), submit "
        "to the partition named after the grant's pool, as jupyter-gpushare export slurm "
        "writes them (one per pool). Off: Slurm's default partition.",
    )
    pass_account = Bool(
        False, config=True,
        help="Pass the team's account as --account: the team's own account with a site "
        "partition, else the team's account in the pool ('<team>_<pool>'), as the export "
        "names them and SlurmGPUShareSpawner charges servers. Slurm with accounting "
        "(slurmdbd) refuses an account it does not know: turn this on once the accounts "
        "exist (jupyter-gpushare export slurm writes them).",
    )
    pass_qos = Bool(
        False, config=True,
        help="Pass the priority class as --qos (needs the QOS in Slurm's accounting, as "
        "jupyter-gpushare export slurm writes them).",
    )
    pass_cpu_memory = Bool(
        True, config=True,
        help="Pass the grant's CPU cores and memory as --cpus-per-task and --mem.",
    )
    min_poll_interval_s = Float(
        1.0, config=True,
        help="Shortest time between two reads of a job's state (squeue --json, or 'scontrol "
        "show job' for text; the broker's job loop polls more often; answers are reused in "
        "between).",
    )
    node_cache_s = Float(
        30.0, config=True,
        help="How long the node list (for refusing impossible requests) is reused.",
    )
    node_return_interval_s = Float(  # type: ignore[assignment]
        30.0, config=True,
        help="How often the broker asks Slurm whether a node it drained after NODE_FAIL is "
        "back in service (IDLE, MIXED or ALLOCATED, not DOWN, DRAIN or NOT_RESPONDING); it "
        "resumes such a node then. A node an admin drained is never resumed.",
    )
    command_timeout_s = Float(30.0, config=True, help="Timeout of one Slurm command (seconds).")

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        settings = self.parent
        if not self.jobs_dir:
            self.jobs_dir = str(getattr(settings, "jobs_dir", "") or os.path.abspath(
                "gpushare-jobs"))
        Path(self.jobs_dir).mkdir(parents=True, exist_ok=True)
        self.run_as = str(getattr(settings, "run_as", "hub") or "hub")
        broker = getattr(settings, "broker", None)
        self.policy_getter: Callable[[], Any] | None = (
            (lambda: broker.policy) if broker is not None else None)
        self._jobs: dict[str, tuple[float, SlurmJob | None]] = {}
        self._nodes: tuple[float, dict[str, SlurmNodeInfo]] | None = None
        self._queue: tuple[float, list[tuple[SlurmJob, str]]] | None = None  # squeue --json
        self._json = JsonSupport(str(self.state_format))
        self._lock = threading.Lock()

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
            partition=self._partition(), partition_per_pool=self.partition_per_pool,
            pass_account=self.pass_account,
            pass_qos=self.pass_qos, pass_cpu_memory=self.pass_cpu_memory,
            extra_args=tuple(self.extra_sbatch_args),
        )

    # -- commands ---------------------------------------------------------------------------

    def _env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {k: os.environ[k] for k in ("PATH", "LANG", "LC_ALL", "TZ", "SLURM_CONF")
               if k in os.environ}
        env.setdefault("PATH", "/usr/bin:/bin:/usr/sbin:/sbin")
        if extra:
            env.update(extra)
        if self.slurm_conf:
            env["SLURM_CONF"] = self.slurm_conf
        elif "SLURM_CONF" in os.environ:
            env["SLURM_CONF"] = os.environ["SLURM_CONF"]
        return env

    def _cmd(self, argv: list[str], *, env: dict[str, str] | None = None, check: bool = True
             ) -> subprocess.CompletedProcess[str]:
        try:
            done = subprocess.run(argv, env=env or self._env(), capture_output=True, text=True,
                                  timeout=self.command_timeout_s, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SlurmCommandError(f"{argv[0]}: {exc}") from exc
        if check and done.returncode != 0:
            err = (done.stderr or done.stdout).strip().splitlines()
            raise SlurmCommandError(f"{os.path.basename(argv[0])}: "
                                    f"{err[-1] if err else f'exit code {done.returncode}'}")
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
        done = self._cmd(argv, check=False)
        first = self._json.answers is None
        try:
            parsed = self._json.take(done.returncode, done.stdout, done.stderr, parse)
        except SlurmJsonUnavailable as exc:
            if self.state_format == "json":
                raise SlurmCommandError(f"state_format is 'json', but: {exc}") from exc
            self.log.warning("this Slurm answers no --json (%s): reading scontrol's text "
                             "instead (values with spaces are cut)", exc)
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

    def _show_job(self, slurm_id: str, *, fresh: bool = False) -> SlurmJob | None:
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
        done = self._cmd([self.scontrol, "show", "job", "-o", slurm_id], check=False)
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

    def _by_name(self, name: str, user: str = "") -> str | None:
        """The id of the newest Slurm job named ``name`` that slurmctld still knows (of
        ``user`` where jobs run as the user: anyone may name a Slurm job so)."""
        queue = self._squeue_json(fresh=True)
        if queue is not None:
            mine = self.run_as != "user" or not user
            named = [int(job.job_id) for job, owner in queue
                     if job.name == name and (mine or owner == user)]
            return str(max(named)) if named else None
        argv = [self.squeue, "-h", "--states=all", f"--name={name}", "-o", "%i"]
        if self.run_as == "user" and user:
            argv.append(f"--user={user}")
        done = self._cmd(argv, check=False)
        ids = [w for w in done.stdout.split() if w.isdigit()]
        return max(ids, key=int) if ids else None

    def nodes(self) -> dict[str, SlurmNodeInfo]:
        """The cluster's nodes (cached for ``node_cache_s``)."""
        now = time.monotonic()
        if self._nodes is not None and now - self._nodes[0] < self.node_cache_s:
            return self._nodes[1]
        out = self._read_json([self.sinfo, "--json"], parse_sinfo_json)
        if out is None:
            out = parse_scontrol_nodes(self._cmd([self.scontrol, "show", "node", "-o"]).stdout)
        self._nodes = (now, out)
        return out

    # -- refusing and submitting ------------------------------------------------------------

    def refusal(self, spec: RunSpec) -> str | None:
        """Why Slurm could never run ``spec`` (checked before anything is submitted)."""
        gres = gres_for(spec.grant, self._shards_per_gpu())
        node = str(spec.grant.get("node") or "")
        try:
            nodes = self.nodes()
            if node and node not in nodes:
                self._nodes = None
                nodes = self.nodes()  # a node added since the last look
        except SlurmCommandError as exc:
            self.log.warning("cannot list Slurm nodes (%s): submitting without the check", exc)
            return None
        return refusal(gres, node, nodes, self._partition())

    def _find(self, job_id: str, attempt: int, user: str = "") -> str | None:
        """The Slurm id of an attempt (None: never submitted, or its folder is unsafe)."""
        try:
            folder = self.job_folder(job_id, _attempt_name(attempt))
        except OSError:
            return None
        with folder:
            return self._find_in(folder, job_id, attempt, user)

    def _find_in(self, folder: Folder, job_id: str, attempt: int, user: str = ""
                 ) -> str | None:
        """The Slurm id in the attempt folder's ``slurm_id`` (the user's folder: used only
        when Slurm names that job as this attempt), else found by name in ``squeue``."""
        name = job_name(job_id, attempt)
        with contextlib.suppress(OSError, ValueError):
            text = folder.read("slurm_id", ID_MAX_BYTES).decode().strip()
            if text.isdigit() and self._is_named(text, name):
                return text
        if not folder.exists("launched"):
            return None
        found = self._by_name(name, user)
        if found:  # the broker died between sbatch and writing slurm_id
            with contextlib.suppress(OSError):
                folder.write_atomic("slurm_id", found.encode())
        return found

    def _is_named(self, slurm_id: str, name: str) -> bool:
        """Whether Slurm's job ``slurm_id`` is ``name`` (one slurmctld forgot is taken:
        nothing can be signalled through it)."""
        try:
            job = self._show_job(slurm_id)
        except SlurmCommandError as exc:
            self.log.warning("cannot check slurm_id %s (%s): found by name instead", slurm_id,
                             exc)
            return False
        if job is None or job.name == name:
            return True
        self.log.warning("slurm_id %s is Slurm's job %r, not %r: ignored", slurm_id,
                         job.name, name)
        return False

    def _handle(self, spec: RunSpec, adir: Path, slurm_id: str | None) -> RunHandle:
        ref: dict[str, Any] = {"dir": str(adir), "name": job_name(spec.job_id, spec.attempt),
                               "user": spec.user}
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
            attempt = stack.enter_context(jdir.child(
                _attempt_name(spec.attempt), create=True, mode=0o755, owner=owner))
            existing = self._find_in(attempt, spec.job_id, spec.attempt, spec.user)
            if existing or attempt.exists("launched"):
                return self._handle(spec, adir, existing)  # never a second run of one attempt
            jdir.child("checkpoint", create=True, mode=0o700, owner=owner).close()
            prepare_log(jdir, owner)
            write_file(attempt, "input.ipynb",
                       json.dumps(_with_cell_ids(spec.notebook)).encode())
            write_file(attempt, "spec.json", json.dumps(_runner_spec(spec)).encode())
            write_file(attempt, "job.sh",
                       batch_script(self.python, RUNNER, str(adir)).encode(), 0o755)
            argv, env = self._sbatch(spec, account)
            attempt.write_atomic("launched", b"1")
            try:
                done = self._cmd(argv, env=self._env(env))
                slurm_id = parse_parsable(done.stdout)
            except (SlurmCommandError, ValueError):
                attempt.unlink("launched")  # nothing runs: it may be tried again
                raise
            attempt.write_atomic("slurm_id", slurm_id.encode())
        self.log.info("job %s attempt %s is Slurm job %s: %s", spec.job_id, spec.attempt,
                      slurm_id, " ".join(argv[1:-1]))
        return self._handle(spec, adir, slurm_id)

    def _sbatch(self, spec: RunSpec, account: pwd.struct_passwd | None
                ) -> tuple[list[str], dict[str, str]]:
        """The ``sbatch`` command line (as the user through ``runuser`` where the job runs
        as the user) and its environment."""
        adir = self.attempt_dir(spec.job_id, spec.attempt)
        req = build_request(job_name(spec.job_id, spec.attempt), str(adir / "job.sh"),
                            str(self.job_dir(spec.job_id) / LOG), str(adir), spec.grant,
                            spec.max_runtime_s, self._shards_per_gpu())
        argv = sbatch_argv(req, self.options(), self.sbatch)
        env = {k: v for k, v in spec.env.items() if k not in DROPPED_ENV}
        env.update(GPUSHARE_JOB_ID=spec.job_id, GPUSHARE_JOB_ATTEMPT=str(spec.attempt),
                   GPUSHARE_CHECKPOINT_DIR=self.checkpoint_dir(spec.job_id),
                   PYTHONUNBUFFERED="1")
        if account is not None:
            env.update(HOME=account.pw_dir, USER=account.pw_name, LOGNAME=account.pw_name)
            argv = ["runuser", "-u", account.pw_name, "--", *argv]
        return argv, env

    # -- watching ---------------------------------------------------------------------------

    def _slurm_id(self, handle: RunHandle) -> str | None:
        sid = handle.ref.get("slurm_job_id")
        if sid:
            return str(sid)
        return self._find(handle.job_id, handle.attempt, str(handle.ref.get("user") or ""))

    def slurm_job(self, handle: RunHandle, *, fresh: bool = False) -> SlurmJob | None:
        """Slurm's view of the run (None: not submitted, or slurmctld forgot it)."""
        sid = self._slurm_id(handle)
        return self._show_job(sid, fresh=fresh) if sid else None

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
            if job is not None and not job.alive and result is None:
                _, result = self._read_attempt(handle)  # written just as the job ended
        except UnsafeFile as exc:  # the job swapped its attempt folder or status file
            job = self.slurm_job(handle)
            if job is not None and job.alive:
                return RunStatus(alive=True)
            return RunStatus(alive=False, finished=True, exit_code=1, error={
                "summary": f"the attempt's files were tampered with: {exc}"})
        if job is not None and job.queued and job.reason.startswith("ReqNodeNotAvail"):
            lost = self._pending_on_dead_node(handle, job)
            if lost is not None:
                return lost
        return status_from(job, result, launched)

    def nodes_in_service(self, nodes: Sequence[str]) -> set[str]:
        """Of ``nodes`` (drained by the broker after ``NODE_FAIL``), those Slurm has back:
        ``IDLE``/``MIXED``/``ALLOCATED`` without ``DOWN``/``DRAIN``/``NOT_RESPONDING``
        (a fresh ``scontrol show node``)."""
        self._nodes = None
        try:
            known = self.nodes()
        except SlurmCommandError as exc:
            self.log.warning("cannot list Slurm nodes (%s): drained nodes stay drained", exc)
            return set()
        return {n for n in nodes if n in known and node_in_service(known[n].state)}

    def _pending_on_dead_node(self, handle: RunHandle, job: SlurmJob) -> RunStatus | None:
        """A job still pending on the node the broker chose, which Slurm has down or
        drained: cancel it in Slurm and end the attempt as lost with its node, so the
        broker releases the grant (and places a new attempt elsewhere)."""
        self._nodes = None  # a fresh look at the nodes: this is rare
        try:
            states = {n: i.state for n, i in self.nodes().items()}
        except SlurmCommandError:
            return None
        node = stuck_on(job, states)
        if node is None:
            return None
        self.kill(handle)
        summary = (f"Slurm job {job.job_id} could not start: its node {node} is "
                   f"{states[node]} (reason: {job.reason})")
        return RunStatus(alive=False, finished=False, node_failed=node, error={
            "summary": summary, "slurm_state": job.state, "slurm_reason": job.reason,
            "slurm_job_id": job.job_id})

    def _forget_cached(self, sid: str) -> None:
        with self._lock:
            self._jobs.pop(sid, None)
            self._queue = None

    def signal(self, handle: RunHandle) -> None:
        sid = self._slurm_id(handle)
        if sid:
            self._cmd(scancel_signal_argv(sid, self.scancel), check=False)
            self._forget_cached(sid)

    def kill(self, handle: RunHandle) -> None:
        sid = self._slurm_id(handle)
        if sid:
            for argv in scancel_argv(sid, self.scancel):
                self._cmd(argv, check=False)
            self._forget_cached(sid)

    # -- results: log, output and clean-up come from JobFolder ------------------------------

    def close(self) -> None:
        with self._lock:
            self._queue = None
            self._jobs.clear()  # the Slurm jobs go on; a restarted broker finds them
