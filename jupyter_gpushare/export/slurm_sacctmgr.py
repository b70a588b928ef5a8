"""The ``sacctmgr`` part of ``export slurm``: a QOS per priority class, the cohort account, an
account per team and per (team, pool) quota with its limits, and the users the policy names,
as idempotent commands (every ``add`` followed by a ``modify``). Pure (no I/O).

A part the export's builder in :mod:`.slurm` holds: it is handed the policy and the shards per
GPU, fills its own :attr:`SacctmgrPart.lines`, and the builder copies them into the
:class:`~.slurm_result.SlurmExport`.
"""

from __future__ import annotations

from ..core.model import UNIT, Policy, Pool, PoolQuota, Team
from .slurm_limits import _limit, _shards, _team_total, _tres, _units
from .slurm_names import (
    COHORT_ACCOUNT,
    account_name,
    partition_name,
    qos_name,
    sh,
    slurm_name,
    team_account,
)


class SacctmgrPart:
    """The accounts, QOS and users of the export, as ``sacctmgr`` lines of its own."""

    def __init__(self, policy: Policy, shards: int) -> None:
        self.policy = policy
        self.shards = shards
        self.lines: list[str] = []

    def build(self) -> list[str]:
        """The QOS, then the accounts, then the users (see the module docstring)."""
        self.qos()
        self.accounts()
        self.users()
        return self.lines

    def team_quotas(self, team: Team) -> list[tuple[Pool, PoolQuota]]:
        found = []
        for pool_name, quota in team.quotas:
            pool = self.policy.pool(pool_name)
            if pool is not None:
                found.append((pool, quota))
        return found

    def team_qos(self, team: Team) -> list[str]:
        return [
            qos_name(c.name) for c in self.policy.priority_classes if team.may_use_priority(c.name)
        ]

    def qos(self) -> None:
        cmds = self.lines
        cmds.append(
            "# ---- QOS: one per priority class (priority_classes.*); all are added "
            "first, as one may name another in Preempt"
        )
        for cls in self.policy.priority_classes:
            cmds.append(sh("sacctmgr", "-i", "add", "qos", qos_name(cls.name)))
        for cls in self.policy.priority_classes:
            victims = [
                c for c in self.policy.priority_classes if c.preemptible and c.value < cls.value
            ]
            name = qos_name(cls.name)
            cmds.append(
                f"# {cls.name}: Priority from priority_classes.{cls.name}.value "
                f"({cls.value}); GraceTime from .grace_period ({cls.grace_period_s}s)"
            )
            cmds.append(
                "#   Preempt: the preemptible classes of lower value ("
                + (", ".join(f"{c.name}={c.value}" for c in victims) or "none")
                + ")"
            )
            cmds.append(
                f"#   PreemptMode: .preemptible is {str(cls.preemptible).lower()}"
                + (" -> requeue" if cls.preemptible else " -> the cluster's")
            )
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
            cmds.append(
                sh(
                    "sacctmgr",
                    "-i",
                    "modify",
                    "qos",
                    "where",
                    f"name={name}",
                    "set",
                    f"Priority={cls.value}",
                    *preempt,
                    f"PreemptMode={mode}",
                    f"GraceTime={cls.grace_period_s}",
                )
            )

    def accounts(self) -> None:
        policy = self.policy
        cmds = self.lines
        cmds += [
            "",
            f"# ---- accounts: the cohort {COHORT_ACCOUNT}, a team account per team "
            "(teams.*), one per quota (teams.*.quotas.*)",
        ]
        cmds.append(
            sh(
                "sacctmgr",
                "-i",
                "add",
                "account",
                COHORT_ACCOUNT,
                "Description=jupyter-gpushare",
                "Organization=jupyter-gpushare",
            )
        )
        for team in policy.teams:
            qos = self.team_qos(team)
            qos_words = [f"QOS={','.join(qos)}"]
            default = self.default_qos(team)
            if default:
                qos_words.append(f"DefaultQOS={default}")
            source = (
                ("teams." + team.name + ".priorities")
                if team.priorities is not None
                else "every class (teams." + team.name + ".priorities not set)"
            )
            account = team_account(team.name)
            cmds += ["", f"# team {team.name}: QOS from {source}: {', '.join(qos) or 'none'}"]
            limits = [
                (pool, _limit(team, pool, quota, self.shards))
                for pool, quota in self.team_quotas(team)
            ]
            total, total_mins = _team_total([lim for _, lim in limits])
            cmds.append(
                f"# GrpTRES: sum over teams.{team.name}.quotas.*: guaranteed + "
                f"borrow_limit (the per-pool figures below); caps a job charged to "
                f"account {account} itself (a backend passing the team as --account)"
            )
            cmds.append(
                f"# GrpTRESMins: sum of teams.{team.name}.quotas.*.gpu_hours_per_month"
                " x 60, only for a TRES every pool of the team budgets (else -1)"
            )
            cmds.append(
                sh(
                    "sacctmgr",
                    "-i",
                    "add",
                    "account",
                    account,
                    f"parent={COHORT_ACCOUNT}",
                    f"Description=team-{account}",
                )
            )
            cmds.append(
                sh(
                    "sacctmgr",
                    "-i",
                    "modify",
                    "account",
                    "where",
                    f"name={account}",
                    "set",
                    *qos_words,
                    f"GrpTRES={_tres(total, ('gres/gpu', 'gres/shard'))}",
                    f"GrpTRESMins={_tres(total_mins, ('gres/gpu', 'gres/shard'))}",
                )
            )
            for pool, limit in limits:
                sub = account_name(team.name, pool.name)
                cmds.append(f"# {team.name} in pool {pool.name}")
                cmds += list(limit.notes)
                cmds.append(
                    sh(
                        "sacctmgr",
                        "-i",
                        "add",
                        "account",
                        sub,
                        f"parent={account}",
                        f"Description=team-{account}-pool-{partition_name(pool.name)}",
                    )
                )
                mins = _tres(limit.tres_mins, ("gres/gpu", "gres/shard"))
                cmds.append(
                    sh(
                        "sacctmgr",
                        "-i",
                        "modify",
                        "account",
                        "where",
                        f"name={sub}",
                        "set",
                        *qos_words,
                        f"GrpTRES={_tres(limit.tres, ('gres/gpu', 'gres/shard'))}",
                        f"GrpTRESMins={mins}",
                    )
                )

    def default_qos(self, team: Team) -> str | None:
        """The team's default QOS: the lowest class it may use (a job that names none runs
        preemptible where the team may, never above what it asked)."""
        usable = [c for c in self.policy.priority_classes if team.may_use_priority(c.name)]
        if not usable:
            return None
        return qos_name(min(usable, key=lambda c: c.value).name)

    def users(self) -> None:
        cmds = self.lines
        cmds += [
            "",
            "# ---- users the policy names (teams.*.admins); other members: add them the same way",
        ]
        named = False
        for team in self.policy.teams:
            quotas = self.team_quotas(team)
            if not quotas:
                continue
            accounts = [account_name(team.name, p.name) for p, _ in quotas]
            for user in team.admins:
                named = True
                cmds.append(f"# {user}: teams.{team.name}.admins")
                cmds.append(
                    sh(
                        "sacctmgr",
                        "-i",
                        "add",
                        "user",
                        slurm_name(user),
                        f"account={','.join(accounts)}",
                        f"DefaultAccount={accounts[0]}",
                    )
                )
                for pool, quota in quotas:
                    cap = quota.per_user_cap_milli
                    sub = account_name(team.name, pool.name)
                    if cap is None:
                        tres = _tres((), ("gres/gpu", "gres/shard"))
                        cmds.append(
                            f"# per_user_cap: teams.{team.name}.quotas.{pool.name}"
                            ".per_user_cap not set"
                        )
                    elif pool.shares_gpus:
                        tres = _tres(
                            (("gres/gpu", cap // UNIT), ("gres/shard", _shards(cap, self.shards))),
                            ("gres/gpu", "gres/shard"),
                        )
                        cmds.append(
                            f"# per_user_cap: teams.{team.name}.quotas.{pool.name}"
                            f".per_user_cap ({_units(cap)}) x {self.shards} shards"
                        )
                    else:
                        tres = _tres(
                            (("gres/gpu", cap // UNIT), ("gres/shard", 0)),
                            ("gres/gpu", "gres/shard"),
                        )
                        cmds.append(
                            f"# per_user_cap: teams.{team.name}.quotas.{pool.name}"
                            f".per_user_cap ({_units(cap)}) whole GPUs"
                        )
                    cmds.append(
                        sh(
                            "sacctmgr",
                            "-i",
                            "modify",
                            "user",
                            "where",
                            f"name={slurm_name(user)}",
                            f"account={sub}",
                            "set",
                            f"GrpTRES={tres}",
                        )
                    )
        if not named:
            cmds.append("# (the policy names no users)")
