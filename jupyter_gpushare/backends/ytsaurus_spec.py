"""The YTsaurus vanilla operation for one attempt of a job (pure: no client, no I/O).

One attempt is one vanilla operation with one task of one job (``job_count: 1``):

* ``gpu_limit`` is the grant's number of whole GPUs; YTsaurus allocates GPUs as integers
  only, so a fractional grant cannot be expressed there and :func:`refusal` says so;
* ``cpu_limit`` / ``memory_limit`` come from the grant (the profile's CPU and RAM), or the
  backend's defaults;
* ``pool`` is the team's YTsaurus pool (a mapping, default the team's own name),
  ``pool_trees`` the admin's trees (e.g. ``gpu_h200``);
* the command runs :mod:`jupyter_gpushare.backends.ytsaurus_job` in the job's sandbox: it
  runs papermill on the notebook snapshot (``file_paths``) and writes the run's status and
  the executed notebook as rows of the attempt's output table (the job needs no token);
* ``environment`` is the run's environment without secrets or node-local identities;
* the checkpoint folder lives in the sandbox and is carried across attempts: the job
  leaves it as rows of its output table, and the next attempt gets it as a file;
* ``time_limit`` (ms) is the job's runtime limit plus a margin (the broker stops it first,
  with its own reason; YTsaurus's limit holds while the broker is down);
* ``max_failed_job_count: 1`` and ``fail_on_job_restart``: an attempt is never re-run
  inside its operation behind the broker's back (the broker owns attempts);
* ``interruption_signal: SIGTERM``: the preemption notice reaches the runner, which lets
  the notebook checkpoint and then ends the job successfully with ``terminated`` in its
  status row, so the output table is kept and the broker requeues the job;
* ``title``, ``annotations``, ``description`` and ``alias`` name the job, attempt and user;
  the alias (one running operation per alias) makes a repeated start find the first one.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .base import RunSpec

TASK = "notebook"
"""The name of the operation's single task."""
JOB_MODULE = "jupyter_gpushare.backends.ytsaurus_job"
NOTEBOOK_FILE = "input.ipynb"
RUNNER_SPEC_FILE = "spec.json"
CHECKPOINT_FILE = "checkpoint.tar.gz"
OUTPUT_FORMAT = "json"
INTERRUPTION_SIGNAL = "SIGTERM"
MIB = 1024 * 1024

SECRET_MARKERS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "PRIVATE", "API_KEY")
"""A variable whose name contains one of these never reaches the operation's spec."""
NODE_LOCAL = frozenset({
    "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "GPUSHARE_GPU_UUIDS",
    "GPUSHARE_BROKER_URL", "PATH", "PYTHONPATH", "VIRTUAL_ENV", "HOME", "USER", "LOGNAME",
})
"""Variables that name things of the broker's machine (its GPUs, paths): YTsaurus picks the
job's GPUs and sets ``CUDA_VISIBLE_DEVICES`` itself, and the image has its own paths."""
NODE_LOCAL_PREFIXES = ("CUDA_MPS_",)

_SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
_WHOLE_PCT = 99.95  # a slice at (rounded) 100 % compute of its card is the whole card


@dataclass(frozen=True)
class YtSettings:
    """What the admin configures about the operations (the backend's traitlets)."""

    work_dir: str = "//tmp/gpushare"
    pools: Mapping[str, str] = field(default_factory=dict)  # team -> YTsaurus pool
    pool_trees: tuple[str, ...] = ()
    docker_image: str = ""
    layer_paths: tuple[str, ...] = ()
    python: str = "python3"
    cpu_limit: float = 1.0  # cores, where the grant names none
    memory_limit_mib: int = 4096  # where the grant names none
    time_limit_margin_s: int = 300
    fail_on_job_restart: bool = True
    scheduling_tag_filters: Mapping[str, str] = field(default_factory=dict)  # gpushare pool ->
    instance: str = "gpushare"  # names this broker in aliases (several may share a cluster)
    owners_include_user: bool = True
    max_checkpoint_bytes: int = 256 * MIB  # the checkpoint folder carried to the next attempt


@dataclass(frozen=True)
class AttemptPaths:
    """Where one attempt lives in Cypress."""

    dir: str
    notebook: str
    runner_spec: str
    output: str
    checkpoint: str  # the previous attempt's checkpoint folder, as a gzipped tar


def check_id(job_id: str) -> str:
    """``job_id`` if it is safe as a Cypress path segment and in an alias, else ValueError."""
    if not _SAFE_ID.match(job_id or ""):
        raise ValueError(f"bad job id {job_id!r} for a Cypress path")
    return job_id


def job_dir(settings: YtSettings, job_id: str) -> str:
    return f"{settings.work_dir.rstrip('/')}/{check_id(job_id)}"


def attempt_paths(settings: YtSettings, job_id: str, attempt: int) -> AttemptPaths:
    base = f"{job_dir(settings, job_id)}/attempt-{int(attempt)}"
    return AttemptPaths(base, f"{base}/{NOTEBOOK_FILE}", f"{base}/{RUNNER_SPEC_FILE}",
                        f"{base}/output", f"{base}/{CHECKPOINT_FILE}")


def operation_alias(settings: YtSettings, job_id: str, attempt: int) -> str:
    """The operation's alias: only one operation per alias runs at a time in YTsaurus."""
    return f"*{settings.instance}-{check_id(job_id)}-{int(attempt)}"


def mutation_id(settings: YtSettings, job_id: str, attempt: int) -> str:
    """A mutation id fixed by job and attempt (YTsaurus's four 32-bit hex words), so a
    start request retried after a lost answer is not run twice."""
    digest = hashlib.sha256(f"{settings.instance}/{job_id}/{int(attempt)}".encode()).hexdigest()
    return "-".join(format(int(digest[i:i + 8], 16), "x") for i in range(0, 32, 8))


# ----------------------------------------------------------------------------------- grants


def whole_gpus(grant: Mapping[str, Any]) -> int | None:
    """The number of whole GPUs of ``grant`` (0 for a CPU-only grant), None if any part of
    it is a fraction of a card."""
    gpus = list(grant.get("gpus") or [])
    units = float(grant.get("units") or 0.0)
    if not gpus:
        return 0 if units == 0 else None
    if any(float(g.get("compute_pct") or 0.0) < _WHOLE_PCT for g in gpus):
        return None
    if units and not math.isclose(units, len(gpus), abs_tol=1e-6):
        return None
    return len(gpus)


def _fraction_text(grant: Mapping[str, Any]) -> str:
    gpus = list(grant.get("gpus") or [])
    units = float(grant.get("units") or 0.0)
    parts = ", ".join(
        f"{float(g.get('compute_pct') or 0):g} % compute and {int(g.get('memory_mib') or 0)} MiB"
        for g in gpus
    )
    return f"{units:g} GPU" + (f" ({parts})" if parts else "")


def refusal(spec: RunSpec, settings: YtSettings) -> str | None:
    """Why YTsaurus cannot run ``spec`` as granted (None: it can)."""
    grant = spec.grant or {}
    if whole_gpus(grant) is None:
        return (
            f"YTsaurus allocates whole GPUs only (gpu_limit is a whole number), and this job "
            f"was granted {_fraction_text(grant)}: submit it with a whole-GPU profile, or "
            f"run fractional jobs on the local or Slurm backend"
        )
    try:
        check_id(spec.job_id)
    except ValueError as exc:
        return str(exc)
    team = str(grant.get("team") or "")
    if not pool_of(team, settings):
        return "the job's grant names no team, so it has no YTsaurus pool"
    return None


def pool_of(team: str, settings: YtSettings) -> str:
    """The team's YTsaurus pool: the configured mapping, else the team's own name."""
    return str(settings.pools.get(team) or team)


# ------------------------------------------------------------------------------ the job


def job_environment(spec: RunSpec) -> dict[str, str]:
    """The job's environment: the run's variables less secrets and node-local ones, plus
    the job's identity (its checkpoint folder is made absolute in the sandbox)."""
    env: dict[str, str] = {}
    for key, value in spec.env.items():
        upper = key.upper()
        if any(m in upper for m in SECRET_MARKERS):
            continue
        if upper in NODE_LOCAL or upper.startswith(NODE_LOCAL_PREFIXES):
            continue
        env[key] = str(value)
    env.update(
        GPUSHARE_JOB_ID=spec.job_id,
        GPUSHARE_JOB_ATTEMPT=str(spec.attempt),
        GPUSHARE_BACKEND="ytsaurus",
        GPUSHARE_CHECKPOINT_DIR="checkpoint",
        PYTHONUNBUFFERED="1",
    )
    return env


def runner_spec(spec: RunSpec) -> dict[str, Any]:
    """``spec.json`` for :mod:`.papermill_run` in the sandbox: it runs there (no ``cwd``
    of the broker's machine) and copies nowhere (the output goes back as table rows)."""
    return {
        "job_id": spec.job_id,
        "attempt": spec.attempt,
        "parameters": spec.parameters,
        "output_path": "",
        "cwd": "",
        "kernel_name": spec.kernel_name,
        "name": spec.name or spec.job_id,
    }


def job_command(settings: YtSettings) -> str:
    """The task's command (run by YTsaurus through ``bash -c``)."""
    return f"exec {settings.python} -m {JOB_MODULE} {NOTEBOOK_FILE} {RUNNER_SPEC_FILE}"


def time_limit_ms(spec: RunSpec, settings: YtSettings) -> int:
    grace = int((spec.grant or {}).get("grace_period_s") or 0)
    return (int(spec.max_runtime_s) + grace + int(settings.time_limit_margin_s)) * 1000


def task_spec(spec: RunSpec, settings: YtSettings, *, resume: bool = False) -> dict[str, Any]:
    """The ``tasks.notebook`` section (``resume``: the previous attempt's checkpoint folder
    was written to the attempt's ``checkpoint.tar.gz``)."""
    grant = spec.grant or {}
    gpus = whole_gpus(grant)
    if gpus is None:
        raise ValueError(refusal(spec, settings))
    cpu_milli = int(grant.get("cpu_milli") or 0)
    memory_mib = int(grant.get("memory_mib") or 0) or int(settings.memory_limit_mib)
    paths = attempt_paths(settings, spec.job_id, spec.attempt)
    env = job_environment(spec)
    env["GPUSHARE_CHECKPOINT_MAX_BYTES"] = str(int(settings.max_checkpoint_bytes))
    files = [paths.notebook, paths.runner_spec]
    if resume:
        files.append(paths.checkpoint)
        env["GPUSHARE_CHECKPOINT_ARCHIVE"] = CHECKPOINT_FILE
    task: dict[str, Any] = {
        "command": job_command(settings),
        "job_count": 1,
        "gpu_limit": gpus,
        "cpu_limit": cpu_milli / 1000 if cpu_milli else float(settings.cpu_limit),
        "memory_limit": memory_mib * MIB,
        "file_paths": files,
        "output_table_paths": [paths.output],
        "output_format": OUTPUT_FORMAT,
        "environment": env,
        "interruption_signal": INTERRUPTION_SIGNAL,
        "title": f"papermill {spec.name or spec.job_id}",  # else the client names it "exec"
    }
    if settings.docker_image:
        task["docker_image"] = settings.docker_image
    if settings.layer_paths:
        task["layer_paths"] = list(settings.layer_paths)
    return task


def operation_annotations(spec: RunSpec, settings: YtSettings) -> dict[str, Any]:
    grant = spec.grant or {}
    return {
        "gpushare": {
            "instance": settings.instance,
            "job_id": spec.job_id,
            "attempt": int(spec.attempt),
            "user": spec.user,
            "team": str(grant.get("team") or ""),
            "pool": str(grant.get("pool") or ""),
            "priority": str(grant.get("priority") or ""),
            "grant_id": str(grant.get("id") or ""),
        }
    }


def operation_spec(spec: RunSpec, settings: YtSettings, *, resume: bool = False
                   ) -> dict[str, Any]:
    """The whole operation spec, as the client sends it (before its own defaults)."""
    grant = spec.grant or {}
    team = str(grant.get("team") or "")
    out: dict[str, Any] = {
        "tasks": {TASK: task_spec(spec, settings, resume=resume)},
        "pool": pool_of(team, settings),
        "time_limit": time_limit_ms(spec, settings),
        "max_failed_job_count": 1,
        "fail_on_job_restart": bool(settings.fail_on_job_restart),
        "title": f"gpushare {spec.name or spec.job_id} ({spec.user}, job {spec.job_id} "
                 f"attempt {spec.attempt})",
        "annotations": operation_annotations(spec, settings),
        "description": {"gpushare job": spec.job_id, "user": spec.user,
                        "notebook": spec.name or ""},
        "alias": operation_alias(settings, spec.job_id, spec.attempt),
    }
    if settings.pool_trees:
        out["pool_trees"] = list(settings.pool_trees)
    tag = settings.scheduling_tag_filters.get(str(grant.get("pool") or ""))
    if tag:
        out["scheduling_tag_filter"] = tag
    if settings.owners_include_user and spec.user:
        out["owners"] = [spec.user]
    return out
