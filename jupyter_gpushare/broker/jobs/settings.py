"""What an admin configures about batch jobs (``c.JobManager.*``): places, bounds, limits."""

from __future__ import annotations

import os

from traitlets import Bool, CaselessStrEnum, Dict, Float, Integer, Type, Unicode, default
from traitlets.config import LoggingConfigurable

from ...backends.base import JobBackend
from ...backends.local import LocalBackend
from ...core.jobs import JobLimits


class JobSettings(LoggingConfigurable):
    """The configurable part of :class:`~.runner.JobManager`."""

    backend_class = Type(
        LocalBackend,
        klass=JobBackend,
        config=True,
        help="Where admitted jobs run: the class of the batch backend (a JobBackend), e.g. "
        "'jupyter_gpushare.backends.slurm.SlurmBackend'. The default runs them as processes "
        "on the broker's machine.",
    )
    jobs_dir = Unicode(
        config=True,
        help="Where the local backend keeps each job's snapshot, log and checkpoint folder "
        "(default: gpushare-jobs in the broker's working directory, next to its database).",
    )
    user_root_template = Unicode(
        "~{username}",
        config=True,
        help="The user's files, where executed notebooks are delivered: '~{username}' is the "
        "user's home directory; e.g. '/tmp/{username}' for SimpleLocalProcessSpawner. Output "
        "paths are relative to it and may not leave it.",
    )
    run_as = CaselessStrEnum(
        ["hub", "user"],
        default_value="hub",
        config=True,
        help="Run jobs as the hub's own user ('hub', as SimpleLocalProcessSpawner runs "
        "servers) or as the job's system user ('user': the broker runs as root, as with "
        "LocalProcessSpawner).",
    )
    enabled = Bool(True, config=True, help="Accept batch jobs at all.")
    mps = CaselessStrEnum(
        ["auto", "on", "off"],
        default_value="auto",
        config=True,
        help="Hard memory and thread limits through MPS for jobs, as for local servers: "
        "'auto' when an MPS control daemon's pipe exists in mps_pipe_directory.",
    )
    mps_pipe_directory = Unicode(
        "", config=True, help="CUDA_MPS_PIPE_DIRECTORY of the MPS daemon (default /tmp/nvidia-mps)."
    )
    extra_env = Dict(
        config=True,
        help="Variables added to every job's environment (before the grant's own), e.g. "
        "GPUSHARE_SIMULATED_JOB_MEMORY_MIB to exercise the limit watchdog in a demo.",
    )
    poll_interval_s = Float(0.25, config=True, help="Seconds between passes of the job loop.")
    cancel_grace_s = Float(
        10.0, config=True, help="Seconds between SIGTERM and SIGKILL when a job is cancelled."
    )
    max_attempts = Integer(
        20, config=True, help="Most attempts of one job (each preemption starts a new one)."
    )
    max_queued_per_user = Integer(
        50, config=True, help="Most unfinished (queued or running) jobs one user may have."
    )
    max_notebook_bytes = Integer(
        5 * 1024 * 1024, config=True, help="Largest notebook snapshot accepted (bytes)."
    )
    max_parameters_bytes = Integer(
        16 * 1024, config=True, help="Largest parameters object accepted (bytes of JSON)."
    )
    default_max_runtime_s = Integer(
        4 * 3600,
        config=True,
        help="Runtime limit of a job that asks for none (capped by its profile's max_lifetime).",
    )
    max_runtime_s = Integer(
        7 * 24 * 3600, config=True, help="Longest runtime any job may ask for (seconds)."
    )
    max_jobs_kept_per_user = Integer(
        500,
        config=True,
        help="Finished jobs kept per user; older ones (rows, history and files) are deleted "
        "when a job ends and by the retention pass (every retention_interval_s).",
    )
    log_retention_days = Float(
        30.0,
        config=True,
        help="Days the log, snapshot and checkpoints of a finished job are kept (0: forever).",
    )
    job_retention_days = Float(
        90.0,
        config=True,
        help="Days a finished job (succeeded, failed, cancelled, lost) is kept at all: older "
        "ones lose their row, history and folder in the retention pass (0: forever). Queued "
        "and running jobs are never removed.",
    )
    retention_interval_s = Float(
        600.0,
        config=True,
        help="Seconds between retention passes (log_retention_days, job_retention_days, "
        "max_jobs_kept_per_user), run by the job loop.",
    )
    max_log_bytes = Integer(
        64 * 1024 * 1024,
        config=True,
        help="Largest log of one job (bytes, all attempts): a job whose log grows past it is "
        "stopped and fails with that reason; its log is cut to this size (0: no bound).",
    )
    max_output_bytes = Integer(
        256 * 1024 * 1024,
        config=True,
        help="Largest executed notebook of one job (bytes): a job whose notebook grows past "
        "it is stopped and fails with that reason, and the notebook is not copied into the "
        "user's files (0: no bound).",
    )
    max_log_read_bytes = Integer(
        256 * 1024, config=True, help="Most log bytes one log request returns."
    )

    @default("jobs_dir")
    def _jobs_dir(self) -> str:
        db_url = str(getattr(self.parent, "db_url", "") or "")
        if db_url.startswith("sqlite:///") and db_url != "sqlite:///:memory:":
            return os.path.join(os.path.dirname(os.path.abspath(db_url[10:])), "gpushare-jobs")
        return os.path.abspath("gpushare-jobs")

    @property
    def limits(self) -> JobLimits:
        return JobLimits(
            max_notebook_bytes=self.max_notebook_bytes,
            max_parameters_bytes=self.max_parameters_bytes,
            max_queued_per_user=self.max_queued_per_user,
            default_max_runtime_s=self.default_max_runtime_s,
            max_runtime_s=self.max_runtime_s,
        )
