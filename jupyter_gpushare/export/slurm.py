"""``jupyter-gpushare export slurm POLICY``: the policy as Slurm configuration.

Pure (no I/O): :func:`export_slurm` turns a :class:`~jupyter_gpushare.core.model.Policy`
into a :class:`SlurmExport` of three parts, each a list of lines with ``#`` comments that
name the policy field every number came from:

* ``slurm.conf`` lines: GRES types, multifactor priority, QOS preemption, accounting
  enforcement, one ``NodeName=`` line per node (``Gres=gpu:N,shard:N*S``, S = shards per
  GPU) and one ``PartitionName=`` per pool (only the accounts of teams with a quota there);
* ``gres.conf`` lines: every GPU as ``gpu`` and as ``S`` shards;
* ``sacctmgr -i`` commands (a shell script, idempotent: every ``add`` is followed by a
  ``modify`` that sets the values, so running it again converges): a QOS per priority
  class, a parent account for the cohort, an account per team, an account per (team, pool)
  quota with its ``GrpTRES`` and ``GrpTRESMins``, and the users the policy names.

The mapping (also in ``docs/engines/slurm.md``):

========================  ===========================================================
policy                    Slurm
========================  ===========================================================
pool                      partition ``<pool>`` (``AllowAccounts`` = the teams' accounts)
team                      account ``<team>`` under the cohort account ``gpushare``
team's quota in a pool    account ``<team>_<pool>`` (parent ``<team>``): ``GrpTRES``
                          ``gres/gpu`` (exclusive pools) or ``gres/shard`` (pools that
                          share GPUs) = guarantee + borrow limit; ``GrpTRESMins`` =
                          monthly GPU-hours x 60 (x S for shards)
per-user cap              ``GrpTRES`` of the user's association (users the policy names)
priority class            QOS ``<class>``: ``Priority`` = value, ``Preempt`` = the
                          preemptible classes of lower value, ``PreemptMode=requeue``
                          for preemptible classes, ``GraceTime`` = grace period
team's priorities         the QOS list of the team's accounts
========================  ===========================================================

A job the broker grants for team T in pool P at class C is submitted with
``--account`` :func:`account_name` ``(T, P)``, ``--partition`` :func:`partition_name` ``(P)``
and ``--qos`` :func:`qos_name` ``(C)``.

The parts live next to this module: the Slurm names (:mod:`.slurm_names`), the quotas as TRES
limits (:mod:`.slurm_limits`), the ``sacctmgr`` commands (:mod:`.slurm_sacctmgr`) and the
result with its rendering (:mod:`.slurm_result`); here are the slurm.conf and gres.conf lines
and the ``export slurm`` command.
"""

from __future__ import annotations

import argparse
from typing import Any

from ..core.model import Policy, Pool, SharingMode
from .command import Exporter, exporter
from .slurm_names import (
    COHORT_ACCOUNT,
    _ranges,
    account_name,
    conf_value,
    partition_name,
    qos_name,
    sh,
    slurm_name,
    team_account,
)
from .slurm_result import FORMATS, SlurmExport
from .slurm_sacctmgr import SacctmgrPart

__all__ = [
    "COHORT_ACCOUNT",
    "DEFAULT_SHARDS_PER_GPU",
    "FORMATS",
    "LIMITS_NOT_EXPRESSED",
    "SlurmExport",
    "account_name",
    "conf_value",
    "export_slurm",
    "partition_name",
    "qos_name",
    "sh",
    "shards_per_gpu_of",
    "slurm_name",
    "team_account",
]

DEFAULT_SHARDS_PER_GPU = 8
"""Shards per GPU when neither the policy's ``slurm.shards_per_gpu`` nor the caller says."""

LIMITS_NOT_EXPRESSED = (
    "What Slurm cannot express (the broker still decides these for work sent through it):",
    "- Borrowing: GrpTRES caps a team at guarantee + borrow limit, but Slurm does not",
    "  know which of a team's GPUs are borrowed. The broker reclaims borrowed capacity",
    "  for a team inside its guarantee whatever the borrower's priority; Slurm preempts",
    "  only by QOS (a higher class over a preemptible lower one).",
    "- The guarantee itself: nothing in Slurm reserves a team's guaranteed GPUs for it",
    "  (no preemption on behalf of a guarantee); it is only part of the GrpTRES sum.",
    "- An interactive server inside its team's guarantee is never preempted by the",
    "  broker; Slurm cannot tell interactive from batch jobs of one QOS, so this holds",
    "  only while interactive work runs at a class that is not preemptible.",
    "- The debug pool's no-queue rule: a Slurm partition always queues; submit there",
    "  with 'salloc/srun --immediate' (the broker grants at once or refuses at once).",
    "- Memory planned by peak and the pools' memory headroom: a shard is 1/S of a GPU",
    "  for counting only; Slurm does not limit a job's GPU memory.",
    "- Whole GPUs and shards in a pool that shares GPUs are capped separately",
    "  (gres/gpu and gres/shard), not as one sum of GPU units.",
    "- Team members: JupyterHub groups are not Slurm users. Only users the policy",
    "  names (team admins) get associations here; add each member the same way",
    "  ('sacctmgr add user NAME account=<team>_<pool>').",
    "- checkpoint_required_after (refusing long preemptible jobs without checkpoints)",
    "  and profiles' max_lifetime (the backend passes --time) are not Slurm settings.",
    "- Monthly budgets: GrpTRESMins counts usage since the last reset",
    "  (PriorityUsageResetPeriod=MONTHLY resets it at the start of each month, as the",
    "  broker's ledger does); a job whose time limit does not fit the remainder is held",
    "  (AccountingStorageEnforce=safe) where the broker refuses only once it is spent.",
)


def shards_per_gpu_of(policy: Policy, override: int | None = None) -> int:
    """Shards per GPU: ``override`` if given, else the policy's ``slurm.shards_per_gpu``,
    else :data:`DEFAULT_SHARDS_PER_GPU`."""
    if override is not None:
        return override
    section = getattr(policy, "slurm", None)
    value = getattr(section, "shards_per_gpu", None)
    return int(value) if value else DEFAULT_SHARDS_PER_GPU


class _Builder:
    """The header, slurm.conf and gres.conf lines; the ``sacctmgr`` lines come from the part
    it holds (:class:`~.slurm_sacctmgr.SacctmgrPart`)."""

    def __init__(self, policy: Policy, shards: int, device: str) -> None:
        self.policy = policy
        self.shards = shards
        self.device = device
        section = getattr(policy, "slurm", None)
        named = getattr(section, "partition", None)
        self.default_partition = slurm_name(named) if named else None
        self.sacctmgr = SacctmgrPart(policy, shards)
        self.out = SlurmExport()

    # -- names -------------------------------------------------------------------------------

    def pools_with_nodes(self) -> list[Pool]:
        return [p for p in self.policy.pools if self.policy.nodes_in(p.name)]

    # -- parts -------------------------------------------------------------------------------

    def header(self) -> None:
        classes = ", ".join(c.name for c in self.policy.priority_classes)
        self.out.header = [
            "# Slurm configuration exported by 'jupyter-gpushare export slurm' from the",
            "# jupyter-gpushare policy. Every number comes from the policy field named in the",
            "# comment above it. Regenerate after each policy change; the sacctmgr part is",
            "# idempotent (add, then modify), so running it again converges.",
            f"# Teams: {', '.join(t.name for t in self.policy.teams)}; pools: "
            f"{', '.join(p.name for p in self.policy.pools)}; priority classes: {classes}.",
            f"# Shards per GPU (gres/shard): {self.shards}; a fraction f of a GPU is "
            f"ceil(f x {self.shards}) shards (at least 1).",
            "#",
            *("# " + line for line in LIMITS_NOT_EXPRESSED),
        ]

    def slurm_conf(self) -> None:
        policy = self.policy
        conf = self.out.slurm_conf
        top = max((c.value for c in policy.priority_classes), default=1)
        top_class = max(policy.priority_classes, key=lambda c: c.value, default=None)
        preemptible = [c.name for c in policy.priority_classes if c.preemptible]
        budgets = any(q.gpu_hours_per_month is not None for t in policy.teams for _, q in t.quotas)
        conf += [
            "GresTypes=gpu,shard",
            "# priority: a job's priority is its QOS priority (= its class's value): the QOS",
            "# factor is value / highest value, weighted by the highest value",
            "PriorityType=priority/multifactor",
            f"# from priority_classes.{top_class.name if top_class else '-'}.value (the highest)",
            f"PriorityWeightQOS={top}",
            "# preemption by QOS (each QOS lists whom it may preempt, see the sacctmgr part)",
            "PreemptType=preempt/qos",
            "# preemptible classes (" + (", ".join(preemptible) or "none") + ") are requeued,"
            " so batch work resumes from its checkpoint",
            "PreemptMode=" + ("REQUEUE" if preemptible else "OFF"),
            "# accounting: limits and QOS are enforced, GPUs and shards are counted",
            "AccountingStorageTRES=gres/gpu,gres/shard",
            "AccountingStorageEnforce=associations,limits,qos,safe",
        ]
        if budgets:
            conf += [
                "# gpu_hours_per_month is a monthly budget: usage resets each month, no decay",
                "PriorityUsageResetPeriod=MONTHLY",
                "PriorityDecayHalfLife=0",
            ]
        conf.append("")
        for pool in self.pools_with_nodes():
            nodes = policy.nodes_in(pool.name)
            conf.append(f"# pool {pool.name} ({pool.mode.value}): from inventory")
            for node in nodes:
                gpus = len(node.gpus)
                conf.append(
                    f"# node {node.name}: {gpus} GPU(s) x {self.shards} shards, "
                    f"cpu {node.cpu_milli / 1000:g}, memory {node.memory_mib} MiB"
                )
                conf.append(
                    f"NodeName={conf_value(node.name, 'node')} "
                    f"CPUs={max(1, node.cpu_milli // 1000)} "
                    f"RealMemory={node.memory_mib} Gres=gpu:{gpus},shard:{gpus * self.shards} "
                    f"Feature={partition_name(pool.name)} State=UNKNOWN"
                )
            teams = [t for t in policy.teams if t.quota(pool.name) is not None]
            accounts = [account_name(t.name, pool.name) for t in teams]
            accounts += [team_account(t.name) for t in teams]
            conf.append(
                f"# partition {partition_name(pool.name)}: the accounts of the teams "
                f"with a quota in pools.{pool.name} (teams.*.quotas.{pool.name}), "
                "per pool and the team's own"
            )
            if pool.mode is SharingMode.DEBUG:
                conf.append("# (debug pool: no queue in the policy; Slurm queues, see the header)")
            default = " Default=YES" if self.default_partition == partition_name(pool.name) else ""
            conf.append(
                f"PartitionName={partition_name(pool.name)} "
                f"Nodes={_ranges([conf_value(n.name, 'node') for n in nodes])} "
                f"AllowAccounts={','.join(accounts) or 'NONE'}{default} MaxTime=INFINITE "
                "State=UP"
            )
            conf.append("")
        part = self.default_partition
        if part and part not in {partition_name(p.name) for p in self.pools_with_nodes()}:
            teams = [t for t in policy.teams if t.quotas]
            conf.append(
                f"# partition {part}: slurm.partition, where the broker's jobs and "
                "servers go (every node; the broker picks the node, --nodelist), "
                "for the teams' own accounts"
            )
            conf.append(
                f"PartitionName={conf_value(part, 'partition')} "
                f"Nodes={_ranges([conf_value(n.name, 'node') for n in policy.nodes])} "
                f"AllowAccounts={','.join(team_account(t.name) for t in teams) or 'NONE'} "
                "Default=YES MaxTime=INFINITE State=UP"
            )

    def sacctmgr_commands(self) -> None:
        self.out.sacctmgr += self.sacctmgr.build()

    def gres_conf(self) -> None:
        gres = self.out.gres_conf
        for pool in self.pools_with_nodes():
            for node in self.policy.nodes_in(pool.name):
                if not node.gpus:
                    continue
                gres.append(
                    f"# node {node.name} (pool {pool.name}): {len(node.gpus)} GPU(s), "
                    f"each {self.shards} shards"
                )
                name = conf_value(node.name, "node")
                for gpu in node.gpus:
                    path = conf_value(self.device.format(node=node.name, index=gpu.index), "device")
                    gres.append(f"NodeName={name} Name=gpu File={path}")
                for gpu in node.gpus:
                    path = conf_value(self.device.format(node=node.name, index=gpu.index), "device")
                    gres.append(f"NodeName={name} Name=shard Count={self.shards} File={path}")


def export_slurm(
    policy: Policy, *, shards_per_gpu: int | None = None, device: str = "/dev/nvidia{index}"
) -> SlurmExport:
    """The policy as Slurm configuration (see the module docstring).

    ``shards_per_gpu`` overrides the policy's ``slurm.shards_per_gpu``; ``device`` is the
    ``gres.conf`` ``File=`` of a GPU, formatted with ``node`` and ``index``.
    """
    shards = shards_per_gpu_of(policy, shards_per_gpu)
    if shards < 1:
        raise ValueError(f"shards per GPU must be at least 1, not {shards}")
    builder = _Builder(policy, shards, device)
    builder.header()
    builder.slurm_conf()
    builder.gres_conf()
    builder.sacctmgr_commands()
    return builder.out


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--format",
        choices=FORMATS,
        default="all",
        help="conf: slurm.conf and gres.conf lines; sacctmgr: the accounts "
        "and QOS as a shell script; all: both (default)",
    )
    parser.add_argument(
        "--shards-per-gpu",
        type=int,
        default=None,
        help="shards per GPU (default: the policy's slurm.shards_per_gpu, "
        f"else {DEFAULT_SHARDS_PER_GPU})",
    )
    parser.add_argument(
        "--gpu-device",
        default="/dev/nvidia{index}",
        help="gres.conf File= of each GPU, with {node} and {index} (default /dev/nvidia{index})",
    )


def _render(policy: Any, args: argparse.Namespace) -> str:
    try:
        export = export_slurm(policy, shards_per_gpu=args.shards_per_gpu, device=args.gpu_device)
    except ValueError as exc:  # a value Slurm's files cannot hold: say why, no traceback
        raise SystemExit(f"jupyter-gpushare export slurm: {exc}") from None
    return export.render(args.format)


exporter(
    Exporter(
        "slurm",
        "Slurm: gres.conf and node lines with GPU shards, a QOS per priority class, an account "
        "per team and quota with GrpTRES/GrpTRESMins, as slurm.conf text and sacctmgr commands",
        _arguments,
        _render,
    )
)
