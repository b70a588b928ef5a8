"""Issue 23, finding 2 on the Slurm backend: the folders of a job are made, written, handed
over and read without following a link, at every submit (requeues included) and poll.

No Slurm cluster: ``SlurmBackend.submit`` and ``poll`` are called directly with the Slurm
commands replaced by a recorder (``commands.run``), so what is checked is the folder preparation,
the ``spec.json`` and the ``sbatch`` line. The broker runs as root here (as for
``run_as = "user"``); ``nobody`` (uid 65534) is the job's user.
"""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import jobnotebooks as nbs
import pytest
from brokerkit import call, start_broker, static_tokens
from slurmcluster import needs_slurm, running_cluster
from traitlets.config import Config

from jupyter_gpushare.backends.base import RunHandle, RunSpec
from jupyter_gpushare.backends.slurm import STATUS_MAX_BYTES, SlurmBackend
from jupyter_gpushare.policy import load_policy
from jupyter_gpushare.userfiles import UnsafeFile

POLICY = Path(__file__).resolve().parent / "data" / "jobs_policy.yaml"

NOBODY = pwd.getpwnam("nobody")
JOB = "j-slurm-trust"
GRANT = {"node": "n1", "team": "vision", "priority": "research", "grace_period_s": 3,
         "cpu_milli": 1000, "memory_mib": 512,
         "gpus": [{"uuid": "GPU-sim-n1-0", "compute_pct": 100.0}]}

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")


class Slurm:
    """Stands in for the Slurm commands: records every command line; sbatch answers an id,
    scontrol answers ``jobs`` (id -> SlurmJob name and state), squeue ``by_name``."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.jobs: dict[str, tuple[str, str]] = {}
        self.by_name: dict[str, list[tuple[str, str]]] = {}  # name -> [(id, user)]
        self.next_id = 4242

    def __call__(self, argv: list[str], *, env: dict[str, str] | None = None,
                 check: bool = True) -> subprocess.CompletedProcess[str]:
        self.calls.append(list(argv))
        base = [os.path.basename(a) for a in argv]
        out = ""
        if "sbatch" in base:
            name = next(a for a in argv if a.startswith("--job-name=")).split("=", 1)[1]
            out = str(self.next_id)
            self.jobs[out] = (name, "RUNNING")
            user = argv[2] if argv[0] == "runuser" else "root"
            self.by_name.setdefault(name, []).append((out, user))
            self.next_id += 1
        elif "scontrol" in base and argv[-1] in self.jobs:
            name, state = self.jobs[argv[-1]]
            out = f"JobId={argv[-1]} JobName={name} JobState={state} Reason=None"
        elif "squeue" in base:
            name = next(a for a in argv if a.startswith("--name=")).split("=", 1)[1]
            users = [a.split("=", 1)[1] for a in argv if a.startswith("--user=")]
            out = " ".join(i for i, u in self.by_name.get(name, []) if not users or u in users)
        return subprocess.CompletedProcess(argv, 0, out, "")

    def sbatches(self) -> list[list[str]]:
        return [c for c in self.calls if any(os.path.basename(a) == "sbatch" for a in c)]


@pytest.fixture
def slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[SlurmBackend,
                                                                           Slurm]]:
    backend = SlurmBackend(jobs_dir=str(tmp_path / "jobs"), min_poll_interval_s=0.0,
                           state_format="text")  # the stand-in answers scontrol's text
    backend.run_as = "user"
    fake = Slurm()
    monkeypatch.setattr(backend.commands, "run", fake)
    (tmp_path / "home" / "nobody").mkdir(parents=True)
    yield backend, fake


def _spec(tmp_path: Path, attempt: int = 1) -> RunSpec:
    home = tmp_path / "home" / "nobody"
    return RunSpec(
        job_id=JOB, attempt=attempt, user="nobody", notebook=nbs.simple(), parameters={},
        output_path=str(home / "work" / "out.ipynb"), cwd=str(home / "work"), env={},
        max_runtime_s=60, grant=GRANT, output_root=str(home),
    )


def _target(tmp_path: Path) -> Path:
    target = tmp_path / "root-only"
    target.mkdir(mode=0o700)
    (target / "keep").write_text("root's")
    return target


def _snapshot(folder: Path) -> list[tuple[str, int, int, int]]:
    out = []
    for path in sorted([folder, *folder.rglob("*")]):
        st = path.lstat()
        out.append((str(path.relative_to(folder)), st.st_uid, st.st_gid, st.st_mode))
    return out


def _owner(path: Path) -> tuple[int, int]:
    st = path.lstat()
    return st.st_uid, stat.S_IMODE(st.st_mode)


# -- a link planted for checkpoint/ or the next attempt's folder ---------------------------------


@pytest.mark.parametrize("swapped", ["checkpoint", "attempt-2"])
def test_a_requeue_into_a_linked_folder_is_refused_naming_it_and_its_target_untouched(
    slurm: tuple[SlurmBackend, Slurm], tmp_path: Path, swapped: str
) -> None:
    backend, fake = slurm
    backend.submit(_spec(tmp_path, attempt=1))  # the first attempt, as it ran
    jobdir = tmp_path / "jobs" / JOB
    target = _target(tmp_path)
    before = _snapshot(target)
    if swapped == "checkpoint":
        os.rmdir(jobdir / "checkpoint")
    (jobdir / swapped).symlink_to(target)  # what the job did (an older layout let it)
    with pytest.raises(UnsafeFile, match=f"{jobdir / swapped} is a symbolic link"):
        backend.submit(_spec(tmp_path, attempt=2))  # the requeue
    assert _snapshot(target) == before  # nothing made, written or handed over there
    assert (jobdir / swapped).is_symlink() and _owner(target) == (0, 0o700)
    assert len(fake.sbatches()) == 1  # the second attempt was never submitted


def test_an_older_job_folder_of_the_user_is_taken_back_and_its_links_refused(
    slurm: tuple[SlurmBackend, Slurm], tmp_path: Path
) -> None:
    """An older version handed the whole job folder to the user, who planted links for
    everything the broker makes at the first submit."""
    backend, fake = slurm
    target = _target(tmp_path)
    before = _snapshot(target)
    jobdir = tmp_path / "jobs" / JOB
    jobdir.mkdir(parents=True)
    os.chown(jobdir, NOBODY.pw_uid, NOBODY.pw_gid)
    for name in ("checkpoint", "log.txt"):
        (jobdir / name).symlink_to(target if name == "checkpoint" else target / "keep")
    with pytest.raises(UnsafeFile, match="checkpoint is a symbolic link"):
        backend.submit(_spec(tmp_path))
    assert _owner(jobdir) == (0, 0o711)  # the job folder is the broker's again
    (jobdir / "checkpoint").unlink()
    with pytest.raises(UnsafeFile, match="log.txt is a symbolic link"):
        backend.submit(_spec(tmp_path))
    assert _snapshot(target) == before and (target / "keep").read_text() == "root's"
    assert fake.sbatches() == []


def test_a_link_inside_the_attempt_folder_is_replaced_never_written_through(
    slurm: tuple[SlurmBackend, Slurm], tmp_path: Path
) -> None:
    """The attempt folder is the user's: a link they put at spec.json or job.sh before the
    broker writes them is replaced by the file, the link's target left alone."""
    backend, _fake = slurm
    adir = tmp_path / "jobs" / JOB / "attempt-1"
    adir.mkdir(parents=True)
    os.chown(adir, NOBODY.pw_uid, NOBODY.pw_gid)
    target = _target(tmp_path)
    before = _snapshot(target)
    secret = target / "keep"
    for name in ("spec.json", "job.sh", "input.ipynb"):
        (adir / name).symlink_to(secret)
    backend.submit(_spec(tmp_path))
    assert secret.read_text() == "root's" and _snapshot(target) == before
    assert not any((adir / n).is_symlink() for n in ("spec.json", "job.sh", "input.ipynb"))


# -- whose folders, and what sbatch is told ------------------------------------------------------


def test_the_job_folder_is_roots_and_only_what_the_job_writes_is_the_users(
    slurm: tuple[SlurmBackend, Slurm], tmp_path: Path
) -> None:
    backend, fake = slurm
    old = os.umask(0o077)  # the broker's umask must not make the user's inputs unreadable
    try:
        backend.submit(_spec(tmp_path, attempt=1))
        backend.submit(_spec(tmp_path, attempt=2))  # a requeue: the same rule
    finally:
        os.umask(old)
    jobdir = tmp_path / "jobs" / JOB
    user = NOBODY.pw_uid
    owners = {p: _owner(jobdir / p)[0] for p in (
        "", "log.txt", "checkpoint", "attempt-1", "attempt-2", "attempt-2/spec.json",
        "attempt-2/input.ipynb", "attempt-2/job.sh")}
    assert owners == {"": 0, "log.txt": user, "checkpoint": user, "attempt-1": user,
                      "attempt-2": user, "attempt-2/spec.json": 0, "attempt-2/input.ipynb": 0,
                      "attempt-2/job.sh": 0}
    modes = {p: _owner(jobdir / p)[1] for p in (
        "", "log.txt", "checkpoint", "attempt-2/spec.json", "attempt-2/input.ipynb",
        "attempt-2/job.sh")}
    assert modes == {"": 0o711, "log.txt": 0o600, "checkpoint": 0o700,
                     "attempt-2/spec.json": 0o644, "attempt-2/input.ipynb": 0o644,
                     "attempt-2/job.sh": 0o755}  # readable by the user whatever the umask
    argv = fake.sbatches()[-1]
    assert argv[:4] == ["runuser", "-u", "nobody", "--"]  # sbatch as the user
    assert f"--output={jobdir / 'log.txt'}" in argv
    assert f"--chdir={jobdir / 'attempt-2'}" in argv
    spec = json.loads((jobdir / "attempt-2" / "spec.json").read_text())
    home = tmp_path / "home" / "nobody"
    # the runner delivers by walking down from the user's root, never by path
    assert (spec["output_root"], spec["output_rel"]) == (str(home), "work/out.ipynb")


def test_submit_of_a_launched_attempt_is_not_sbatched_again(
    slurm: tuple[SlurmBackend, Slurm], tmp_path: Path
) -> None:
    backend, fake = slurm
    first = backend.submit(_spec(tmp_path))
    again = backend.submit(_spec(tmp_path))
    assert again.ref["slurm_job_id"] == first.ref["slurm_job_id"] == "4242"
    assert len(fake.sbatches()) == 1


def test_a_job_found_by_name_is_the_users_own_not_one_named_so_by_another(
    slurm: tuple[SlurmBackend, Slurm], tmp_path: Path
) -> None:
    """The broker died between sbatch and writing slurm_id: the job is found by its name
    in squeue, among the user's own jobs (another user may name a job so)."""
    backend, fake = slurm
    first = backend.submit(_spec(tmp_path))
    name = "gpushare-j-slurm-trust-a1"
    fake.jobs["9999"] = (name, "RUNNING")
    fake.by_name[name].append(("9999", "mallory"))
    (tmp_path / "jobs" / JOB / "attempt-1" / "slurm_id").unlink()
    assert backend.submit(_spec(tmp_path)).ref["slurm_job_id"] == first.ref["slurm_job_id"]
    assert len(fake.sbatches()) == 1


# -- what the broker reads back from the user's attempt folder -----------------------------------


def _ended(fake: Slurm, sid: str) -> None:
    fake.jobs[sid] = (fake.jobs[sid][0], "COMPLETED")


@pytest.mark.parametrize("planted", ["link", "huge"])
def test_status_json_is_read_without_a_link_and_within_its_bound(
    slurm: tuple[SlurmBackend, Slurm], tmp_path: Path, planted: str
) -> None:
    backend, fake = slurm
    handle = backend.submit(_spec(tmp_path))
    _ended(fake, handle.ref["slurm_job_id"])
    status_json = tmp_path / "jobs" / JOB / "attempt-1" / "status.json"
    if planted == "link":  # a root-only result that would say "succeeded"
        forged = _target(tmp_path) / "ok.json"
        forged.write_text(json.dumps({"exit_code": 0, "error": None}))
        status_json.symlink_to(forged)
        why = "status.json is a symbolic link"
    else:
        status_json.write_bytes(b" " * (STATUS_MAX_BYTES + 1) + b"{}")
        why = f"over {STATUS_MAX_BYTES}"
    status = backend.poll(handle)
    assert status.finished and status.exit_code == 1, status
    assert "tampered with" in status.error["summary"] and why in status.error["summary"]


def test_a_plain_status_json_still_ends_the_attempt(
    slurm: tuple[SlurmBackend, Slurm], tmp_path: Path
) -> None:
    backend, fake = slurm
    handle = backend.submit(_spec(tmp_path))
    assert backend.poll(handle).alive
    _ended(fake, handle.ref["slurm_job_id"])
    (tmp_path / "jobs" / JOB / "attempt-1" / "status.json").write_text(
        json.dumps({"exit_code": 0, "error": None, "output_path": "x"}))
    status = backend.poll(handle)
    assert status.finished and status.exit_code == 0 and status.output_path == "x"


def test_a_status_json_of_the_wrong_types_ends_the_attempt_as_failed(
    slurm: tuple[SlurmBackend, Slurm], tmp_path: Path
) -> None:
    """status.json is in the job's own folder: its values are not believed as typed."""
    backend, fake = slurm
    handle = backend.submit(_spec(tmp_path))
    _ended(fake, handle.ref["slurm_job_id"])
    (tmp_path / "jobs" / JOB / "attempt-1" / "status.json").write_text(json.dumps({
        "exit_code": "0; rm -rf", "error": "x" * 5000, "output_path": ["/etc/shadow"],
        "started_at": "yesterday", "terminated": "yes"}))
    status = backend.poll(handle)
    assert (status.finished, status.exit_code, status.output_path, status.started_at,
            status.terminated) == (True, 1, None, None, False)
    assert status.error == {"summary": "x" * 500}


def test_a_forged_slurm_id_in_the_attempt_folder_is_never_cancelled(
    slurm: tuple[SlurmBackend, Slurm], tmp_path: Path
) -> None:
    """The attempt folder is the user's: a slurm_id naming another user's Slurm job is
    not this attempt's (Slurm names it otherwise), so it is never signalled."""
    backend, fake = slurm
    handle = backend.submit(_spec(tmp_path))
    fake.jobs["999"] = ("gpushare-someone-else-a1", "RUNNING")
    (tmp_path / "jobs" / JOB / "attempt-1" / "slurm_id").write_text("999")
    bare = RunHandle("slurm", JOB, 1, {})  # as after a restart, before the id is known
    backend.kill(bare)
    cancelled = [c for c in fake.calls if os.path.basename(c[0]) == "scancel"]
    assert cancelled and all(c[-1] == handle.ref["slurm_job_id"] for c in cancelled), cancelled



# -- the broker's side: the attempt fails with the reason ---------------------------------------


async def test_the_broker_fails_a_job_whose_attempt_folder_is_a_link_naming_it(
    tmp_path: Path
) -> None:
    """Through a real broker with the Slurm backend (its Slurm commands recorded): the
    attempt folder appears as a link just before the backend makes it; the job fails with
    the path in its reason, nothing is submitted or made there, its grant is released."""
    config = Config()
    config.JobManager.backend_class = SlurmBackend
    config.JobManager.jobs_dir = str(tmp_path / "jobs")
    config.JobManager.user_root_template = str(tmp_path / "home" / "{username}")
    (tmp_path / "home" / "alice").mkdir(parents=True)
    app = await start_broker(load_policy(str(POLICY)), f"sqlite:///{tmp_path}/jobs.sqlite",
                             static_tokens({"alice": ["vision"]}), config=config)
    try:
        backend = app.jobs.backend
        fake = Slurm()
        backend.commands.run = fake
        backend.refusal = lambda spec: None  # the node list is not the point here
        target = _target(tmp_path)
        before = _snapshot(target)
        real_submit = backend.submit

        def racing_submit(spec: RunSpec) -> RunHandle:
            backend.job_dir(spec.job_id).mkdir(parents=True, exist_ok=True)
            backend.attempt_dir(spec.job_id, spec.attempt).symlink_to(target)
            return real_submit(spec)

        backend.submit = racing_submit
        status, job = await call(app, "POST", "/jobs", "tok-alice-srv", {
            "notebook": nbs.simple(), "profile": "job-1gpu", "max_runtime": 300})
        assert status == 201, job
        for _ in range(300):
            status, job = await call(app, "GET", f"/jobs/{job['id']}", "tok-alice")
            if job["state"] in ("failed", "succeeded", "cancelled"):
                break
            await asyncio.sleep(0.1)
        assert job["state"] == "failed", job
        where = backend.attempt_dir(job["id"], 1)
        assert f"{where} is a symbolic link" in job["reason"], job["reason"]
        assert _snapshot(target) == before and fake.sbatches() == []
        assert not app.broker.state.grants
    finally:
        await app.stop_async()


# -- on a real Slurm cluster: the user's job writes its log in the root-owned job folder ----------


@pytest.mark.slow
@needs_slurm
def test_on_a_real_cluster_the_users_job_appends_to_its_log_in_roots_job_folder() -> None:
    """The one thing the layout bets on: ``slurmstepd`` opens ``--output`` as the user, who
    can append to the log file the broker handed over although the job folder is root's
    0711. ``sbatch`` runs as ``nobody``; the batch script's "python" is ``/bin/echo`` (the
    venv is not readable by ``nobody`` here), so the log says what the runner was given."""
    base = Path(tempfile.mkdtemp(prefix="gs-slurmfiles-", dir="/tmp"))
    base.chmod(0o755)  # nobody must traverse to the jobs folder, as on a shared filesystem
    try:
        with running_cluster(nodes=["sl-u-0"], gpus_per_node=1, shards_per_gpu=4) as cluster:
            backend = SlurmBackend(jobs_dir=str(base / "jobs"), slurm_conf=cluster.conf_path,
                                   python="/bin/echo", min_poll_interval_s=0.2)
            backend.run_as = "user"
            (base / "home" / "nobody").mkdir(parents=True)
            spec = _spec(base)
            handle = backend.submit(RunSpec(**{**spec.__dict__, "grant": dict(
                GRANT, node="sl-u-0", gpus=[{"uuid": "GPU-sim-sl-u-0-0",
                                             "compute_pct": 100.0}])}))
            deadline = time.monotonic() + 60
            while backend.poll(handle).alive:
                assert time.monotonic() < deadline, backend.poll(handle)
                time.sleep(0.3)
            sid = handle.ref["slurm_job_id"]
            text = cluster.run("scontrol", "show", "job", "-o", sid).stdout
            fields = dict(w.partition("=")[::2] for w in text.split() if "=" in w)
            jobdir = base / "jobs" / JOB
            log = (jobdir / "log.txt").read_text()
    finally:
        shutil.rmtree(base, ignore_errors=True)
    assert fields["UserId"].startswith("nobody(") and fields["JobState"] == "COMPLETED", fields
    assert f"-m jupyter_gpushare.backends.papermill_run {jobdir / 'attempt-1'}" in log, log
