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
"""

from __future__ import annotations

import argparse
import re
import shlex
from dataclasses import dataclass, field
from typing import Any

from ..core.model import UNIT, Policy, Pool, PoolQuota, SharingMode, Team
from ..policy.issues import one_line
from ..policy.yamlread import show
from .command import Exporter, exporter

DEFAULT_SHARDS_PER_GPU = 8
"""Shards per GPU when neither the policy's ``slurm.shards_per_gpu`` nor the caller says."""

COHORT_ACCOUNT = "gpushare"
"""The parent account of every team's account (the cohort that borrows from itself)."""

FORMATS = ("conf", "sacctmgr", "all")

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


def slurm_name(name: str) -> str:
    """A policy name as a Slurm account/QOS/partition name (lower case: slurmdbd stores
    names in lower case; characters other than letters, digits, ``-`` and ``_`` become
    ``_``)."""
    return re.sub(r"[^a-z0-9_-]", "_", name.lower())


_CONF_VALUE = re.compile(r"^[A-Za-z0-9._,:/@%+\[\]-]+$")


def conf_value(value: str, what: str) -> str:
    """``value`` as a slurm.conf / gres.conf value: one word of safe characters, or
    ValueError (a name the policy check let through is refused here, never written)."""
    if not _CONF_VALUE.match(value):
        raise ValueError(f"{what} {show(value)} cannot be written into slurm.conf (expected "
                         "letters, digits and . _ , : / @ % + [ ] -)")
    return value


def sh(*words: str) -> str:
    """One shell command line: every word quoted (``shlex.quote``), so that no name can add
    a word, a command or a line to the script."""
    return " ".join(shlex.quote(w) for w in words)


def partition_name(pool: str) -> str:
    """The Slurm partition of a pool."""
    return slurm_name(pool)


def team_account(team: str) -> str:
    """The Slurm account of a team (parent of its per-pool accounts)."""
    return slurm_name(team)


def account_name(team: str, pool: str) -> str:
    """The Slurm account that a job of ``team`` in ``pool`` is charged to."""
    return f"{slurm_name(team)}_{slurm_name(pool)}"


def qos_name(priority_class: str) -> str:
    """The Slurm QOS of a priority class."""
    return slurm_name(priority_class)


def shards_per_gpu_of(policy: Policy, override: int | None = None) -> int:
    """Shards per GPU: ``override`` if given, else the policy's ``slurm.shards_per_gpu``,
    else :data:`DEFAULT_SHARDS_PER_GPU`."""
    if override is not None:
        return override
    section = getattr(policy, "slurm", None)
    value = getattr(section, "shards_per_gpu", None)
    return int(value) if value else DEFAULT_SHARDS_PER_GPU


@dataclass
class SlurmExport:
    """The three parts of the export, each a list of lines (comments included)."""

    header: list[str] = field(default_factory=list)
    slurm_conf: list[str] = field(default_factory=list)
    gres_conf: list[str] = field(default_factory=list)
    sacctmgr: list[str] = field(default_factory=list)

    def commands(self) -> list[str]:
        """The ``sacctmgr`` command lines, without comments or blank lines."""
        return [line for line in self.sacctmgr if line.strip() and not line.startswith("#")]

    def render(self, fmt: str = "all") -> str:
        """The text for ``--format`` ``conf`` (slurm.conf and gres.conf), ``sacctmgr``
        (a shell script) or ``all`` (both, in sections)."""
        if fmt not in FORMATS:
            raise ValueError(f"format must be one of {', '.join(FORMATS)}, not {fmt!r}")
        out = list(self.header)
        if fmt in ("conf", "all"):
            out += ["", "# " + "=" * 30 + " slurm.conf (add these lines)", *self.slurm_conf]
            out += ["", "# " + "=" * 30 + " gres.conf", *self.gres_conf]
        if fmt in ("sacctmgr", "all"):
            out += ["", "# " + "=" * 30 + " sacctmgr commands (sh; needs slurmdbd)",
                    *self.sacctmgr]
        if fmt == "sacctmgr":
            out.insert(0, "#!/bin/sh")
        # every line stays one line whatever a name holds (comments included)
        return "\n".join(one_line(line) for line in out) + "\n"


def _shards(milli: int, shards_per_gpu: int) -> int:
    """Shards for ``milli`` GPU units, rounded up (a fraction's ask is rounded up too)."""
    return -(-milli * shards_per_gpu // UNIT)


def _units(milli: int) -> str:
    return f"{milli / UNIT:g}"


def _ranges(names: list[str]) -> str:
    return ",".join(names)


@dataclass(frozen=True)
class _TeamPoolLimit:
    """One (team, pool) account's numbers and the comments that say where they came from."""

    tres: tuple[tuple[str, int], ...]
    tres_mins: tuple[tuple[str, int], ...]
    notes: tuple[str, ...]


def _limit(team: Team, pool: Pool, quota: PoolQuota, shards: int) -> _TeamPoolLimit:
    field_path = f"teams.{team.name}.quotas.{pool.name}"
    limit = quota.guaranteed_milli + quota.borrow_limit_milli
    total = (f"{field_path}.guaranteed ({_units(quota.guaranteed_milli)}) + "
             f"borrow_limit ({_units(quota.borrow_limit_milli)}) = {_units(limit)} GPU")
    notes = [f"# GrpTRES: {total}"]
    hours = quota.gpu_hours_per_month
    whole = limit // UNIT
    if pool.shares_gpus:
        shard_count = _shards(limit, shards)
        notes.append(f"#   pool {pool.name} shares GPUs ({pool.mode.value}): fractions are "
                     f"gres/shard, {_units(limit)} x {shards} shards per GPU = {shard_count}"
                     + ("" if limit * shards % UNIT == 0 else
                        " (rounded up, as a fraction's ask is)"))
        notes.append(f"#   whole GPUs in this pool: gres/gpu = {whole} (capped apart from "
                     "the shards)")
        tres: list[tuple[str, int]] = [("gres/gpu", whole), ("gres/shard", shard_count)]
        mins: list[tuple[str, int]] = []
        if hours is not None:
            mins = [("gres/gpu", round(hours * 60)), ("gres/shard", round(hours * 60 * shards))]
            notes.append(f"# GrpTRESMins: {field_path}.gpu_hours_per_month ({hours:g}) x 60 "
                         f"= {round(hours * 60)} GPU-minutes = {round(hours * 60 * shards)} "
                         f"shard-minutes (x {shards})")
    else:
        if limit % UNIT:
            notes.append(f"#   pool {pool.name} hands out whole GPUs: {_units(limit)} "
                         f"rounded down to {whole}")
        notes.append(f"#   pool {pool.name} is {pool.mode.value}: whole GPUs only, "
                     "gres/shard = 0")
        tres = [("gres/gpu", whole), ("gres/shard", 0)]
        mins = []
        if hours is not None:
            mins = [("gres/gpu", round(hours * 60))]
            notes.append(f"# GrpTRESMins: {field_path}.gpu_hours_per_month ({hours:g}) x 60 "
                         f"= {round(hours * 60)} GPU-minutes")
    if hours is None:
        notes.append(f"# GrpTRESMins: none ({field_path}.gpu_hours_per_month is not set)")
    return _TeamPoolLimit(tuple(tres), tuple(mins), tuple(notes))


def _team_total(limits: list[_TeamPoolLimit]) -> tuple[tuple[tuple[str, int], ...],
                                                      tuple[tuple[str, int], ...]]:
    """A team account's GrpTRES and GrpTRESMins: the sums of its pools' figures; a
    TRES-minutes sum only where every pool that has the TRES has a budget for it."""
    total: dict[str, int] = {}
    mins: dict[str, int] = {}
    unbounded: set[str] = set()
    for lim in limits:
        for name, value in lim.tres:
            total[name] = total.get(name, 0) + value
        given = dict(lim.tres_mins)
        for name, value in lim.tres:
            if value == 0:
                continue
            if name in given:
                mins[name] = mins.get(name, 0) + given[name]
            else:
                unbounded.add(name)
    return (tuple(total.items()),
            tuple((k, v) for k, v in mins.items() if k not in unbounded))


def _tres(items: tuple[tuple[str, int], ...], clear: tuple[str, ...]) -> str:
    """``gres/gpu=6,gres/shard=0``; TRES in ``clear`` but not in ``items`` get ``-1``
    (sacctmgr's "no limit"), so a second run removes a limit the policy dropped."""
    values = dict(items)
    return ",".join(f"{name}={values.get(name, -1)}" for name in clear)


class _Builder:
    def __init__(self, policy: Policy, shards: int, device: str) -> None:
        self.policy = policy
        self.shards = shards
        self.device = device
        section = getattr(policy, "slurm", None)
        named = getattr(section, "partition", None)
        self.default_partition = slurm_name(named) if named else None
        self.out = SlurmExport()

    # -- names -------------------------------------------------------------------------------

    def pools_with_nodes(self) -> list[Pool]:
        return [p for p in self.policy.pools if self.policy.nodes_in(p.name)]

    def team_quotas(self, team: Team) -> list[tuple[Pool, PoolQuota]]:
        found = []
        for pool_name, quota in team.quotas:
            pool = self.policy.pool(pool_name)
            if pool is not None:
                found.append((pool, quota))
        return found

    def team_qos(self, team: Team) -> list[str]:
        return [qos_name(c.name) for c in self.policy.priority_classes
                if team.may_use_priority(c.name)]

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
        budgets = any(q.gpu_hours_per_month is not None for t in policy.teams
                      for _, q in t.quotas)
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
            conf.append(f"# partition {partition_name(pool.name)}: the accounts of the teams "
                        f"with a quota in pools.{pool.name} (teams.*.quotas.{pool.name}), "
                        "per pool and the team's own")
            if pool.mode is SharingMode.DEBUG:
                conf.append("# (debug pool: no queue in the policy; Slurm queues, see the "
                            "header)")
            default = " Default=YES" if self.default_partition == partition_name(pool.name) \
                else ""
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
            conf.append(f"# partition {part}: slurm.partition, where the broker's jobs and "
                        "servers go (every node; the broker picks the node, --nodelist), "
                        "for the teams' own accounts")
            conf.append(
                f"PartitionName={conf_value(part, 'partition')} "
                f"Nodes={_ranges([conf_value(n.name, 'node') for n in policy.nodes])} "
                f"AllowAccounts={','.join(team_account(t.name) for t in teams) or 'NONE'} "
                "Default=YES MaxTime=INFINITE State=UP"
            )

    def gres_conf(self) -> None:
        gres = self.out.gres_conf
        for pool in self.pools_with_nodes():
            for node in self.policy.nodes_in(pool.name):
                if not node.gpus:
                    continue
                gres.append(f"# node {node.name} (pool {pool.name}): {len(node.gpus)} GPU(s), "
                            f"each {self.shards} shards")
                name = conf_value(node.name, "node")
                for gpu in node.gpus:
                    path = conf_value(self.device.format(node=node.name, index=gpu.index),
                                      "device")
                    gres.append(f"NodeName={name} Name=gpu File={path}")
                for gpu in node.gpus:
                    path = conf_value(self.device.format(node=node.name, index=gpu.index),
                                      "device")
                    gres.append(f"NodeName={name} Name=shard Count={self.shards} "
                                f"File={path}")

    def qos(self) -> None:
        cmds = self.out.sacctmgr
        cmds.append("# ---- QOS: one per priority class (priority_classes.*); all are added "
                    "first, as one may name another in Preempt")
        for cls in self.policy.priority_classes:
            cmds.append(sh("sacctmgr", "-i", "add", "qos", qos_name(cls.name)))
        for cls in self.policy.priority_classes:
            victims = [c for c in self.policy.priority_classes
                       if c.preemptible and c.value < cls.value]
            name = qos_name(cls.name)
            cmds.append(f"# {cls.name}: Priority from priority_classes.{cls.name}.value "
                        f"({cls.value}); GraceTime from .grace_period ({cls.grace_period_s}s)")
            cmds.append("#   Preempt: the preemptible classes of lower value ("
                        + (", ".join(f"{c.name}={c.value}" for c in victims) or "none") + ")")
            cmds.append(f"#   PreemptMode: .preemptible is {str(cls.preemptible).lower()}"
                        + (" -> requeue" if cls.preemptible else " -> the cluster's"))
            others = [qos_name(c.name) for c in self.policy.priority_classes if c is not cls]
            if victims:
                preempt = ["Preempt=" + ",".join(qos_name(c.name) for c in victims)]
            elif others:
                # preempts nobody: remove the others (Slurm 22.05's Preempt='' leaves a QOS
                # that makes every later Preempt= naming it fail with "loop detected")
                preempt = ["Preempt-=" + ",".join(others)]
            else:
                preempt = []
            mode = "requeue" if cls.preemptible else "cluster"
            cmds.append(sh("sacctmgr", "-i", "modify", "qos", "where", f"name={name}", "set",
                           f"Priority={cls.value}", *preempt, f"PreemptMode={mode}",
                           f"GraceTime={cls.grace_period_s}"))

    def accounts(self) -> None:
        policy = self.policy
        cmds = self.out.sacctmgr
        cmds += ["", f"# ---- accounts: the cohort {COHORT_ACCOUNT}, a team account per team "
                 "(teams.*), one per quota (teams.*.quotas.*)"]
        cmds.append(sh("sacctmgr", "-i", "add", "account", COHORT_ACCOUNT,
                       "Description=jupyter-gpushare", "Organization=jupyter-gpushare"))
        for team in policy.teams:
            qos = self.team_qos(team)
            qos_words = [f"QOS={','.join(qos)}"]
            default = self.default_qos(team)
            if default:
                qos_words.append(f"DefaultQOS={default}")
            source = ("teams." + team.name + ".priorities") if team.priorities is not None \
                else "every class (teams." + team.name + ".priorities not set)"
            account = team_account(team.name)
            cmds += ["", f"# team {team.name}: QOS from {source}: {', '.join(qos) or 'none'}"]
            limits = [(pool, _limit(team, pool, quota, self.shards))
                      for pool, quota in self.team_quotas(team)]
            total, total_mins = _team_total([lim for _, lim in limits])
            cmds.append(f"# GrpTRES: sum over teams.{team.name}.quotas.*: guaranteed + "
                        f"borrow_limit (the per-pool figures below); caps a job charged to "
                        f"account {account} itself (a backend passing the team as --account)")
            cmds.append(f"# GrpTRESMins: sum of teams.{team.name}.quotas.*.gpu_hours_per_month"
                        " x 60, only for a TRES every pool of the team budgets (else -1)")
            cmds.append(sh("sacctmgr", "-i", "add", "account", account,
                           f"parent={COHORT_ACCOUNT}", f"Description=team-{account}"))
            cmds.append(sh("sacctmgr", "-i", "modify", "account", "where", f"name={account}",
                           "set", *qos_words,
                           f"GrpTRES={_tres(total, ('gres/gpu', 'gres/shard'))}",
                           f"GrpTRESMins={_tres(total_mins, ('gres/gpu', 'gres/shard'))}"))
            for pool, limit in limits:
                sub = account_name(team.name, pool.name)
                cmds.append(f"# {team.name} in pool {pool.name}")
                cmds += list(limit.notes)
                cmds.append(sh("sacctmgr", "-i", "add", "account", sub, f"parent={account}",
                               f"Description=team-{account}-pool-{partition_name(pool.name)}"))
                mins = (_tres(limit.tres_mins, ("gres/gpu", "gres/shard")))
                cmds.append(sh("sacctmgr", "-i", "modify", "account", "where", f"name={sub}",
                               "set", *qos_words,
                               f"GrpTRES={_tres(limit.tres, ('gres/gpu', 'gres/shard'))}",
                               f"GrpTRESMins={mins}"))

    def default_qos(self, team: Team) -> str | None:
        """The team's default QOS: the lowest class it may use (a job that names none runs
        preemptible where the team may, never above what it asked)."""
        usable = [c for c in self.policy.priority_classes if team.may_use_priority(c.name)]
        if not usable:
            return None
        return qos_name(min(usable, key=lambda c: c.value).name)

    def users(self) -> None:
        cmds = self.out.sacctmgr
        cmds += ["", "# ---- users the policy names (teams.*.admins); other members: add them "
                 "the same way"]
        named = False
        for team in self.policy.teams:
            quotas = self.team_quotas(team)
            if not quotas:
                continue
            accounts = [account_name(team.name, p.name) for p, _ in quotas]
            for user in team.admins:
                named = True
                cmds.append(f"# {user}: teams.{team.name}.admins")
                cmds.append(sh("sacctmgr", "-i", "add", "user", slurm_name(user),
                               f"account={','.join(accounts)}", f"DefaultAccount={accounts[0]}"))
                for pool, quota in quotas:
                    cap = quota.per_user_cap_milli
                    sub = account_name(team.name, pool.name)
                    if cap is None:
                        tres = _tres((), ("gres/gpu", "gres/shard"))
                        cmds.append(f"# per_user_cap: teams.{team.name}.quotas.{pool.name}"
                                    ".per_user_cap not set")
                    elif pool.shares_gpus:
                        tres = _tres((("gres/gpu", cap // UNIT),
                                      ("gres/shard", _shards(cap, self.shards))),
                                     ("gres/gpu", "gres/shard"))
                        cmds.append(f"# per_user_cap: teams.{team.name}.quotas.{pool.name}"
                                    f".per_user_cap ({_units(cap)}) x {self.shards} shards")
                    else:
                        tres = _tres((("gres/gpu", cap // UNIT), ("gres/shard", 0)),
                                     ("gres/gpu", "gres/shard"))
                        cmds.append(f"# per_user_cap: teams.{team.name}.quotas.{pool.name}"
                                    f".per_user_cap ({_units(cap)}) whole GPUs")
                    cmds.append(sh("sacctmgr", "-i", "modify", "user", "where",
                                   f"name={slurm_name(user)}", f"account={sub}", "set",
                                   f"GrpTRES={tres}"))
        if not named:
            cmds.append("# (the policy names no users)")


def export_slurm(policy: Policy, *, shards_per_gpu: int | None = None,
                 device: str = "/dev/nvidia{index}") -> SlurmExport:
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
    builder.qos()
    builder.accounts()
    builder.users()
    return builder.out


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--format", choices=FORMATS, default="all",
                        help="conf: slurm.conf and gres.conf lines; sacctmgr: the accounts "
                             "and QOS as a shell script; all: both (default)")
    parser.add_argument("--shards-per-gpu", type=int, default=None,
                        help="shards per GPU (default: the policy's slurm.shards_per_gpu, "
                             f"else {DEFAULT_SHARDS_PER_GPU})")
    parser.add_argument("--gpu-device", default="/dev/nvidia{index}",
                        help="gres.conf File= of each GPU, with {node} and {index} "
                             "(default /dev/nvidia{index})")


def _render(policy: Any, args: argparse.Namespace) -> str:
    try:
        export = export_slurm(policy, shards_per_gpu=args.shards_per_gpu,
                              device=args.gpu_device)
    except ValueError as exc:  # a value Slurm's files cannot hold: say why, no traceback
        raise SystemExit(f"jupyter-gpushare export slurm: {exc}") from None
    return export.render(args.format)


exporter(Exporter(
    "slurm",
    "Slurm: gres.conf and node lines with GPU shards, a QOS per priority class, an account "
    "per team and quota with GrpTRES/GrpTRESMins, as slurm.conf text and sacctmgr commands",
    _arguments,
    _render,
))
