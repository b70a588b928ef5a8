"""Small helpers to submit and watch jobs on the test Slurm cluster (``tests/slurmcluster.py``).

``submit(cluster, *sbatch_args)`` returns a :class:`Submitted` (the job id, or sbatch's error);
``job(cluster, job_id)`` reads ``scontrol show job -o`` as a dict; ``wait_job`` polls it until
a predicate holds (a clear error with the job and the daemons' logs otherwise).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Submitted:
    """What ``sbatch --parsable`` answered: ``job_id`` on success, else ``error``."""

    job_id: str | None
    error: str


def submit(cluster: Any, *args: str, wrap: str = "sleep 300") -> Submitted:
    done = cluster.run("sbatch", "--parsable", "--time=10", "-o", "/dev/null",
                       *args, "--wrap", wrap, check=False)
    if done.returncode != 0:
        return Submitted(None, (done.stderr + done.stdout).strip())
    return Submitted(done.stdout.strip().split(";")[0], "")


def job(cluster: Any, job_id: str) -> dict[str, str]:
    """``scontrol show job -o ID`` as ``{key: value}`` (empty if Slurm forgot it)."""
    out = cluster.run("scontrol", "show", "job", "-o", job_id, check=False).stdout
    fields: dict[str, str] = {}
    for key, value in re.findall(r"(?:^|\s)([A-Za-z:/]+)=(.*?)(?=\s+[A-Za-z:/]+=|$)",
                                 out.strip()):
        fields.setdefault(key, value)
    return fields


def wait_job(cluster: Any, job_id: str, want: Callable[[dict[str, str]], bool],
             timeout: float = 60.0, what: str = "") -> dict[str, str]:
    deadline = time.monotonic() + timeout
    fields: dict[str, str] = {}
    while time.monotonic() < deadline:
        fields = job(cluster, job_id)
        if fields and want(fields):
            return fields
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} never {what or 'got there'} in {timeout:g}s: "
                         f"{fields}\n{cluster.logs()}")


def cancel(cluster: Any, *job_ids: str | None) -> None:
    ids = [j for j in job_ids if j]
    if ids:
        cluster.run("scancel", *ids, check=False)
