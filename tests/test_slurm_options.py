"""The pure part of the Slurm spawner: grant -> sbatch options and script, squeue -> progress.
No cluster needed (the real one is in test_spawner_slurm_hub.py)."""

from __future__ import annotations

import pytest
from batchspawner import SlurmSpawner, format_template

from jupyter_gpushare.broker.client import GPUShare, GrantInfo
from jupyter_gpushare.spawner import enforcement
from jupyter_gpushare.spawner.slurm_options import (
    JobQueueStatus,
    SlurmRequest,
    SlurmRequestError,
    add_directives,
    parse_job_status,
    queue_message,
    queue_position,
    shards_for,
    slurm_request,
    slurm_time,
)


def grant(units: float, gpus: int = 1, **kw) -> GrantInfo:
    share = min(units, 1.0)
    shares = tuple(
        GPUShare(f"GPU-node1-{i}", int(81920 * share), 100 * share, "H200", False, 81920)
        for i in range(gpus)
    )
    base = dict(id="g1", user="alice", team="vision", pool="interactive", profile="p",
                node="node1", gpus=shares, units=units, priority="interactive")
    base.update(kw)
    return GrantInfo(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("units", "gpus", "spg", "gres"),
    [
        (0.125, 1, 8, "shard:1"),
        (0.25, 1, 8, "shard:2"),
        (0.5, 1, 8, "shard:4"),
        (0.3, 1, 8, "shard:3"),  # rounded up: never less than granted
        (0.25, 1, 4, "shard:1"),
        (0.99, 1, 8, "shard:8"),
        (1.0, 1, 8, "gpu:1"),
        (2.0, 2, 8, "gpu:2"),
        (4.0, 4, 16, "gpu:4"),
    ],
)
def test_gres_from_the_grant(units, gpus, spg, gres):
    assert slurm_request(grant(units, gpus), shards_per_gpu=spg).gres == gres


def test_shards_for_rounds_up_and_refuses_nonsense():
    assert shards_for(1 / 8, 8) == 1
    assert shards_for(1 / 3, 8) == 3
    assert shards_for(0.0001, 8) == 1
    with pytest.raises(SlurmRequestError) as err:
        shards_for(0.5, 0)
    assert err.value.field == "shards_per_gpu"


def test_a_grant_slurm_could_never_run_is_refused_before_submitting():
    with pytest.raises(SlurmRequestError) as err:
        slurm_request(grant(1.5, 1))  # more shards than one GPU has: pends forever in Slurm
    assert err.value.field == "shards" and "12 shards but one GPU has 8" in str(err.value)
    with pytest.raises(SlurmRequestError) as err:
        slurm_request(grant(1.5, 2))  # neither whole GPUs nor a fraction of one
    assert err.value.field == "units" and "1.5" in str(err.value)
    with pytest.raises(SlurmRequestError) as err:
        slurm_request(grant(0.5, 0))
    assert err.value.field == "gpus"


def test_account_qos_node_partition_time():
    req = slurm_request(grant(0.25), partition="gpu", max_lifetime_s=8 * 3600)
    assert req.options() == {
        "--gres": "shard:2", "--account": "vision_interactive", "--qos": "interactive",
        "--nodelist": "node1", "--partition": "gpu", "--time": "08:00:00",
        "--no-requeue": "",
    }
    assert req.args()[0] == "--gres=shard:2" and req.args()[-1] == "--no-requeue"
    # templates and switches
    req = slurm_request(grant(1.0), account_template="{team}", qos_template="",
                        pin_node=False)
    assert req.account == "vision" and req.qos == "" and req.nodelist == ""
    assert "--qos" not in req.options() and "--nodelist" not in req.options()
    assert slurm_request(grant(1.0), node_names={"node1": "gpu-a01"}).nodelist == "gpu-a01"
    assert slurm_request(grant(1.0), max_lifetime_s=None).time == ""


def test_names_are_the_slurm_exports():
    # team, pool and class as `jupyter-gpushare export slurm` names accounts and QOS
    req = slurm_request(grant(1.0, team="Vision Lab", pool="A100", priority="Inter.active"))
    assert req.account == "vision_lab_a100" and req.qos == "inter_active"
    # a name cannot smuggle a directive into the script
    req = slurm_request(grant(1.0, team="vision\n#SBATCH --uid=0"))
    assert "\n" not in req.account and " " not in req.account


def test_values_that_could_break_the_script_are_refused_with_the_field():
    with pytest.raises(SlurmRequestError) as err:
        slurm_request(grant(1.0, user="a b"), account_template="{user}")
    assert err.value.field == "account"
    with pytest.raises(SlurmRequestError) as err:
        slurm_request(grant(1.0), qos_template="{priority} x")
    assert err.value.field == "qos"
    with pytest.raises(SlurmRequestError) as err:
        slurm_request(grant(1.0), account_template="{nope}")
    assert "account_template" in err.value.field


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(1, "00:01:00"), (60, "00:01:00"), (61, "00:02:00"), (3600, "01:00:00"),
     (86400, "1-00:00:00"), (90000, "1-01:00:00")],
)
def test_slurm_time_rounds_up_to_minutes(seconds, text):
    assert slurm_time(seconds) == text


def render_default(req: SlurmRequest) -> str:
    """batchspawner's own SlurmSpawner template, filled as the spawner fills it."""
    template = SlurmSpawner.batch_script.default_value
    subvars = dict(homedir="/home/alice", keepvars="PATH", partition=req.partition,
                   runtime=req.time, memory="1024M", gres=req.gres, nprocs="1",
                   reservation="", options="", prologue="", srun="srun",
                   cmd="batchspawner-singleuser jupyterhub-singleuser", epilogue="")
    return format_template(template, **subvars)


def directives(script: str) -> list[str]:
    return [ln for ln in script.splitlines() if ln.startswith("#SBATCH")]


def test_directives_go_into_batchspawners_script_once_each():
    req = slurm_request(grant(0.25), partition="gpu", max_lifetime_s=3600)
    assert req.account and req.qos and req.nodelist  # all of them go in
    script = add_directives(render_default(req), req)
    lines = directives(script)
    assert script.startswith("#!/bin/bash\n#SBATCH ")
    for opt, value in req.options().items():
        have = [ln for ln in lines if ln.split()[1].split("=")[0] == opt]
        assert have == [f"#SBATCH {opt}={value}" if value else f"#SBATCH {opt}"], (opt, lines)
    # every directive comes before the first command (sbatch ignores later ones)
    first_cmd = next(i for i, ln in enumerate(script.splitlines()[1:], 1)
                     if ln and not ln.startswith("#"))
    assert all(script.splitlines().index(ln) < first_cmd for ln in lines)


def test_a_sites_own_directive_wins():
    req = slurm_request(grant(0.25))
    own = "#!/bin/sh\n#SBATCH -A physics\n#SBATCH --qos=gold\n#SBATCH --requeue\nsrun x\n"
    out = add_directives(own, req)
    assert "#SBATCH --account" not in out and "#SBATCH --qos=interactive" not in out
    assert "#SBATCH -A physics" in out and "--no-requeue" not in out
    assert "#SBATCH --gres=shard:2" in out and "#SBATCH --nodelist=node1" in out
    assert add_directives("srun x\n", req).startswith("#!/bin/bash\n#SBATCH --gres=shard:2")


def test_squeue_status_lines():
    assert parse_job_status("PENDING Resources n/a\n") == JobQueueStatus(
        "PENDING", "Resources", "n/a")
    assert parse_job_status("RUNNING None node2") == JobQueueStatus("RUNNING", "None", "node2")
    assert parse_job_status("") is None
    assert parse_job_status("slurm_load_jobs error: Invalid job id specified") is None


def test_queue_position_and_message():
    assert queue_position("12", "10\n11\n12\n13\n") == 3
    assert queue_position("12", "12_1\n") == 1
    assert queue_position("12", "") is None
    msg = queue_message("12", JobQueueStatus("PENDING", "Priority", "n/a"), 2)
    assert msg.startswith("Slurm job 12 pending: position 2 in the Slurm queue")
    assert "reason: Priority" in msg and "higher priority" in msg
    msg = queue_message("7", JobQueueStatus("PENDING", "Resources", "n/a"), None)
    assert "in the Slurm queue (reason: Resources, waiting for GPUs" in msg


def test_slurm_env_leaves_devices_to_slurm_and_caps_a_fraction():
    g = grant(0.25)
    env = enforcement.slurm_env(g, gres="shard:2", broker_url="http://10.1.2.1:9/api/v1")
    assert "CUDA_VISIBLE_DEVICES" not in env  # Slurm sets it for the GRES it allocated
    assert env["GPUSHARE_GRANT_ID"] == "g1" and env["GPUSHARE_UNITS"] == "0.25"
    assert env["GPUSHARE_ENFORCEMENT"] == "slurm-shard"
    assert env["GPUSHARE_SLURM_GRES"] == "shard:2"
    assert env["GPUSHARE_BROKER_URL"] == "http://10.1.2.1:9/api/v1"
    assert env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.25"
    assert env["GPUSHARE_TORCH_MEMORY_FRACTION"] == "0.25"
    assert env["PYTHONPATH"].split(":")[0] == enforcement.PYHOOK_DIR
    whole = enforcement.slurm_env(grant(1.0), gres="gpu:1")
    assert whole["GPUSHARE_ENFORCEMENT"] == "slurm-gpu"
    assert "XLA_PYTHON_CLIENT_MEM_FRACTION" not in whole
