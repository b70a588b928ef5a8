"""``jupyter-gpushare export slurm``: every number from the policy, on several policies.

Pure tests (no Slurm needed): the exported node lines, GRES, QOS and accounts are parsed back
and compared with figures computed here from the policy's own fields; a change in the policy
changes the output. The real cluster test (``test_export_slurm_cluster.py``) feeds the same
output to slurmctld and slurmdbd.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from jupyter_gpushare import cli
from jupyter_gpushare.core.model import UNIT, Policy
from jupyter_gpushare.export.slurm import (
    COHORT_ACCOUNT,
    SlurmExport,
    account_name,
    export_slurm,
)
from jupyter_gpushare.policy import parse_policy

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "hub_config" / "gpushare.yaml"
POLICIES = [EXAMPLE, ROOT / "tests" / "data" / "jobs_policy.yaml",
            ROOT / "tests" / "data" / "lab_policy.yaml",
            ROOT / "tests" / "data" / "slurm_policy.yaml"]


def load(path: Path) -> Policy:
    return parse_policy(path.read_text(), str(path))


def settings(command: str) -> dict[str, str]:
    """``KEY=VALUE`` words of a command after its ``set`` (or all of them) as a dict."""
    words = shlex.split(command)
    if "set" in words:
        words = words[words.index("set") + 1:]
    return dict(w.split("=", 1) for w in words if "=" in w)


def tres(text: str) -> dict[str, int]:
    return {k: int(v) for k, v in (item.split("=") for item in text.split(","))}


def modify(export: SlurmExport, kind: str, name: str) -> dict[str, str]:
    found = [c for c in export.commands()
             if c.startswith(f"sacctmgr -i modify {kind} where name={name} ")]
    assert len(found) == 1, (kind, name, found)
    return settings(found[0])


def conf(export: SlurmExport) -> dict[str, str]:
    return dict(line.split("=", 1) for line in export.slurm_conf
                if line and not line.startswith(("#", "NodeName=", "PartitionName=")))


@pytest.mark.parametrize("path", POLICIES, ids=lambda p: p.name)
def test_nodes_gres_and_partitions_follow_the_inventory(path: Path) -> None:
    policy = load(path)
    export = export_slurm(policy, shards_per_gpu=8)
    nodes = {m.group(1): m.group(0) for line in export.slurm_conf
             if (m := re.match(r"NodeName=(\S+) .*", line))}
    assert set(nodes) == {n.name for n in policy.nodes}
    for node in policy.nodes:
        gpus = len(node.gpus)
        assert f" Gres=gpu:{gpus},shard:{gpus * 8} " in nodes[node.name]
        assert f" CPUs={node.cpu_milli // 1000} " in nodes[node.name]
        assert f" RealMemory={node.memory_mib} " in nodes[node.name]
        gres = [g for g in export.gres_conf if g.startswith(f"NodeName={node.name} ")]
        assert len([g for g in gres if "Name=gpu " in g]) == gpus
        assert len([g for g in gres if "Name=shard Count=8 " in g]) == gpus
    parts = {m.group(1): settings(line) for line in export.slurm_conf
             if (m := re.match(r"PartitionName=(\S+) ", line))}
    for pool in policy.pools:
        if not policy.nodes_in(pool.name):
            continue
        part = parts[pool.name]
        assert part["Nodes"].split(",") == [n.name for n in policy.nodes_in(pool.name)]
        # only the teams with a quota in the pool may submit there
        assert set(part["AllowAccounts"].split(",")) == {
            account_name(t.name, pool.name) for t in policy.teams if t.quota(pool.name)} | {
            t.name for t in policy.teams if t.quota(pool.name)}


@pytest.mark.parametrize("path", POLICIES, ids=lambda p: p.name)
def test_qos_per_priority_class(path: Path) -> None:
    policy = load(path)
    export = export_slurm(policy)
    top = max(c.value for c in policy.priority_classes)
    assert conf(export)["PriorityWeightQOS"] == str(top)
    assert conf(export)["PreemptType"] == "preempt/qos"
    for cls in policy.priority_classes:
        qos = modify(export, "qos", cls.name)
        assert qos["Priority"] == str(cls.value)
        assert qos["GraceTime"] == str(cls.grace_period_s)
        assert qos["PreemptMode"] == ("requeue" if cls.preemptible else "cluster")
        victims = {c.name for c in policy.priority_classes
                   if c.preemptible and c.value < cls.value}
        if victims:
            assert set(qos["Preempt"].split(",")) == victims
        else:  # cleared by removing every other class (see export_slurm's comment)
            assert set(qos["Preempt-"].split(",")) == {
                c.name for c in policy.priority_classes if c is not cls}


@pytest.mark.parametrize("path", POLICIES, ids=lambda p: p.name)
def test_accounts_carry_guarantee_plus_borrow_and_budget(path: Path) -> None:
    policy = load(path)
    shards = 4
    export = export_slurm(policy, shards_per_gpu=shards)
    cmds = export.commands()
    assert f"sacctmgr -i add account {COHORT_ACCOUNT} " in "\n".join(cmds)
    for team in policy.teams:
        top = modify(export, "account", team.name)
        # the team's own account: the sum over its pools
        whole = sum((q.guaranteed_milli + q.borrow_limit_milli) // UNIT for _, q in team.quotas)
        shared = sum(-(-(q.guaranteed_milli + q.borrow_limit_milli) * shards // UNIT)
                     for p, q in team.quotas if policy.pool(p).shares_gpus)  # type: ignore
        assert tres(top["GrpTRES"]) == {"gres/gpu": whole, "gres/shard": shared}
        assert set(top["QOS"].split(",")) == {c.name for c in policy.priority_classes
                                               if team.may_use_priority(c.name)}
        assert f"sacctmgr -i add account {team.name} parent={COHORT_ACCOUNT} " in "\n".join(cmds)
        for pool_name, quota in team.quotas:
            pool = policy.pool(pool_name)
            assert pool is not None
            sub = account_name(team.name, pool_name)
            acct = modify(export, "account", sub)
            limit = quota.guaranteed_milli + quota.borrow_limit_milli
            got = tres(acct["GrpTRES"])
            if pool.shares_gpus:
                assert got == {"gres/gpu": limit // UNIT, "gres/shard": -(-limit * shards // UNIT)}
            else:
                assert got == {"gres/gpu": limit // UNIT, "gres/shard": 0}
            mins = tres(acct["GrpTRESMins"])
            hours = quota.gpu_hours_per_month
            if hours is None:
                assert mins == {"gres/gpu": -1, "gres/shard": -1}
            else:
                assert mins["gres/gpu"] == round(hours * 60)
                assert mins["gres/shard"] == (round(hours * 60 * shards) if pool.shares_gpus
                                              else -1)
            assert f"add account {sub} parent={team.name} " in "\n".join(cmds)


def test_example_policy_figures() -> None:
    """Figures read off hub_config/gpushare.yaml by hand (vision: train 4 + 2, interactive
    1.5 + 1 at 8 shards a GPU, 2000 GPU-hours a month in train)."""
    export = export_slurm(load(EXAMPLE), shards_per_gpu=8)
    train = modify(export, "account", "vision_train")
    assert train["GrpTRES"] == "gres/gpu=6,gres/shard=0"
    assert train["GrpTRESMins"] == "gres/gpu=120000,gres/shard=-1"
    inter = modify(export, "account", "vision_interactive")
    assert inter["GrpTRES"] == "gres/gpu=2,gres/shard=20"
    assert modify(export, "qos", "training")["Preempt"] == "research"
    assert modify(export, "qos", "research")["PreemptMode"] == "requeue"
    assert "NodeName=train-0 CPUs=112 RealMemory=2097152 Gres=gpu:4,shard:32" in "\n".join(
        export.slurm_conf)
    # users the policy names: the team admins, with their per-user cap
    alice = [c for c in export.commands() if "where name=alice account=vision_debug" in c]
    assert alice and "GrpTRES=gres/gpu=0,gres/shard=1" in alice[0]


def test_a_change_in_the_policy_changes_the_output() -> None:
    text = EXAMPLE.read_text()
    base = export_slurm(parse_policy(text, "a.yaml"), shards_per_gpu=8)
    more = text.replace("train:       {guaranteed: 4,   borrow_limit: 2,",
                        "train:       {guaranteed: 4,   borrow_limit: 3,")
    assert more != text
    changed = export_slurm(parse_policy(more, "b.yaml"), shards_per_gpu=8)
    assert modify(base, "account", "vision_train")["GrpTRES"] == "gres/gpu=6,gres/shard=0"
    assert modify(changed, "account", "vision_train")["GrpTRES"] == "gres/gpu=7,gres/shard=0"
    # the team's priorities become its QOS list
    limited = text.replace("    # priorities: [interactive, research]",
                           "    priorities: [interactive, research]")
    assert limited != text
    qos = modify(export_slurm(parse_policy(limited, "c.yaml")), "account", "research_train")
    assert qos["QOS"] == "interactive,research"
    # a grace period becomes the QOS's GraceTime
    grace = text.replace("grace_period: 2m", "grace_period: 7m")
    assert modify(export_slurm(parse_policy(grace, "d.yaml")), "qos", "research")[
        "GraceTime"] == "420"
    # shards per GPU scale every shard figure
    sixteen = export_slurm(parse_policy(text, "e.yaml"), shards_per_gpu=16)
    assert modify(sixteen, "account", "vision_interactive")["GrpTRES"] == \
        "gres/gpu=2,gres/shard=40"


def test_every_limit_names_its_policy_field() -> None:
    export = export_slurm(load(EXAMPLE))
    lines = export.sacctmgr
    for i, line in enumerate(lines):
        if line.startswith("sacctmgr -i modify account") and "GrpTRES=" in line:
            account = settings(line)
            block = "\n".join(lines[max(0, i - 6):i])
            assert "guaranteed" in block and "borrow_limit" in block, line
            assert "gpu_hours_per_month" in block, line
            assert account["GrpTRES"]
        if line.startswith("sacctmgr -i modify qos"):
            block = "\n".join(lines[max(0, i - 4):i])
            assert "priority_classes." in block and ".grace_period" in block, line
    text = export.render("all")
    for gap in ("Borrowing", "debug pool", "--immediate", "guarantee"):
        assert gap in text  # the header says what Slurm cannot express


def test_formats_and_the_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["export", "slurm", str(EXAMPLE), "--format", "sacctmgr"]) == 0
    script = capsys.readouterr().out
    assert script.startswith("#!/bin/sh\n")
    assert "sacctmgr -i add qos training" in script and "NodeName=" not in script
    assert cli.main(["export", "slurm", str(EXAMPLE), "--format", "conf",
                     "--shards-per-gpu", "4"]) == 0
    text = capsys.readouterr().out
    assert "Gres=gpu:4,shard:16" in text and "sacctmgr -i" not in text
    out = tmp_path / "slurm.txt"
    assert cli.main(["export", "slurm", str(EXAMPLE), "-o", str(out)]) == 0
    written = out.read_text()
    assert "slurm.conf" in written and "gres.conf" in written and "sacctmgr -i" in written
    with pytest.raises(ValueError, match="format"):
        export_slurm(load(EXAMPLE)).render("yaml")


def test_idempotent_add_then_modify() -> None:
    """Every entity is added, then its values set by a modify (a re-run converges)."""
    cmds = export_slurm(load(EXAMPLE)).commands()
    added = [shlex.split(c)[3:5] for c in cmds if c.startswith("sacctmgr -i add ")]
    for kind, name in added:
        if kind == "account" and name == COHORT_ACCOUNT:
            continue
        assert any(c.startswith(f"sacctmgr -i modify {kind} where name={name} ") for c in cmds)


def test_the_policys_slurm_section() -> None:
    text = EXAMPLE.read_text() + "\nslurm:\n  shards_per_gpu: 4\n  partition: gpushare\n"
    export = export_slurm(parse_policy(text, "s.yaml"))
    assert modify(export, "account", "vision_interactive")["GrpTRES"] == \
        "gres/gpu=2,gres/shard=10"
    assert "NodeName=lab-0 CPUs=112 RealMemory=2097152 Gres=gpu:4,shard:16" in "\n".join(
        export.slurm_conf)
    # a per-user cap of 1/8 GPU at 4 shards a GPU is 1 shard (rounded up), not 0
    bob = [c for c in export.commands() if "where name=bob account=nlp_debug" in c]
    assert "GrpTRES=gres/gpu=0,gres/shard=1" in bob[0]
    part = [line for line in export.slurm_conf if line.startswith("PartitionName=gpushare ")]
    assert len(part) == 1 and "Default=YES" in part[0]
    assert settings(part[0])["AllowAccounts"] == "vision,nlp,research"
    assert settings(part[0])["Nodes"].split(",") == [
        n.name for n in parse_policy(text, "s.yaml").nodes]
    # the argument still wins over the policy
    assert "shard:32" in "\n".join(export_slurm(parse_policy(text, "s.yaml"),
                                                shards_per_gpu=8).slurm_conf)
