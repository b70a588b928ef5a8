"""What one attempt of a job is given: the :class:`~..backends.base.RunSpec` built from
the job, its notebook snapshot and its grant (enforcement variables, the grant's view)."""

from __future__ import annotations

import os
from typing import Any, Protocol

from ...backends.base import RunSpec
from ...core.model import Grant
from .store import Job, JobStore

ENV_PASSED = ("PATH", "LANG", "LC_ALL", "TZ", "PYTHONPATH", "VIRTUAL_ENV")
"""Variables of the broker's environment a job inherits (never its hub token)."""


class GrantViews(Protocol):
    """The broker as an attempt sees it: the view of a grant it hands out."""

    def grant_view(self, grant: Grant) -> dict[str, Any]: ...


class AttemptSource(Protocol):
    """What an attempt's spec is built from: the :class:`~.runner.JobManager` is one.
    Named here, so this module does not import the runner that imports it."""

    @property
    def store(self) -> JobStore: ...

    @property
    def broker(self) -> GrantViews: ...

    @property
    def max_output_bytes(self) -> int: ...

    @property
    def mps(self) -> str: ...

    @property
    def mps_pipe_directory(self) -> str: ...

    @property
    def extra_env(self) -> dict[str, Any]: ...

    def user_root(self, user: str) -> str: ...

    def output_file(self, job: Job) -> str: ...


def build_run_spec(manager: AttemptSource, job: Job, grant: Grant, *, real_gpus: bool) -> RunSpec:
    """The spec of the job's current attempt (reads its snapshot: call it off the loop)."""
    notebook = manager.store.notebook(job.id)
    out = manager.output_file(job)
    kernel = ((notebook.get("metadata") or {}).get("kernelspec") or {}).get("name") or ""
    return RunSpec(
        job_id=job.id,
        attempt=job.attempt,
        user=job.user,
        notebook=notebook,
        parameters=job.parameters,
        output_path=out,
        output_root=manager.user_root(job.user),
        max_output_bytes=manager.max_output_bytes,
        cwd=os.path.dirname(out),
        env=job_env(manager, grant, real_gpus=real_gpus),
        max_runtime_s=job.max_runtime_s,
        kernel_name=kernel,
        name=job.name,
        grant=manager.broker.grant_view(grant),
    )


def job_env(manager: AttemptSource, grant: Grant, *, real_gpus: bool) -> dict[str, str]:
    """The job's environment: a few of the broker's variables, the admin's ``extra_env``,
    then the grant's enforcement (as a local server gets it, without a broker URL)."""
    from ...spawner.enforcement import local_env, mps_daemon_running
    from ..client import GrantInfo

    mps = manager.mps == "on" or (
        manager.mps == "auto" and mps_daemon_running(manager.mps_pipe_directory or None)
    )
    env = {k: os.environ[k] for k in ENV_PASSED if k in os.environ}
    env.update({str(k): str(v) for k, v in manager.extra_env.items()})
    info = GrantInfo.from_json(manager.broker.grant_view(grant))
    env.update(
        local_env(
            info,
            mps=mps,
            real_gpus_present=real_gpus,
            broker_url="",
            mps_pipe_dir=manager.mps_pipe_directory or None,
            inherited_pythonpath=env.get("PYTHONPATH", ""),
        )
    )
    return env
