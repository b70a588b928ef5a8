"""Slurm's accounting and the broker's ledger agree on the GPU-hours of the same jobs (1 %).

Real parts on both sides: a Slurm cluster with slurmdbd configured by the policy's export
(``tests/slurmdb.py``) and the broker on its SQL database. Each job is admitted and placed by
the broker, submitted with its grant's GRES (whole GPUs, and quarter GPUs as shards) to the
export's account, partition and QOS on the grant's node, and its grant is released when it
leaves Slurm's queue (``tests/slurmledger.py``). ``sacct``'s elapsed x (gres/gpu + gres/shard /
shards per GPU) is compared with the ledger's units x (released - granted).

The ledger counts from the grant (before ``sbatch``) to the release (after Slurm says the job
ended): about half a second a job more than Slurm's run (its scheduler's start latency and the
poll); jobs of two minutes keep that under 1 %. Shorter jobs are in the benchmark
(``benchmarks/slurm_accounting.py --seconds 30``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from slurmdb import exported_cluster, have_slurmdbd
from slurmledger import compare, run_through_broker, wave

from jupyter_gpushare.broker.db import make_engine
from jupyter_gpushare.broker.service import Broker
from jupyter_gpushare.export.slurm import account_name
from jupyter_gpushare.policy import load_policy

POLICY = Path(__file__).resolve().parent / "data" / "slurm_policy.yaml"
SHARDS = 8
JOB_SECONDS = 120

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not have_slurmdbd(), reason="slurmctld/slurmdbd/mariadbd not on PATH "
                       "(apt-get install slurm-wlm slurmdbd munge mariadb-server)"),
]


@pytest.fixture
def cluster_and_broker(tmp_path: Path) -> Iterator[tuple[Any, Broker]]:
    policy = load_policy(POLICY)
    accounts = [account_name("vision", "train"), account_name("vision", "interactive"),
                account_name("nlp", "train")]
    with exported_cluster(policy, shards_per_gpu=SHARDS, gpus_per_node=2, cpus_per_node=4,
                          memory_mib=4000, users={"root": accounts}) as (cluster, _db, _e, _r):
        broker = Broker(policy, make_engine(f"sqlite:///{tmp_path}/broker.sqlite"))
        broker.load()
        try:
            yield cluster, broker
        finally:
            broker.close()


def test_sacct_and_the_ledger_agree_within_one_percent(
        cluster_and_broker: tuple[Any, Broker]) -> None:
    cluster, broker = cluster_and_broker
    ran = run_through_broker(cluster, broker, wave(JOB_SECONDS), SHARDS)
    assert {r.gres for r in ran} == {"gpu:1", "shard:2"}
    slurm, ledger, rows = compare(cluster, broker, ran, SHARDS)
    for job, in_slurm, in_ledger in rows:
        units = 1.0 if job.gres == "gpu:1" else 0.25
        # the grant covers the whole run (Slurm rounds its times to whole seconds) ...
        assert in_slurm <= in_ledger + units * 1.0, (job, in_slurm, in_ledger)
        # ... and is released within a few seconds of the job's end
        assert in_ledger - in_slurm <= units * 5.0, (job, in_slurm, in_ledger)
    print(f"Slurm {slurm:.2f} GPU-s, ledger {ledger:.2f} GPU-s, "
          f"ratio {ledger / slurm:.5f}")
    assert abs(ledger - slurm) <= 0.01 * slurm, (slurm, ledger, rows)
    # the ledger's own per-team figures hold the same GPU-hours
    by_team = broker.gpu_hours_between(0, 4e9)
    assert sum(by_team.values()) * 3600 == pytest.approx(ledger, rel=1e-6)
    assert set(by_team) == {("vision", "train"), ("nlp", "train"), ("vision", "interactive")}
