"""What one attempt of a job asks of Slurm, as ``sbatch`` arguments (pure: no I/O).

The broker has already admitted and placed the job; this module only translates its
grant (``RunSpec.grant``) into Slurm's words:

* whole GPUs -> ``--gres=gpu:N``; a fraction f of one GPU -> ``--gres=shard:K`` with
  K = ceil(f x shards_per_gpu), at least 1 (``shards_per_gpu`` from the policy's
  ``slurm:`` section, which the Slurm export also writes into ``gres.conf``);
* the broker's node -> ``--nodelist`` (one node), the team -> ``--account`` and the
  priority class -> ``--qos`` where the site asks for them (Slurm refuses an account or
  QOS its accounting does not know);
* the job's limit -> ``--time`` (the runtime plus the grace period, in whole minutes) and
  ``--signal=B:TERM@<grace>``, so the runner is told ``grace`` seconds before the limit and
  can checkpoint;
* ``--no-requeue``: the broker, not Slurm, owns attempts. A Slurm requeue would rerun the
  attempt on the node the broker placed it on (maybe the dead one) after its grant was
  released; instead a node failure ends the attempt (``NODE_FAIL``), the grant is released
  and the broker decides, and every new attempt is a new Slurm job with its own name.

:func:`refusal` says, before anything is submitted, why Slurm could never run a request
(more GPUs than the node has, more shards than one GPU has, a node Slurm does not know).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..export.slurm import account_name, partition_name, qos_name, team_account

NAME_PREFIX = "gpushare"
_SAFE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_NODE_GRES = re.compile(r"(?:^|,)(gpu|shard)(?::[^:,()]+)?:(\d+)")


def job_name(job_id: str, attempt: int) -> str:
    """The Slurm job name of one attempt: a restarted broker finds the job by it."""
    return f"{NAME_PREFIX}-{job_id}-a{int(attempt)}"


@dataclass(frozen=True)
class Gres:
    """The GRES of one request: ``kind`` "gpu" (whole GPUs), "shard" or "" (none)."""

    kind: str
    count: int

    def arg(self) -> str | None:
        return f"{self.kind}:{self.count}" if self.kind else None


def gres_for(grant: Mapping[str, Any], shards_per_gpu: int) -> Gres:
    """``gpu:N`` for whole GPUs, ``shard:K`` for a fraction of one GPU, none without GPUs."""
    gpus = list(grant.get("gpus") or [])
    if not gpus:
        return Gres("", 0)
    whole = all(float(g.get("compute_pct") or 0) >= 100.0 for g in gpus)
    if whole:
        return Gres("gpu", len(gpus))
    share = sum(float(g.get("compute_pct") or 0) for g in gpus) / 100.0
    if share <= 0:
        share = float(grant.get("units") or 0)
    count = max(1, math.ceil(share * shards_per_gpu - 1e-9))
    return Gres("shard", count)


@dataclass(frozen=True)
class SlurmNodeInfo:
    """What ``scontrol show node`` says about one node."""

    name: str
    gpus: int
    shards: int
    state: str = ""
    partitions: tuple[str, ...] = ()

    @property
    def shards_per_gpu(self) -> int:
        return self.shards // self.gpus if self.gpus else self.shards


def parse_node_gres(text: str) -> tuple[int, int]:
    """(gpus, shards) of a node's ``Gres=`` value such as ``gpu:h100:2(S:0),shard:16``."""
    counts = {"gpu": 0, "shard": 0}
    for kind, count in _NODE_GRES.findall(text or ""):
        counts[kind] += int(count)
    return counts["gpu"], counts["shard"]


def refusal(gres: Gres, node: str, nodes: Mapping[str, SlurmNodeInfo],
            partition: str | None = None) -> str | None:
    """Why Slurm could never run this request, or None. ``nodes``: the cluster's nodes."""
    if not node:
        return "the grant names no node to run on"
    info = nodes.get(node)
    if info is None:
        known = ", ".join(sorted(nodes)) or "none"
        return f"node {node!r} is not a node of the Slurm cluster (its nodes: {known})"
    if partition and info.partitions and partition not in info.partitions:
        return (f"node {node!r} is not in Slurm partition {partition!r} "
                f"(it is in: {', '.join(info.partitions)})")
    if gres.kind == "gpu" and gres.count > info.gpus:
        return (f"asks for {gres.count} whole GPUs on node {node!r}, which has "
                f"{info.gpus} GPU{'s' if info.gpus != 1 else ''} in Slurm")
    if gres.kind == "shard":
        if info.shards <= 0:
            return f"asks for shard:{gres.count} on node {node!r}, which has no GPU shards"
        if gres.count > info.shards_per_gpu:
            return (f"asks for shard:{gres.count}, more shards than one GPU of node "
                    f"{node!r} has ({info.shards_per_gpu}): Slurm would accept the job and "
                    "leave it pending for ever (make the policy's slurm.shards_per_gpu "
                    "match gres.conf)")
    return None


@dataclass(frozen=True)
class SbatchOptions:
    """The site's settings that shape every ``sbatch`` call (from SlurmBackend's traits)."""

    partition: str | None = None
    partition_per_pool: bool = False  # no partition set: the pool's (as the export names it)
    pass_account: bool = False
    pass_qos: bool = False
    pass_cpu_memory: bool = True
    extra_args: tuple[str, ...] = ()


@dataclass(frozen=True)
class SbatchRequest:
    """One attempt, as Slurm will be asked for it."""

    name: str
    script: str
    output: str
    workdir: str
    node: str
    gres: Gres
    time_limit_s: int
    grace_s: int
    account: str = ""  # the team (named for Slurm by sbatch_argv, as the export names it)
    qos: str = ""  # the priority class
    cpus: int = 0
    memory_mib: int = 0
    extra: tuple[str, ...] = field(default_factory=tuple)
    pool: str = ""


def build_request(name: str, script: str, output: str, workdir: str,
                  grant: Mapping[str, Any], max_runtime_s: int, shards_per_gpu: int
                  ) -> SbatchRequest:
    """The request for an attempt whose grant is ``grant`` (the broker's JSON view)."""
    return SbatchRequest(
        name=name, script=script, output=output, workdir=workdir,
        node=str(grant.get("node") or ""),
        gres=gres_for(grant, shards_per_gpu),
        time_limit_s=max(1, int(max_runtime_s)),
        grace_s=max(0, int(grant.get("grace_period_s") or 0)),
        account=str(grant.get("team") or ""),
        qos=str(grant.get("priority") or ""),
        pool=str(grant.get("pool") or ""),
        cpus=max(1, math.ceil(int(grant.get("cpu_milli") or 1000) / 1000)),
        memory_mib=int(grant.get("memory_mib") or 0),
    )


def _checked(flag: str, value: str) -> str:
    if not _SAFE.match(value):
        raise ValueError(f"{flag}: {value!r} is not a Slurm name (letters, digits, . _ -)")
    return value


def time_minutes(time_limit_s: int, grace_s: int) -> int:
    """``--time`` in whole minutes: the runtime plus the grace period, at least 1."""
    return max(1, math.ceil((time_limit_s + grace_s) / 60))


def slurm_placement(req: SbatchRequest, opts: SbatchOptions) -> tuple[str | None, str]:
    """The partition and account of an attempt, named as ``jupyter-gpushare export slurm``
    names them (and as ``SlurmGPUShareSpawner`` charges servers): with a site partition
    (the setting or the policy's ``slurm.partition``) the team's own account; otherwise
    the team's account in the pool (``<team>_<pool>``), in the pool's partition where
    ``partition_per_pool`` is on."""
    if not req.account:
        return opts.partition, ""
    if opts.partition:
        return opts.partition, team_account(req.account)
    account = account_name(req.account, req.pool) if req.pool else team_account(req.account)
    if opts.partition_per_pool and req.pool:
        return partition_name(req.pool), account
    return None, account


def sbatch_argv(req: SbatchRequest, opts: SbatchOptions, sbatch: str = "sbatch") -> list[str]:
    """The full ``sbatch`` command line for ``req`` (the script path last)."""
    argv = [
        sbatch, "--parsable",
        f"--job-name={req.name}",
        f"--output={req.output}", "--open-mode=append",
        f"--chdir={req.workdir}",
        "--nodes=1", "--ntasks=1",
        f"--nodelist={_checked('--nodelist', req.node)}",
        f"--time={time_minutes(req.time_limit_s, req.grace_s)}",
        "--no-requeue",
        "--export=ALL",
    ]
    gres = req.gres.arg()
    if gres:
        argv.append(f"--gres={gres}")
    if req.grace_s > 0:
        argv.append(f"--signal=B:TERM@{min(req.grace_s, 65535)}")
    partition, account = slurm_placement(req, opts)
    if partition:
        argv.append(f"--partition={_checked('--partition', partition)}")
    if opts.pass_account and account:
        argv.append(f"--account={_checked('--account', account)}")
    if opts.pass_qos and req.qos:
        argv.append(f"--qos={_checked('--qos', qos_name(req.qos))}")
    if opts.pass_cpu_memory:
        argv.append(f"--cpus-per-task={req.cpus}")
        if req.memory_mib > 0:
            argv.append(f"--mem={req.memory_mib}M")
    argv.extend(opts.extra_args)
    argv.extend(req.extra)
    argv.append(req.script)
    return argv


def batch_script(python: str, runner: str, attempt_dir: str) -> str:
    """The batch script: ``exec`` the runner, so Slurm's signals reach it directly."""
    return ("#!/bin/sh\n"
            "# written by jupyter-gpushare: one attempt of a batch job\n"
            f"exec {_sh(python)} -m {runner} {_sh(attempt_dir)}\n")


def _sh(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"


def parse_parsable(stdout: str) -> str:
    """The job id from ``sbatch --parsable`` (``id`` or ``id;cluster``)."""
    first = (stdout or "").strip().splitlines()
    job_id = first[0].split(";")[0].strip() if first else ""
    if not job_id.isdigit():
        raise ValueError(f"sbatch printed no job id: {stdout!r}")
    return job_id


def scancel_signal_argv(job_id: str, scancel: str = "scancel") -> list[str]:
    """The preemption notice: SIGTERM to the batch script and every step."""
    return [scancel, "--signal=TERM", "--full", job_id]


def scancel_argv(job_id: str, scancel: str = "scancel") -> Sequence[list[str]]:
    """End the job now: SIGKILL to everything it runs, then cancel it."""
    return ([scancel, "--signal=KILL", "--full", job_id], [scancel, job_id])
