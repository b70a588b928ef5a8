"""The Slurm export fed to a real cluster with accounting: Slurm refuses what the policy refuses.

A real ``slurmctld`` with three ``slurmd`` nodes in network namespaces (``tests/slurmcluster.py``)
and a real ``slurmdbd`` on a private MariaDB (``tests/slurmdb.py``) get the export of
``tests/data/slurm_policy.yaml``: its ``slurm.conf`` lines (partitions, priority, preemption,
enforcement), its ``gres.conf`` and its ``sacctmgr`` commands. Then, for each case, the pure
core says what the policy decides and Slurm is shown to decide the same:

* a job inside its team's limit is accepted and runs;
* a job over the team's guarantee + borrow limit is held (``AssocGrpGRES``) as the broker
  queues it; an account the policy has no such team for, a QOS the team may not use and a
  pool the team has no quota in are refused at submission;
* a training job preempts (requeues) a research job as the policy's preemption rules say.
"""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from slurmdb import exported_cluster, have_slurmdbd
from slurmjobs import cancel, job, submit, wait_job

from jupyter_gpushare.core.admission import Outcome, decide
from jupyter_gpushare.core.model import GPUAsk, Kind, Policy, Request
from jupyter_gpushare.core.rules import check_request
from jupyter_gpushare.core.state import ClusterState
from jupyter_gpushare.export.slurm import SlurmExport, account_name
from jupyter_gpushare.policy import load_policy

POLICY = Path(__file__).resolve().parent / "data" / "slurm_policy.yaml"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not have_slurmdbd(), reason="slurmctld/slurmdbd/mariadbd not on PATH "
                       "(apt-get install slurm-wlm slurmdbd munge mariadb-server)"),
]


def apply(cluster: Any, export: SlurmExport) -> list[subprocess.CompletedProcess[str]]:
    return [cluster.run(*shlex.split(cmd), check=False) for cmd in export.commands()]


class Exported:
    def __init__(self, cluster: Any, db: Any, policy: Policy, export: SlurmExport) -> None:
        self.cluster = cluster
        self.db = db
        self.policy = policy
        self.export = export
        self.first_run: list[subprocess.CompletedProcess[str]] = []


@pytest.fixture(scope="module")
def exported() -> Iterator[Exported]:
    policy = load_policy(POLICY)
    # the user running the tests' jobs, in the accounts it submits to (the policy names only
    # team admins; members are added like this)
    accounts = [account_name("vision", "train"), account_name("vision", "interactive"),
                account_name("nlp", "train"), "vision", "nlp"]
    with exported_cluster(policy, shards_per_gpu=8, gpus_per_node=2, cpus_per_node=4,
                          memory_mib=4000, users={"root": accounts}) as (
                              cluster, db, export, results):
        state = Exported(cluster, db, policy, export)
        state.first_run = results
        yield state


def core_decision(policy: Policy, team: str, pool: str, gpu: GPUAsk, priority: str,
                  grants: tuple[Any, ...] = ()) -> tuple[str, str]:
    """What the broker's pure core says of this ask: (outcome, code)."""
    refusal = check_request(policy, user_teams=[team] if policy.team(team) else [], team=team,
                            profile=None, explicit_pool=pool, priority=priority,
                            is_admin=False)
    if refusal is not None:
        return "refused", refusal.code
    request = Request(id="r", user="u", team=team, pool=pool, gpu=gpu, priority=priority,
                      kind=Kind.BATCH, max_runtime_s=600)  # as the jobs' --time=10
    decision = decide(ClusterState(policy, list(grants)), request, "g")
    return decision.outcome.value, decision.code


def test_nodes_match_and_commands_apply(exported: Exported) -> None:
    # the cluster's node lines carry the GRES the export says for the same nodes
    conf = Path(exported.cluster.conf_path).read_text()
    for line in exported.export.slurm_conf:
        if line.startswith("NodeName="):
            name = line.split()[0]
            gres = next(w for w in line.split() if w.startswith("Gres="))
            assert any(c.startswith(name + " ") and gres in c for c in conf.splitlines()), line
    failed = [r for r in exported.first_run if r.returncode != 0]
    assert not failed, [(r.args, r.stdout, r.stderr) for r in failed]
    assoc = exported.cluster.run("sacctmgr", "-nP", "show", "assoc",
                                 "format=account,user,grptres,grptresmins,qos").stdout
    rows = {tuple(r.split("|")[:2]): r.split("|")[2:] for r in assoc.splitlines()}
    assert rows[("vision_train", "")][0] == "gres/gpu=2,gres/shard=0"
    assert rows[("vision_train", "")][1] == "gres/gpu=6000"
    assert rows[("vision_interactive", "")][0] == "gres/gpu=0,gres/shard=4"
    assert sorted(rows[("nlp_train", "")][2].split(",")) == ["interactive", "research"]
    # running the commands again changes nothing (adds say so, modifies set the same values)
    again = apply(exported.cluster, exported.export)
    assert all(r.returncode == 0 for r in again if " modify " in " ".join(r.args))
    assert exported.cluster.run("sacctmgr", "-nP", "show", "assoc",
                                "format=account,user,grptres,grptresmins,qos").stdout == assoc


def test_a_job_inside_the_limit_runs(exported: Exported) -> None:
    c = exported.cluster
    assert core_decision(exported.policy, "vision", "train", GPUAsk(whole=1),
                         "research")[0] == Outcome.GRANTED.value
    sub = submit(c, "-A", "vision_train", "-p", "train", "--qos=research", "--gres=gpu:1",
                 wrap="sleep 1")
    assert sub.job_id, sub.error
    wait_job(c, sub.job_id, lambda j: j["JobState"] == "COMPLETED", what="completed")
    shard = submit(c, "-A", "vision_interactive", "-p", "interactive", "--qos=interactive",
                   "--gres=shard:2", wrap="sleep 1")
    assert shard.job_id, shard.error
    wait_job(c, shard.job_id, lambda j: j["JobState"] == "COMPLETED", what="completed")


def test_over_the_team_limit_is_held_as_the_broker_queues_it(exported: Exported) -> None:
    c, policy = exported.cluster, exported.policy
    # nlp: guarantee 1 + borrow 0 in train; two GPUs at once is over the limit
    assert core_decision(policy, "nlp", "train", GPUAsk(whole=2), "research") == (
        "queued", "quota")
    over = submit(c, "-A", "nlp_train", "-p", "train", "--qos=research", "--gres=gpu:2")
    try:
        assert over.job_id, over.error
        held = wait_job(c, over.job_id, lambda j: j.get("Reason") == "AssocGrpGRES",
                        timeout=30, what="held for AssocGrpGRES")
        assert held["JobState"] == "PENDING"
    finally:
        cancel(c, over.job_id)
    # vision: shards in the interactive pool, guarantee 1/4 + borrow 1/4 = 4 shards
    assert core_decision(policy, "vision", "interactive", GPUAsk(fraction_milli=625),
                         "interactive") == ("queued", "quota")
    shards = submit(c, "-A", "vision_interactive", "-p", "interactive", "--qos=interactive",
                    "--gres=shard:5")
    try:
        assert shards.job_id, shards.error
        wait_job(c, shards.job_id, lambda j: j.get("Reason") == "AssocGrpGRES", timeout=30,
                 what="held for AssocGrpGRES")
    finally:
        cancel(c, shards.job_id)


def test_what_the_policy_refuses_slurm_refuses(exported: Exported) -> None:
    c, policy = exported.cluster, exported.policy
    # a QOS the team may not use (nlp may never use the training class)
    assert core_decision(policy, "nlp", "train", GPUAsk(whole=1), "training") == (
        "refused", "priority_not_allowed")
    qos = submit(c, "-A", "nlp_train", "-p", "train", "--qos=training", "--gres=gpu:1")
    assert qos.job_id is None and "qos" in qos.error.lower(), qos
    # a team the policy does not know: no account
    assert core_decision(policy, "ghost", "train", GPUAsk(whole=1), "research")[0] == "refused"
    ghost = submit(c, "-A", "ghost_train", "-p", "train", "--qos=research", "--gres=gpu:1")
    assert ghost.job_id is None and "account" in ghost.error.lower(), ghost
    # a pool the team has no quota in: nlp in the interactive pool
    assert core_decision(policy, "nlp", "interactive", GPUAsk(fraction_milli=250),
                         "interactive")[0] == "refused"
    pool = submit(c, "-A", "nlp_train", "-p", "interactive", "--qos=interactive",
                  "--gres=shard:2")
    try:
        if pool.job_id is not None:  # Slurm takes it, then never runs it
            held = wait_job(c, pool.job_id, lambda j: j.get("Reason") not in ("None", ""),
                            timeout=30, what="held")
            assert held["JobState"] == "PENDING", held
            assert "account_not_permitted_to_use_this_partition" in held["Reason"], held
        else:
            assert "account" in pool.error.lower(), pool
    finally:
        cancel(c, pool.job_id)
    # fractions in the exclusive training pool (whole GPUs only): shards are capped at 0
    frac = submit(c, "-A", "vision_train", "-p", "train", "--qos=research", "--gres=shard:2")
    try:
        if frac.job_id:
            wait_job(c, frac.job_id, lambda j: j.get("Reason") == "AssocGrpGRES", timeout=30,
                     what="held for AssocGrpGRES")
    finally:
        cancel(c, frac.job_id)


def test_a_higher_class_preempts_a_preemptible_one(exported: Exported) -> None:
    c = exported.cluster
    # node1 (the training pool, 2 GPUs) full of research jobs of both teams
    low = [submit(c, "-A", acct, "-p", "train", "--qos=research", "--gres=gpu:1", "--requeue")
           for acct in ("nlp_train", "vision_train")]
    high = None
    try:
        for sub in low:
            assert sub.job_id, sub.error
            wait_job(c, sub.job_id, lambda j: j["JobState"] == "RUNNING", what="running")
        # the policy: training (1000) may preempt research (100, preemptible); research is
        # requeued (PreemptMode=requeue) so it resumes
        high = submit(c, "-A", "vision_train", "-p", "train", "--qos=training", "--gres=gpu:1")
        assert high.job_id, high.error
        wait_job(c, high.job_id, lambda j: j["JobState"] == "RUNNING", timeout=60,
                 what="running by preemption")
        states = {s.job_id: job(c, s.job_id) for s in low if s.job_id}
        requeued = [j for j in states.values() if int(j.get("Restarts", "0")) >= 1
                    or j["JobState"] in ("PENDING", "REQUEUED", "PREEMPTED")]
        assert len(requeued) == 1, states
    finally:
        cancel(c, *(s.job_id for s in low), high.job_id if high else None)
