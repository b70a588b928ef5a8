"""The YTsaurus batch backend: the vanilla operation it builds, and how it drives one.

No YTsaurus cluster can run here. What is real: the operation spec is built by
``ytsaurus-client``'s own ``VanillaSpecBuilder`` (``build()`` against an offline client, as
``run_operation`` does before sending), and the job's command really runs (papermill on the
snapshot, in a sandbox, rows on fd 1) inside :class:`ytfake.FakeYt`, the in-memory stand-in
for the client calls the backend makes (Cypress, operations, jobs, stderr). What a real
cluster would add (pools, trees, GPU allocation, images, its own preemption) is not exercised.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

import jobnotebooks as nbs
import pytest
from ytfake import FakeYt

from jupyter_gpushare.backends import ytsaurus_spec as ys
from jupyter_gpushare.backends.base import RunHandle, RunSpec, RunStatus
from jupyter_gpushare.backends.ytsaurus import YTsaurusBackend, offline_client, spec_builder
from jupyter_gpushare.backends.ytsaurus_job import pack, rows, unpack
from jupyter_gpushare.core.jobs import JobState, final_state

TOKEN = "yt-token-never-anywhere"
POLICY = Path(__file__).resolve().parent / "data" / "jobs_policy.yaml"


def gpu(pct: float = 100.0, mib: int = 144384) -> dict[str, Any]:
    return {"uuid": "GPU-x", "memory_mib": mib, "compute_pct": pct, "model": "H200"}


def grant(n: int = 1, *, team: str = "vision", fraction: float | None = None,
          cpu_milli: int = 4000, memory_mib: int = 16384, grace: int = 30) -> dict[str, Any]:
    gpus = [gpu(fraction * 100, int(144384 * fraction))] if fraction else [gpu() for _ in range(n)]
    return {
        "id": "g-1", "team": team, "pool": "train", "priority": "research", "node": "train-0",
        "units": fraction if fraction else float(n), "gpus": gpus, "cpu_milli": cpu_milli,
        "memory_mib": memory_mib, "grace_period_s": grace, "preemptible": True,
    }


def run_spec(g: dict[str, Any], *, job_id: str = "j1", attempt: int = 1,
             notebook: dict[str, Any] | None = None, out: str = "/nonexistent/out.ipynb",
             max_runtime_s: int = 3600) -> RunSpec:
    return RunSpec(
        job_id=job_id, attempt=attempt, user="alice", notebook=notebook or nbs.simple(),
        parameters={"greeting": "hi"}, output_path=out, cwd=str(Path(out).parent),
        env={
            "JUPYTERHUB_API_TOKEN": "hub-secret", "GPUSHARE_BROKER_TOKEN": "b-secret",
            "AWS_SECRET_ACCESS_KEY": "s3", "MY_PASSWORD": "pw",
            "CUDA_VISIBLE_DEVICES": "GPU-x", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=1M",
            "PATH": "/broker/bin", "GPUSHARE_TEAM": g["team"], "GPUSHARE_UNITS": "1",
            "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
        },
        max_runtime_s=max_runtime_s, kernel_name="python3", name="train.ipynb", grant=g,
    )


SETTINGS = ys.YtSettings(work_dir="//home/gpushare/jobs", pools={"nlp": "research-nlp"},
                         pool_trees=("gpu_h200",), docker_image="registry/gpushare-job:1")


# --------------------------------------------------------------------------------- the spec


@pytest.mark.parametrize("n", [1, 2, 8])
def test_whole_gpus_become_the_tasks_gpu_limit_with_the_grants_cpu_and_memory(n: int) -> None:
    op = ys.operation_spec(run_spec(grant(n)), SETTINGS)
    [(name, task)] = op["tasks"].items()
    assert name == "notebook" and task["job_count"] == 1
    assert task["gpu_limit"] == n and isinstance(task["gpu_limit"], int)
    assert task["cpu_limit"] == 4.0 and task["memory_limit"] == 16384 * 1024 * 1024
    assert task["file_paths"] == ["//home/gpushare/jobs/j1/attempt-1/input.ipynb",
                                  "//home/gpushare/jobs/j1/attempt-1/spec.json"]
    assert task["output_table_paths"] == ["//home/gpushare/jobs/j1/attempt-1/output"]
    assert task["docker_image"] == "registry/gpushare-job:1"
    assert task["interruption_signal"] == "SIGTERM"
    assert "ytsaurus_job input.ipynb spec.json" in task["command"]
    assert op["max_failed_job_count"] == 1 and op["fail_on_job_restart"] is True
    assert op["pool_trees"] == ["gpu_h200"]


def test_a_cpu_only_grant_gets_no_gpu_and_defaults_fill_missing_cpu_and_memory() -> None:
    g = grant(0, cpu_milli=0, memory_mib=0)
    g.update(gpus=[], units=0.0)
    task = ys.operation_spec(run_spec(g), SETTINGS)["tasks"]["notebook"]
    assert task["gpu_limit"] == 0
    assert task["cpu_limit"] == SETTINGS.cpu_limit
    assert task["memory_limit"] == SETTINGS.memory_limit_mib * 1024 * 1024


def test_the_pool_is_the_teams_mapped_pool_else_the_team_name() -> None:
    assert ys.operation_spec(run_spec(grant(1, team="nlp")), SETTINGS)["pool"] == "research-nlp"
    assert ys.operation_spec(run_spec(grant(1, team="vision")), SETTINGS)["pool"] == "vision"


def test_time_limit_is_the_runtime_limit_plus_grace_and_margin_in_milliseconds() -> None:
    op = ys.operation_spec(run_spec(grant(1, grace=30), max_runtime_s=7200), SETTINGS)
    assert op["time_limit"] == (7200 + 30 + SETTINGS.time_limit_margin_s) * 1000


def test_the_jobs_environment_has_no_secrets_and_no_node_local_names() -> None:
    env = ys.operation_spec(run_spec(grant(1)), SETTINGS)["tasks"]["notebook"]["environment"]
    for gone in ("JUPYTERHUB_API_TOKEN", "GPUSHARE_BROKER_TOKEN", "AWS_SECRET_ACCESS_KEY",
                 "MY_PASSWORD", "CUDA_VISIBLE_DEVICES", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
                 "PATH"):
        assert gone not in env, gone
    assert env["GPUSHARE_TEAM"] == "vision" and env["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    assert env["GPUSHARE_JOB_ID"] == "j1" and env["GPUSHARE_JOB_ATTEMPT"] == "1"
    assert env["GPUSHARE_BACKEND"] == "ytsaurus"
    assert "secret" not in json.dumps(ys.operation_spec(run_spec(grant(1)), SETTINGS))


def test_title_annotations_and_alias_name_job_attempt_and_user() -> None:
    op = ys.operation_spec(run_spec(grant(1), job_id="j7", attempt=3), SETTINGS)
    assert "j7" in op["title"] and "attempt 3" in op["title"] and "alice" in op["title"]
    assert op["annotations"]["gpushare"] == {
        "instance": "gpushare", "job_id": "j7", "attempt": 3, "user": "alice",
        "team": "vision", "pool": "train", "priority": "research", "grant_id": "g-1",
    }
    assert op["alias"] == "*gpushare-j7-3" and op["owners"] == ["alice"]
    assert ys.mutation_id(SETTINGS, "j7", 3) == ys.mutation_id(SETTINGS, "j7", 3)
    assert ys.mutation_id(SETTINGS, "j7", 3) != ys.mutation_id(SETTINGS, "j7", 4)
    assert len(ys.mutation_id(SETTINGS, "j7", 3).split("-")) == 4


def test_the_runner_spec_runs_in_the_sandbox_and_copies_nowhere() -> None:
    data = ys.runner_spec(run_spec(grant(1)))
    assert data["cwd"] == "" and data["output_path"] == ""
    assert data["parameters"] == {"greeting": "hi"} and data["kernel_name"] == "python3"


def test_the_real_spec_builder_builds_every_option_as_given() -> None:
    """``yt.wrapper``'s VanillaSpecBuilder builds the spec: each option lands where YTsaurus
    reads it (root or task), unchanged; the client only adds its own defaults."""
    ours = ys.operation_spec(run_spec(grant(2, team="nlp")), SETTINGS)
    built = spec_builder(ours).build(client=offline_client())
    for key, value in ours.items():
        if key != "tasks":
            assert built[key] == value, key
    task, mine = built["tasks"]["notebook"], ours["tasks"]["notebook"]
    for key, value in mine.items():
        if key == "environment":
            assert value.items() <= task[key].items()
        elif key in ("file_paths", "output_table_paths"):
            assert [str(p) for p in task[key]] == value
        else:
            assert task[key] == value, key
    assert built["pool"] == "research-nlp" and task["gpu_limit"] == 2
    assert "secure_vault" not in built  # nothing secret is given to the job
    assert "started_by" in built  # the client's own addition: it really built it


# ----------------------------------------------------------------------------- fractions


@pytest.mark.parametrize("fraction", [0.25, 0.5])
def test_a_fractional_grant_is_refused_with_the_reason(fraction: float) -> None:
    spec = run_spec(grant(fraction=fraction))
    reason = ys.refusal(spec, SETTINGS)
    assert reason is not None
    assert "whole GPUs only" in reason and f"{fraction:g} GPU" in reason
    assert ys.refusal(run_spec(grant(1)), SETTINGS) is None
    with pytest.raises(ValueError, match="whole GPUs only"):
        ys.operation_spec(spec, SETTINGS)
    fake = FakeYt()
    backend = YTsaurusBackend(client=fake)
    assert backend.refusal(spec) == reason
    with pytest.raises(ValueError, match="whole GPUs only"):
        backend.submit(spec)
    assert fake.operations == {}


def test_one_and_a_half_gpus_is_a_fraction_too() -> None:
    g = grant(2)
    g["gpus"][1]["compute_pct"] = 50.0
    g["units"] = 1.5
    assert ys.whole_gpus(g) is None and ys.refusal(run_spec(g), SETTINGS)


def test_a_fractional_slice_is_refused_even_where_the_grant_names_no_units() -> None:
    g = grant(fraction=0.25)
    del g["units"]
    assert ys.whole_gpus(g) is None and ys.refusal(run_spec(g), SETTINGS)


def test_an_unsafe_job_id_is_refused() -> None:
    assert "bad job id" in (ys.refusal(run_spec(grant(1), job_id="../x"), SETTINGS) or "")


# --------------------------------------------------------------------------------- submit


def backend_for(fake: FakeYt, **kw: Any) -> YTsaurusBackend:
    kw.setdefault("work_dir", "//home/gpushare/jobs")
    return YTsaurusBackend(client=fake, python=sys.executable, **kw)


def test_submit_uploads_the_snapshot_and_starts_one_operation_without_waiting() -> None:
    fake = FakeYt()
    handle = backend_for(fake).submit(run_spec(grant(1)))
    base = "//home/gpushare/jobs/j1/attempt-1"
    assert json.loads(fake.nodes[f"{base}/input.ipynb"]["data"])["cells"]
    assert json.loads(fake.nodes[f"{base}/spec.json"]["data"])["job_id"] == "j1"
    assert fake.nodes[f"{base}/output"]["type"] == "table"
    assert fake.nodes[base]["attrs"]["operation_id"] == handle.ref["operation_id"] == "op-1"
    assert TOKEN not in json.dumps(handle.to_json())


def test_submit_is_idempotent_per_job_and_attempt() -> None:
    fake = FakeYt()
    backend = backend_for(fake)
    first = backend.submit(run_spec(grant(1)))
    fake.forget_mutations()  # long after: the cluster no longer knows the mutation id
    assert backend.submit(run_spec(grant(1))).ref["operation_id"] == first.ref["operation_id"]
    # the broker died after starting the operation, before its id was recorded in Cypress
    del fake.nodes["//home/gpushare/jobs/j1/attempt-1"]["attrs"]["operation_id"]
    again = YTsaurusBackend(client=fake, work_dir="//home/gpushare/jobs").submit(
        run_spec(grant(1)))
    assert again.ref["operation_id"] == first.ref["operation_id"]  # found by its alias
    fake.operations["op-1"].state = "completed"  # the alias is free again: still no rerun
    del fake.nodes["//home/gpushare/jobs/j1/attempt-1"]["attrs"]["operation_id"]
    assert backend.submit(run_spec(grant(1))).ref["operation_id"] == "op-1"
    assert len(fake.operations) == 1


def test_a_retried_start_request_carries_the_same_mutation_id() -> None:
    fake = FakeYt()
    backend = backend_for(fake)
    backend.submit(run_spec(grant(1)))
    del fake.nodes["//home/gpushare/jobs/j1/attempt-1"]["attrs"]["operation_id"]
    fake.operations["op-1"].alias = None  # as if the first start's answer was lost in transit
    assert backend.submit(run_spec(grant(1))).ref["operation_id"] == "op-1"
    assert len(fake.operations) == 1
    assert backend.submit(run_spec(grant(1), attempt=2)).ref["operation_id"] == "op-2"
    assert len(fake.operations) == 2


# ---------------------------------------------------------------------------------- state


def handle_of(backend: YTsaurusBackend, fake: FakeYt, state: str,
              error: dict[str, Any] | None = None) -> RunHandle:
    handle = backend.submit(run_spec(grant(1)))
    op = fake.operations[handle.ref["operation_id"]]
    op.state, op.error = state, error
    return handle


@pytest.mark.parametrize("state", ["starting", "initializing", "preparing", "materializing",
                                   "pending", "running", "reviving", "completing", "aborting"])
def test_states_before_the_end_are_alive(state: str) -> None:
    fake = FakeYt()
    backend = backend_for(fake)
    assert backend.poll(handle_of(backend, fake, state)) == RunStatus(alive=True)


def test_an_unknown_state_or_an_unreachable_cluster_cannot_tell() -> None:
    fake = FakeYt()
    backend = backend_for(fake)
    assert backend.poll(handle_of(backend, fake, "some_new_state")).alive is None

    def down(*_: Any, **__: Any) -> Any:
        raise ConnectionError("proxy down")

    fake.get_operation = down  # type: ignore[method-assign]
    assert backend.poll(RunHandle("ytsaurus", "j1", 1, {"operation_id": "op-1"})).alive is None


@pytest.mark.parametrize("state", ["failed", "aborted"])
def test_a_failed_or_aborted_operation_ends_the_run_with_yts_reason(state: str) -> None:
    fake = FakeYt()
    backend = backend_for(fake)
    handle = handle_of(backend, fake, state, {
        "message": "Operation has failed", "inner_errors": [{"message": "Memory limit exceeded"}]})
    status = backend.poll(handle)
    assert status.alive is False and not status.finished and status.exit_code is None
    assert status.error is not None
    assert f"op-1 {state}" in status.error["summary"]
    assert "Memory limit exceeded" in status.error["summary"]
    assert final_state(None, False, False) is JobState.FAILED


def test_a_completed_operation_reports_the_status_row() -> None:
    fake = FakeYt()
    backend = backend_for(fake)
    handle = handle_of(backend, fake, "completed")
    fake.nodes[handle.ref["output_table"]]["data"] = [
        {"kind": "status", "part": 0, "data": json.dumps(
            {"exit_code": 1, "error": {"summary": "ValueError in cell 3"}, "terminated": False})}]
    status = backend.poll(handle)
    assert status.finished and status.exit_code == 1
    assert status.error == {"summary": "ValueError in cell 3"}
    fake.nodes[handle.ref["output_table"]]["data"] = []  # read once: the result is kept
    assert backend.poll(handle).exit_code == 1


def test_finished_results_kept_in_memory_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    import jupyter_gpushare.backends.ytsaurus as yb

    monkeypatch.setattr(yb, "CACHE_SIZE", 3)
    fake = FakeYt()
    backend = backend_for(fake)
    for i in range(6):
        handle = backend.submit(run_spec(grant(1), job_id=f"j{i}"))
        fake.operations[handle.ref["operation_id"]].state = "aborted"
        backend.signal(handle)
        assert backend.poll(handle).alive is False
    assert list(backend._finished) == ["op-4", "op-5", "op-6"]
    assert len(backend._signalled) == 3


def test_a_vanished_operation_is_over() -> None:
    fake = FakeYt()
    status = backend_for(fake).poll(RunHandle("ytsaurus", "j1", 1, {"operation_id": "op-9"}))
    assert status.alive is False and "no operation op-9" in (status.error or {})["summary"]


def test_a_handle_without_an_operation_was_never_started() -> None:
    status = backend_for(FakeYt()).poll(RunHandle("ytsaurus", "j1", 1, {}))
    assert status == RunStatus(alive=False, started=False)


# ------------------------------------------------------------------ runs (the job executed)


def wait_end(backend: YTsaurusBackend, handle: RunHandle, timeout: float = 120) -> RunStatus:
    deadline = time.monotonic() + timeout
    while True:
        status = backend.poll(handle)
        if status.alive is False:
            return status
        assert time.monotonic() < deadline, status
        time.sleep(0.2)


def wait_running(fake: FakeYt, handle: RunHandle, text: bytes, timeout: float = 90) -> None:
    op = fake.operations[handle.ref["operation_id"]]
    deadline = time.monotonic() + timeout
    assert op.sandbox is not None
    while text not in (op.sandbox / "_stderr").read_bytes():
        assert time.monotonic() < deadline, (op.sandbox / "_stderr").read_bytes()[-2000:]
        time.sleep(0.2)


@pytest.mark.slow
def test_a_run_executes_the_notebook_and_brings_output_and_log_back(tmp_path: Path) -> None:
    fake = FakeYt(execute=True)
    try:
        backend = backend_for(fake, output_cypress_dir="//home/{username}/gpushare")
        out = tmp_path / "alice" / "out" / "train-run.ipynb"
        handle = backend.submit(run_spec(grant(1), out=str(out)))
        status = wait_end(backend, handle)
        assert status.finished and status.exit_code == 0 and not status.terminated, status
        assert status.output_path == str(out)
        executed = json.loads(out.read_text())
        printed = "".join("".join(o.get("text", "")) for c in executed["cells"]
                          for o in c.get("outputs", []))
        assert "hi j1" in printed  # the parameter reached the notebook through papermill
        assert "CUDA_VISIBLE_DEVICES=None" in printed  # the broker's GPU ids stayed home
        assert backend.fetch_output(handle) == out.read_bytes()
        assert fake.nodes["//home/alice/gpushare/train-run.ipynb"]["data"] == out.read_bytes()
        log, end = backend.read_log("j1")
        assert b"--- gpushare job j1 attempt 1 started" in log and end == len(log)
        assert backend.log_size("j1") == len(log)
        assert backend.read_log("j1", 10, 5) == (log[10:15], 15)
        assert b"hub-secret" not in log
        asked = fake.calls.count("get_job_stderr op-1 op-1-job-1")
        backend.read_log("j1")
        assert fake.calls.count("get_job_stderr op-1 op-1-job-1") == asked  # kept: it is over
    finally:
        fake.close()


@pytest.mark.slow
def test_a_failing_cell_is_reported_with_its_error_and_the_notebook_is_kept() -> None:
    fake = FakeYt(execute=True)
    try:
        backend = backend_for(fake)
        handle = backend.submit(run_spec(grant(1), notebook=nbs.raising()))
        status = wait_end(backend, handle)
        assert status.finished and status.exit_code == 1, status
        assert status.error is not None and status.error["ename"] == "ValueError"
        assert status.error["cell_index"] == 2
        assert fake.operations["op-1"].state == "completed"  # its output table was kept
        assert b"before the error" in (backend.fetch_output(handle) or b"")
    finally:
        fake.close()


@pytest.mark.slow
def test_preemption_interrupts_the_job_and_the_run_ends_terminated() -> None:
    """signal(): YTsaurus interrupts the job (SIGTERM), the runner stops the kernel and the
    job ends successfully with ``terminated`` in its status row: the broker requeues it."""
    fake = FakeYt(execute=True)
    try:
        backend = backend_for(fake)
        handle = backend.submit(run_spec(grant(1, grace=20), notebook=nbs.sleeping(120)))
        wait_running(fake, handle, b"sleeping")
        t0 = time.monotonic()
        backend.signal(handle)
        op = fake.operations[handle.ref["operation_id"]]
        assert op.aborts == [(op.job_id, 20000)]  # interrupted with the grace period
        status = wait_end(backend, handle)
        assert time.monotonic() - t0 < 20  # it stopped on the signal, not at the timeout
        assert status.finished and status.terminated and status.exit_code == 143, status
        assert op.state == "completed"
        assert final_state(status.exit_code, True, False) is JobState.PREEMPTED
    finally:
        fake.close()


@pytest.mark.slow
def test_an_interruption_by_yts_own_scheduler_fails_the_attempt_with_that_reason() -> None:
    fake = FakeYt(execute=True)
    try:
        backend = backend_for(fake)
        handle = backend.submit(run_spec(grant(1), notebook=nbs.sleeping(120)))
        wait_running(fake, handle, b"sleeping")
        op = fake.operations[handle.ref["operation_id"]]
        fake.abort_job(op.job_id, interrupt_timeout=20000)  # YTsaurus preempts, not the broker
        status = wait_end(backend, handle)
        assert status.finished and status.terminated and status.exit_code == 143, status
        assert status.error is not None
        assert status.error["summary"].startswith("interrupted by YTsaurus, not by")
        assert final_state(status.exit_code, False, False) is JobState.FAILED
    finally:
        fake.close()


@pytest.mark.slow
def test_a_requeued_attempt_resumes_from_the_checkpoint_the_preempted_one_left() -> None:
    fake = FakeYt(execute=True)
    try:
        backend = backend_for(fake)
        notebook = nbs.counting(steps=16, delay=0.25)
        first = backend.submit(run_spec(grant(1, grace=20), notebook=notebook))
        wait_running(fake, first, b"step 3")
        backend.signal(first)
        assert wait_end(backend, first).terminated
        second = backend.submit(run_spec(grant(1), attempt=2, notebook=notebook))
        built = fake.specs[-1]["tasks"]["notebook"]
        assert [str(p) for p in built["file_paths"]][-1].endswith("attempt-2/checkpoint.tar.gz")
        assert built["environment"]["GPUSHARE_CHECKPOINT_ARCHIVE"] == "checkpoint.tar.gz"
        status = wait_end(backend, second)
        assert status.finished and status.exit_code == 0, status
        executed = (backend.fetch_output(second) or b"").decode()
        done = re.search(r"resumed from (\d+) finished 16", executed)
        assert done and int(done.group(1)) >= 3, executed[-2000:]
        log, _ = backend.read_log("j1")
        assert b"resumed the checkpoint folder of the previous attempt" in log
    finally:
        fake.close()


def test_the_checkpoint_archive_is_bounded_and_cannot_leave_its_folder(tmp_path: Path) -> None:
    folder = tmp_path / "ck"
    folder.mkdir()
    assert pack(folder, 1 << 20) is None  # nothing to carry
    (folder / "model.bin").write_bytes(os.urandom(64 * 1024))
    assert pack(folder, 1024) is None  # over the limit: not carried
    assert pack(folder, 0) is None  # carrying is off
    data = pack(folder, 1 << 20)
    assert data is not None
    (tmp_path / "a.tgz").write_bytes(data)
    unpack(tmp_path / "a.tgz", tmp_path / "out")
    assert (tmp_path / "out" / "model.bin").read_bytes() == (folder / "model.bin").read_bytes()
    evil = io.BytesIO()
    with tarfile.open(fileobj=evil, mode="w:gz") as tar:
        info = tarfile.TarInfo("../escaped")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    (tmp_path / "evil.tgz").write_bytes(evil.getvalue())
    with pytest.raises(tarfile.TarError):
        unpack(tmp_path / "evil.tgz", tmp_path / "out")
    assert not (tmp_path / "escaped").exists()


def test_a_first_attempt_carries_no_checkpoint_and_a_zero_limit_turns_carrying_off() -> None:
    fake = FakeYt()
    backend = backend_for(fake)
    backend.submit(run_spec(grant(1)))
    task = fake.specs[-1]["tasks"]["notebook"]
    assert len(task["file_paths"]) == 2 and "GPUSHARE_CHECKPOINT_ARCHIVE" not in task["environment"]
    assert task["environment"]["GPUSHARE_CHECKPOINT_MAX_BYTES"] == str(256 * 1024 * 1024)
    fake.nodes["//home/gpushare/jobs/j1/attempt-1/output"]["data"] = list(
        rows({"exit_code": 143, "terminated": True}, None, b"ckpt"))
    fake.operations["op-1"].state = "completed"
    backend.submit(run_spec(grant(1), attempt=2))
    assert fake.nodes["//home/gpushare/jobs/j1/attempt-2/checkpoint.tar.gz"]["data"] == b"ckpt"
    off = backend_for(FakeYt(), max_checkpoint_bytes=0)
    off.submit(run_spec(grant(1), attempt=2))
    assert "GPUSHARE_CHECKPOINT_ARCHIVE" not in off.client.specs[-1]["tasks"]["notebook"][
        "environment"]


def test_preempting_an_operation_whose_job_has_not_started_aborts_it() -> None:
    fake = FakeYt()
    backend = backend_for(fake)
    handle = backend.submit(run_spec(grant(1)))
    backend.signal(handle)
    assert fake.calls[-1] == "abort_operation op-1"
    status = backend.poll(handle)
    assert status.alive is False and status.terminated and not status.finished
    assert final_state(status.exit_code, True, False) is JobState.PREEMPTED


def test_kill_aborts_the_operation_and_tolerates_a_finished_one() -> None:
    fake = FakeYt()
    backend = backend_for(fake)
    handle = backend.submit(run_spec(grant(1)))
    backend.kill(handle)
    assert fake.operations["op-1"].state == "aborted"
    backend.kill(handle)  # finished already: no error
    backend.forget("j1")
    assert not any(p.startswith("//home/gpushare/jobs/j1") for p in fake.nodes)


def test_the_token_file_is_read_for_the_client_and_never_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    token.chmod(0o644)
    backend = YTsaurusBackend(proxy="yt.example.invalid", token_path=str(token))
    client = backend.make_client()
    assert client.config["token"] == TOKEN
    assert TOKEN not in caplog.text and "readable by others" in caplog.text


# ------------------------------------------------------------------- through a real broker


class FakeYtBackend(YTsaurusBackend):
    """The YTsaurus backend on the in-memory stand-in (class attribute, set per test)."""

    fake: FakeYt | None = None

    def make_client(self) -> Any:
        return type(self).fake


@pytest.mark.slow
async def test_the_broker_runs_a_whole_gpu_job_and_refuses_a_fraction(tmp_path: Path) -> None:
    from brokerkit import call, start_broker, static_tokens
    from traitlets.config import Config

    from jupyter_gpushare.policy import load_policy

    FakeYtBackend.fake = fake = FakeYt(execute=True)
    config = Config()
    config.JobManager.backend_class = FakeYtBackend
    config.JobManager.user_root_template = str(tmp_path / "home" / "{username}")
    config.YTsaurusBackend.python = sys.executable
    config.YTsaurusBackend.pools = {"vision": "gpushare-vision"}
    config.YTsaurusBackend.pool_trees = ["gpu_h200"]
    (tmp_path / "home" / "alice").mkdir(parents=True)
    app = await start_broker(
        load_policy(str(POLICY)), f"sqlite:///{tmp_path}/jobs.sqlite",
        static_tokens({"alice": ["vision"]}), config=config,
    )

    async def until_done(job_id: str) -> dict[str, Any]:
        deadline = time.monotonic() + 120
        while True:
            _, now = await call(app, "GET", f"/jobs/{job_id}", "tok-alice")
            if now["state"] in {"succeeded", "failed", "cancelled"}:
                return now
            assert time.monotonic() < deadline, now
            await asyncio.sleep(0.2)

    try:
        assert isinstance(app.jobs.backend, FakeYtBackend)
        status, job = await call(app, "POST", "/jobs", "tok-alice-srv", {
            "notebook": nbs.simple(), "profile": "vision-1gpu", "max_runtime": 300,
        })
        assert status == 201, job
        done = await until_done(job["id"])
        assert done["state"] == "succeeded", done
        [built] = fake.specs
        assert built["pool"] == "gpushare-vision" and built["pool_trees"] == ["gpu_h200"]
        assert built["tasks"]["notebook"]["gpu_limit"] == 1
        assert built["annotations"]["gpushare"]["job_id"] == job["id"]
        outputs = list((tmp_path / "home" / "alice").rglob("*.ipynb"))
        assert outputs, "the executed notebook reached the user's files"

        status, frac = await call(app, "POST", "/jobs", "tok-alice-srv", {
            "notebook": nbs.simple(), "profile": "debug-quarter", "max_runtime": 300,
        })
        assert status == 201, frac
        refused = await until_done(frac["id"])
        assert refused["state"] == "failed", refused
        assert "refused by the ytsaurus backend: YTsaurus allocates whole GPUs only" in \
            json.dumps(refused)
        assert len(fake.specs) == 1  # nothing was started for it
        assert not app.broker.state.grants  # and its grant was released
    finally:
        await app.stop_async()
        fake.close()
        FakeYtBackend.fake = None
