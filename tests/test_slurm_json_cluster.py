"""Slurm state read with ``--json`` and, as the fallback, from text, on a real Slurm cluster.

The cluster (tests/slurmcluster.py: slurmctld and two slurmd in their own namespaces) runs
the Debian ``slurm-wlm`` of this machine (22.05), whose ``squeue --json`` and ``sinfo
--json`` answer through the ``openapi/v0.0.38`` plugins (``scontrol`` has no ``--json``
before 23.02, so jobs are read with ``squeue``). Jobs are submitted with ``sbatch`` and read
back by :class:`SlurmBackend` with each ``state_format``; a Slurm without ``--json`` is the
same cluster seen through ``squeue``/``sinfo`` wrappers that refuse ``--json`` exactly as
Slurm 20.11 does (``unrecognized option '--json'``) and run the real command otherwise.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from slurmcluster import SlurmCluster, needs_slurm, running_cluster

from jupyter_gpushare.backends.slurm import SlurmBackend, SlurmCommandError
from jupyter_gpushare.backends.slurm_json import slurm_release
from jupyter_gpushare.backends.slurm_state import SlurmJob

pytestmark = [pytest.mark.slow, needs_slurm]
NODES = ["sj-a-0", "sj-a-1"]
SPACED = "gpushare x JobState=COMPLETED y"  # a name with spaces that looks like a field


@pytest.fixture(scope="module")
def cluster() -> Iterator[SlurmCluster]:
    with running_cluster(nodes=NODES, gpus_per_node=1, shards_per_gpu=2) as c:
        yield c


def backend(cluster: SlurmCluster, tmp_path: Path, fmt: str, **kw: str) -> SlurmBackend:
    return SlurmBackend(jobs_dir=str(tmp_path / "jobs"), slurm_conf=cluster.conf_path,
                        state_format=fmt, min_poll_interval_s=0.0, node_cache_s=0.0, **kw)


def sbatch(cluster: SlurmCluster, tmp_path: Path, name: str, script: str, *extra: str) -> str:
    done = cluster.run("sbatch", "--parsable", f"--job-name={name}", f"--chdir={tmp_path}",
                       "--output=/dev/null", f"--nodelist={NODES[0]}", *extra, "--wrap", script)
    return done.stdout.strip().split(";")[0]


def wait_for(read: SlurmBackend, sid: str, states: set[str], timeout: float = 30) -> SlurmJob:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = read.commands.show_job(sid, fresh=True)
        if job is not None and job.state in states:
            return job
        time.sleep(0.2)
    raise AssertionError(f"job {sid} never reached {states}: {job}")


@pytest.fixture(scope="module")
def ended(cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Three ended jobs: one exits 3, one is killed by SIGKILL, one is cancelled."""
    tmp = tmp_path_factory.mktemp("ended")
    ids = {"exit3": sbatch(cluster, tmp, "exit3", "exit 3"),
           "killed": sbatch(cluster, tmp, "killed", "kill -9 $$"),
           "cancelled": sbatch(cluster, tmp, "cancelled", "sleep 300")}
    reader = backend(cluster, tmp, "json")
    wait_for(reader, ids["cancelled"], {"RUNNING"})
    cluster.run("scancel", ids["cancelled"])
    for sid in ids.values():
        wait_for(reader, sid, {"FAILED", "CANCELLED"})
    return ids


def test_this_slurm_answers_json_and_auto_reads_it(cluster: SlurmCluster, tmp_path: Path,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    release = slurm_release(cluster.run("squeue", "--json").stdout)
    assert tuple(int(x) for x in release.split(".")[:2]) >= (21, 8), release
    auto = backend(cluster, tmp_path, "auto")
    assert auto.state_reader == "auto"
    with caplog.at_level(logging.INFO):
        nodes = auto.nodes()
    assert auto.state_reader == "json"
    assert "reading Slurm job and node state with --json" in caplog.text
    assert sorted(nodes) == NODES
    assert all((n.gpus, n.shards, n.partitions) == (1, 2, ("gpu",)) for n in nodes.values())


@pytest.mark.parametrize("fmt", ["json", "text"])
def test_ended_jobs_read_the_same_exit_codes_signals_and_states(
    cluster: SlurmCluster, tmp_path: Path, ended: dict[str, str], fmt: str
) -> None:
    read = backend(cluster, tmp_path, fmt)
    jobs = {name: read.commands.show_job(sid) for name, sid in ended.items()}
    got = {name: (j.name, j.state, j.exit_code, j.signal, j.nodes) for name, j in jobs.items()
           if j is not None}
    cancelled = got.pop("cancelled", None)
    assert got == {
        "exit3": ("exit3", "FAILED", 3, 0, NODES[0]),
        "killed": ("killed", "FAILED", 0, 9, NODES[0]),
    }
    # scancel sends SIGTERM: Slurm records the signal (0:15) when it ends the script, or the
    # script's own exit status 143 (128 + 15) when bash exits on it first (seen under CI's
    # load); either is the cancel, read the same by both readers (the next test)
    assert cancelled in {("cancelled", "CANCELLED", 0, 15, NODES[0]),
                         ("cancelled", "CANCELLED", 143, 0, NODES[0])}, cancelled
    assert all(j is not None and j.start and j.end and j.end >= j.start for j in jobs.values())
    assert read.state_reader == fmt


def test_both_readers_agree_on_every_field_of_every_job(
    cluster: SlurmCluster, tmp_path: Path, ended: dict[str, str]
) -> None:
    pending = sbatch(cluster, tmp_path, "held", "true", "--hold")
    try:
        by_json, by_text = backend(cluster, tmp_path, "json"), backend(cluster, tmp_path, "text")
        for sid in [*ended.values(), pending]:
            assert by_json.commands.show_job(sid) == by_text.commands.show_job(sid), sid
        assert by_json.commands.show_job("999999") is None
        assert by_text.commands.show_job("999999") is None
    finally:
        cluster.run("scancel", pending, check=False)


def test_a_name_with_spaces_is_read_whole_only_from_json(
    cluster: SlurmCluster, tmp_path: Path
) -> None:
    """The text parser cuts ``JobName=`` at its first space, and the rest
    (``JobState=COMPLETED``) poses as the job's state, since the name comes first."""
    sid = sbatch(cluster, tmp_path, SPACED, "sleep 300")
    try:
        by_json = backend(cluster, tmp_path, "json")
        job = wait_for(by_json, sid, {"RUNNING"})
        assert (job.name, job.state, job.alive) == (SPACED, "RUNNING", True)
        assert by_json.commands.by_name(SPACED) == sid
        text_job = backend(cluster, tmp_path, "text").commands.show_job(sid)
        assert text_job is not None and (text_job.name, text_job.state) == (
            "gpushare", "COMPLETED")
    finally:
        cluster.run("scancel", sid, check=False)


@pytest.mark.parametrize("fmt", ["json", "text"])
def test_a_drained_node_whose_reason_looks_like_a_state_is_not_in_service(
    cluster: SlurmCluster, tmp_path: Path, fmt: str
) -> None:
    node = NODES[1]
    cluster.run("scontrol", "update", f"nodename={node}", "state=drain",
                "reason=disk is full State=IDLE")
    try:
        read = backend(cluster, tmp_path, fmt)
        assert read.nodes()[node].state in ("IDLE+DRAIN", "DRAIN+IDLE")
        assert read.nodes_in_service(NODES) == {NODES[0]}
    finally:
        cluster.run("scontrol", "update", f"nodename={node}", "state=resume")
    read = backend(cluster, tmp_path, fmt)
    deadline = time.monotonic() + 20
    while read.nodes_in_service(NODES) != set(NODES) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert read.nodes_in_service(NODES) == set(NODES), read.nodes()


OLD_SLURM = """#!/bin/sh
for a in "$@"; do
  if [ "$a" = --json ]; then
    echo "$(basename "$0"): unrecognized option '--json'" >&2
    echo "Try \\"$(basename "$0") --help\\" for more information" >&2
    exit 1
  fi
done
exec {real} "$@"
"""


def old_slurm(tmp_path: Path) -> dict[str, str]:
    """``squeue`` and ``sinfo`` as a Slurm before 21.08 answers ``--json``."""
    paths = {}
    for name in ("squeue", "sinfo"):
        real = next(p for d in os.environ["PATH"].split(":")
                    if os.access(p := os.path.join(d, name), os.X_OK))
        wrapper = tmp_path / name
        wrapper.write_text(OLD_SLURM.format(real=real))
        wrapper.chmod(0o755)
        paths[name] = str(wrapper)
    return paths


def test_a_slurm_without_json_is_read_from_text_and_that_is_kept(
    cluster: SlurmCluster, tmp_path: Path, ended: dict[str, str],
    caplog: pytest.LogCaptureFixture
) -> None:
    read = backend(cluster, tmp_path, "auto", **old_slurm(tmp_path))
    with caplog.at_level(logging.WARNING):
        job = read.commands.show_job(ended["exit3"])
        nodes = read.nodes()
    assert read.state_reader == "text"
    assert job is not None and (job.state, job.exit_code) == ("FAILED", 3)
    assert sorted(nodes) == NODES and nodes[NODES[0]].gpus == 1
    warnings = [r for r in caplog.records if "answers no --json" in r.getMessage()]
    assert len(warnings) == 1 and "unrecognized option '--json'" in warnings[0].getMessage()
    sid = sbatch(cluster, tmp_path, "found-by-name", "true")
    assert read.commands.by_name("found-by-name") == sid


def test_json_asked_for_on_a_slurm_without_it_is_a_clear_error(
    cluster: SlurmCluster, tmp_path: Path
) -> None:
    read = backend(cluster, tmp_path, "json", **old_slurm(tmp_path))
    with pytest.raises(SlurmCommandError, match="state_format is 'json', but: .*unrecognized"):
        read.nodes()
