"""The Slurm backend's pure parts, without a cluster: the sbatch command line built from a
grant, the refusal of requests Slurm could never run, and Slurm's job states read back."""

from __future__ import annotations

import pytest

from jupyter_gpushare.backends.slurm_args import (
    Gres,
    SbatchOptions,
    SlurmNodeInfo,
    batch_script,
    build_request,
    gres_for,
    job_name,
    parse_node_gres,
    parse_parsable,
    refusal,
    sbatch_argv,
    scancel_argv,
    scancel_signal_argv,
    time_minutes,
)
from jupyter_gpushare.backends.slurm_state import (
    node_dead,
    node_in_service,
    parse_scontrol_job,
    status_from,
    stuck_on,
)


def grant(gpus: list[float], **extra: object) -> dict[str, object]:
    return {
        "team": "vision", "priority": "research", "node": "node1", "grace_period_s": 30,
        "cpu_milli": 2500, "memory_mib": 8192,
        "gpus": [{"uuid": f"GPU-{i}", "compute_pct": pct} for i, pct in enumerate(gpus)],
        "units": sum(gpus) / 100, **extra,
    }


@pytest.mark.parametrize(("gpus", "shards", "want"), [
    ([100.0], 8, Gres("gpu", 1)),
    ([100.0, 100.0, 100.0, 100.0], 8, Gres("gpu", 4)),
    ([25.0], 8, Gres("shard", 2)),
    ([12.5], 8, Gres("shard", 1)),
    ([10.0], 8, Gres("shard", 1)),  # 0.8 shards: at least 1
    ([33.3], 8, Gres("shard", 3)),  # 2.66: rounded up, never less than granted
    ([30.0], 8, Gres("shard", 3)),  # 2.4: 3, not 2
    ([50.0], 16, Gres("shard", 8)),
    ([], 8, Gres("", 0)),
])
def test_gres_whole_gpus_shards_and_none(gpus: list[float], shards: int, want: Gres) -> None:
    assert gres_for(grant(gpus), shards) == want


def test_the_command_line_carries_the_grant() -> None:
    req = build_request(job_name("job-1", 3), "/j/job-1/attempt-3/job.sh", "/j/job-1/log.txt",
                        "/j/job-1/attempt-3", grant([25.0]), 600, 8)
    argv = sbatch_argv(req, SbatchOptions(partition="gpu", pass_account=True, pass_qos=True,
                                          extra_args=("--constraint=h200",)), "/usr/bin/sbatch")
    assert argv[0] == "/usr/bin/sbatch" and argv[-1] == "/j/job-1/attempt-3/job.sh"
    for arg in ("--parsable", "--job-name=gpushare-job-1-a3", "--output=/j/job-1/log.txt",
                "--open-mode=append", "--nodelist=node1", "--nodes=1", "--gres=shard:2",
                "--account=vision", "--qos=research", "--time=11", "--signal=B:TERM@30",
                "--no-requeue", "--partition=gpu", "--cpus-per-task=3", "--mem=8192M",
                "--constraint=h200", "--chdir=/j/job-1/attempt-3", "--export=ALL"):
        assert arg in argv, arg
    assert "--requeue" not in argv


def test_account_qos_partition_only_when_asked() -> None:
    req = build_request("n", "s", "o", "w", grant([100.0, 100.0], grace_period_s=0), 60, 8)
    argv = sbatch_argv(req, SbatchOptions(pass_cpu_memory=False))
    assert "--gres=gpu:2" in argv and "--time=1" in argv
    assert not [a for a in argv if a.startswith(("--account", "--qos", "--partition",
                                                 "--signal", "--mem", "--cpus"))]


def test_names_that_are_not_slurm_names_are_refused() -> None:
    req = build_request("n", "s", "o", "w", grant([100.0], team="a team;rm -rf"), 60, 8)
    argv = sbatch_argv(req, SbatchOptions(partition="gpu", pass_account=True))
    assert "--account=a_team_rm_-rf" in argv  # named as the export names it: nothing unsafe
    with pytest.raises(ValueError, match="--partition"):
        sbatch_argv(req, SbatchOptions(partition="gpu;x", pass_account=True))
    with pytest.raises(ValueError, match="--nodelist"):
        sbatch_argv(build_request("n", "s", "o", "w", grant([100.0], node="n1,n2"), 60, 8),
                    SbatchOptions())


def test_account_and_partition_are_the_exports_and_the_spawners() -> None:
    """With a site partition the team's account; else ``<team>_<pool>``, in the pool's
    partition with partition_per_pool (the export's names; SlurmGPUShareSpawner's rule)."""
    req = build_request("n", "s", "o", "w", grant([100.0], team="Vision", pool="train"), 60, 8)
    site = sbatch_argv(req, SbatchOptions(partition="gpu", pass_account=True, pass_qos=True))
    assert "--partition=gpu" in site and "--account=vision" in site
    pooled = sbatch_argv(req, SbatchOptions(partition_per_pool=True, pass_account=True))
    assert "--partition=train" in pooled and "--account=vision_train" in pooled
    plain = sbatch_argv(req, SbatchOptions(pass_account=True))
    assert "--account=vision_train" in plain
    assert not [a for a in plain if a.startswith("--partition")]


def test_time_limit_and_signal() -> None:
    assert time_minutes(3600, 30) == 61 and time_minutes(1, 0) == 1 and time_minutes(60, 0) == 1
    req = build_request("n", "s", "o", "w", grant([100.0], grace_period_s=100000), 60, 8)
    assert "--signal=B:TERM@65535" in sbatch_argv(req, SbatchOptions())


NODES = {"node1": SlurmNodeInfo("node1", 2, 16, "IDLE", ("gpu",)),
         "cpu1": SlurmNodeInfo("cpu1", 0, 0, "IDLE", ("gpu",))}


def test_refusals_name_what_slurm_could_never_do() -> None:
    assert refusal(Gres("gpu", 2), "node1", NODES) is None
    assert refusal(Gres("shard", 8), "node1", NODES) is None
    assert "3 whole GPUs on node 'node1', which has 2 GPUs" in str(
        refusal(Gres("gpu", 3), "node1", NODES))
    assert "shard:9, more shards than one GPU of node 'node1' has (8)" in str(
        refusal(Gres("shard", 9), "node1", NODES))
    assert "no GPU shards" in str(refusal(Gres("shard", 1), "cpu1", NODES))
    assert "'ghost' is not a node of the Slurm cluster (its nodes: cpu1, node1)" in str(
        refusal(Gres("gpu", 1), "ghost", NODES))
    assert "not in Slurm partition 'big'" in str(refusal(Gres("gpu", 1), "node1", NODES, "big"))
    assert refusal(Gres("", 0), "", NODES) == "the grant names no node to run on"


def test_node_gres_and_sbatch_output() -> None:
    assert parse_node_gres("gpu:2,shard:16") == (2, 16)
    assert parse_node_gres("gpu:h100:4(S:0-1),shard:h100:32(S:0-1)") == (4, 32)
    assert parse_node_gres("(null)") == (0, 0)
    assert parse_parsable("42\n") == "42" and parse_parsable("42;cluster") == "42"
    with pytest.raises(ValueError):
        parse_parsable("sbatch: error: nope")
    assert scancel_signal_argv("7") == ["scancel", "--signal=TERM", "--full", "7"]
    assert list(scancel_argv("7"))[-1] == ["scancel", "7"]
    assert "exec '/venv/bin/python' -m m '/j/it'\"'\"'s'" in batch_script("/venv/bin/python",
                                                                           "m", "/j/it's")


LINE = ("JobId=12 JobName=gpushare-job-1-a1 UserId=root(0) JobState={state} Reason={reason} "
        "Dependency=(null) Requeue=0 Restarts=0 BatchFlag=1 ExitCode={code} RunTime=00:00:05 "
        "StartTime=2026-12-01T11:52:13 EndTime=2026-12-01T11:52:18 NodeList=node2 "
        "Command=/j/job 1/job.sh")


def job(state: str, reason: str = "None", code: str = "0:0") -> object:
    return parse_scontrol_job(LINE.format(state=state, reason=reason, code=code))


def test_scontrol_lines_are_read() -> None:
    j = parse_scontrol_job(LINE.format(state="NODE_FAIL", reason="NodeDown", code="0:9"))
    assert j is not None and (j.job_id, j.name, j.state, j.reason) == (
        "12", "gpushare-job-1-a1", "NODE_FAIL", "NodeDown")
    assert (j.exit_code, j.signal, j.nodes, j.restarts) == (0, 9, "node2", 0)
    assert j.start is not None and j.end == j.start + 5
    assert parse_scontrol_job("") is None
    assert parse_scontrol_job(LINE.format(state="CANCELLED+", reason="x", code="0:15")
                              ).state == "CANCELLED"  # type: ignore[union-attr]


@pytest.mark.parametrize("state", ["PENDING", "CONFIGURING", "RUNNING", "SUSPENDED",
                                   "REQUEUED", "COMPLETING"])
def test_states_that_still_hold_the_grant(state: str) -> None:
    assert status_from(job(state), None, True).alive is True  # type: ignore[arg-type]
    assert status_from(job(state), None, True).queued is (  # type: ignore[arg-type]
        state in ("PENDING", "CONFIGURING", "REQUEUED"))
    pending = status_from(job("PENDING", "Resources"), None, True)  # type: ignore[arg-type]
    assert pending.reason == ("queued in Slurm: job 12 pending (reason: Resources, waiting for "
                              "GPUs or CPUs on the node to free up)")
    held = status_from(job("PENDING", "AssocGrpGRES"), None, True)  # type: ignore[arg-type]
    assert held.reason == ("queued in Slurm: job 12 pending (reason: AssocGrpGRES, your "
                           "team's GPU limit is reached)")
    assert status_from(job("RUNNING"), None, True).started_at  # type: ignore[arg-type]


@pytest.mark.parametrize(("state", "reason", "words"), [
    ("NODE_FAIL", "NodeDown", "NODE_FAIL on node2: its node failed (reason: NodeDown)"),
    ("TIMEOUT", "None", "TIMEOUT on node2: it ran past its Slurm time limit"),
    ("OUT_OF_MEMORY", "None", "OUT_OF_MEMORY on node2: it ran out of memory"),
    ("CANCELLED", "None", "CANCELLED on node2: the job was cancelled in Slurm"),
    ("PREEMPTED", "None", "PREEMPTED on node2: Slurm preempted it"),
    ("FAILED", "NonZeroExitCode", "FAILED on node2: the batch script failed"),
    ("COMPLETED", "None", "COMPLETED on node2: the batch script ended"),
])
def test_ends_without_a_result_carry_slurms_reason(state: str, reason: str, words: str) -> None:
    status = status_from(job(state, reason, "1:0"), None, True)  # type: ignore[arg-type]
    assert status.alive is False and status.finished is False and status.exit_code == 1
    assert status.error is not None and words in status.error["summary"]
    assert status.error["slurm_state"] == state
    assert status.node_failed == ("node2" if state == "NODE_FAIL" else None)  # drain, requeue


def test_the_runners_result_wins_once_slurm_says_it_ended() -> None:
    result = {"exit_code": 0, "error": None, "output_path": "/u/x.ipynb", "started_at": 1.0,
              "ended_at": 2.0, "terminated": False}
    assert status_from(job("RUNNING"), result, True).alive is True  # type: ignore[arg-type]
    done = status_from(job("COMPLETING"), result, True)  # type: ignore[arg-type]
    assert done.finished and done.exit_code == 0 and done.output_path == "/u/x.ipynb"
    gone = status_from(None, result, True)
    assert gone.finished and gone.exit_code == 0
    assert status_from(None, None, False).started is False
    lost = status_from(None, None, True)
    assert lost.alive is False and "gone" in (lost.error or {})["summary"]


def test_a_pending_job_stuck_on_a_dead_node() -> None:
    line = ("JobId=9 JobName=gpushare-j-a1 JobState=PENDING "
            "Reason=ReqNodeNotAvail,_UnavailableNodes:node2 ExitCode=0:0 NodeList=(null) "
            "ReqNodeList={req}")
    pending = parse_scontrol_job(line.format(req="node2"))
    assert pending is not None and pending.req_nodes == "node2"
    assert stuck_on(pending, {"node2": "DOWN*"}) == "node2"
    assert stuck_on(pending, {"node2": "IDLE+DRAIN"}) == "node2"
    assert stuck_on(pending, {"node2": "IDLE"}) is None  # it will start
    assert stuck_on(pending, {"node2": "MIXED"}) is None
    waiting = parse_scontrol_job(line.format(req="node2").replace(
        "ReqNodeNotAvail,_UnavailableNodes:node2", "Resources"))
    assert waiting is not None and stuck_on(waiting, {"node2": "DOWN"}) is None
    assert node_dead("DOWN+NOT_RESPONDING") and node_dead("IDLE*") and not node_dead("ALLOCATED")


@pytest.mark.parametrize("state, back", [
    ("IDLE", True), ("MIXED", True), ("ALLOCATED", True), ("idle", True),
    ("MIXED+COMPLETING", True), ("DOWN", False), ("DOWN*", False), ("IDLE*", False),
    ("IDLE+DRAIN", False), ("MIXED+DRAIN", False), ("DOWN+NOT_RESPONDING", False),
    ("IDLE+NOT_RESPONDING", False), ("IDLE+POWERED_DOWN", False), ("FUTURE", False),
    ("UNKNOWN", False), ("", False),
])
def test_a_node_is_back_in_service_only_without_down_drain_or_not_responding(
    state: str, back: bool
) -> None:
    assert node_in_service(state) is back
