"""Issue 23, findings 1-4: a job's files are never reached through a link it planted.

The job's user can write in its attempt and checkpoint folders (and, before, in the whole
job folder); the broker runs as root for ``run_as = "user"``. Each test plants what a
hostile job would (a link to a root-only file, a link in place of a folder the broker
makes) and checks that nothing is served, made or handed over through it, and that the
link's target is untouched. ``nobody`` (uid 65534) is the job's user where one is needed.
"""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import stat
import subprocess
import time
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import jobnotebooks as nbs
import pytest
from brokerkit import BASE, call, start_broker, static_tokens
from tornado.httpclient import AsyncHTTPClient, HTTPRequest

from jupyter_gpushare.backends.base import RunHandle, RunSpec
from jupyter_gpushare.backends.local import LocalBackend
from jupyter_gpushare.backends.papermill_run import deliver
from jupyter_gpushare.disposition import attachment
from jupyter_gpushare.policy import load_policy
from jupyter_gpushare.userfiles import Folder, UnsafeFile

POLICY = Path(__file__).resolve().parent / "data" / "jobs_policy.yaml"
SECRET = "root-only secret 8c1f"
NOBODY = pwd.getpwnam("nobody")


def _secret(tmp_path: Path) -> Path:
    secret = tmp_path / "root-only" / "shadow"
    secret.parent.mkdir(mode=0o700)
    secret.write_text(SECRET)
    secret.chmod(0o600)
    return secret


def _snapshot(folder: Path) -> list[tuple[str, int, int, int]]:
    """What a folder holds and who owns it (to check a link's target is untouched)."""
    out = []
    for path in sorted([folder, *folder.rglob("*")]):
        st = path.lstat()
        out.append((str(path.relative_to(folder)), st.st_uid, st.st_gid, st.st_mode))
    return out


# -- the primitives ---------------------------------------------------------------------------


def test_a_link_in_any_component_is_refused_and_named(tmp_path: Path) -> None:
    root = tmp_path / "home" / "al"
    (root / "real").mkdir(parents=True)
    outside = tmp_path / "home" / "alice"
    outside.mkdir()
    (root / "work").symlink_to(outside)
    with pytest.raises(UnsafeFile) as err:
        Folder.under(str(root), "work/deep", create=True)
    assert "work is a symbolic link" in str(err.value)
    assert list(outside.iterdir()) == []  # nothing made through it
    with Folder.under(str(root), "real/deep", create=True) as made:
        assert made.shown.endswith("real/deep")
    assert (root / "real" / "deep").is_dir()


def test_a_file_that_is_a_link_fifo_or_hard_link_is_not_opened(tmp_path: Path) -> None:
    secret = _secret(tmp_path)
    jobdir = tmp_path / "job"
    jobdir.mkdir()
    (jobdir / "log.txt").symlink_to(secret)
    os.mkfifo(jobdir / "fifo")
    os.link(secret, jobdir / "hard")
    (jobdir / "plain").write_text("ok")
    with Folder.root(str(jobdir)) as folder:
        for name, why in (("log.txt", "symbolic link"), ("fifo", "not a regular file"),
                          ("hard", "other hard links")):
            with pytest.raises(UnsafeFile, match=why):
                folder.open(name)
        assert folder.read("plain", 100) == b"ok"
        folder.write_atomic("log.txt", b"new")  # replaces the link, never writes through it
    assert secret.read_text() == SECRET and (jobdir / "log.txt").read_text() == "new"


# -- finding 1: a log or output swapped for a link is not served -------------------------------


@pytest.fixture
async def app(tmp_path: Path) -> Any:
    tokens = static_tokens({"alice": ["vision"], "al": ["vision"]})
    app = await start_broker(
        load_policy(str(POLICY)), f"sqlite:///{tmp_path}/jobs.sqlite", tokens,
    )
    app.jobs.user_root_template = str(tmp_path / "home" / "{username}")
    for user in ("alice", "al"):
        (tmp_path / "home" / user).mkdir(parents=True)
    yield app
    for job in list(app.jobs.store.live.values()):
        if job.handle:
            app.jobs.backend.kill(RunHandle.from_json(job.handle))
    await app.stop_async()


async def wait_state(app: Any, job_id: str, states: set[str], timeout: float = 90) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        status, job = await call(app, "GET", f"/jobs/{job_id}", "tok-alice")
        assert status == 200, job
        if job["state"] in states:
            return job
        assert time.monotonic() < deadline, (job, app.jobs.backend.read_log(job_id)[0][-3000:])
        await asyncio.sleep(0.2)


async def run_job(app: Any, nb: dict[str, Any], token: str = "tok-alice-srv",
                  **body: Any) -> Any:
    body.setdefault("profile", "job-1gpu")
    body.setdefault("max_runtime", 300)
    status, job = await call(app, "POST", "/jobs", token, {"notebook": nb, **body})
    assert status == 201, job
    return await wait_state(app, job["id"], {"succeeded", "failed", "cancelled"})


async def fetch(app: Any, path: str, token: str = "tok-alice") -> Any:
    req = HTTPRequest(f"http://127.0.0.1:{app.port}{BASE}{path}",
                      headers={"Authorization": f"token {token}"}, request_timeout=60)
    return await AsyncHTTPClient().fetch(req, raise_error=False)


@pytest.mark.slow
async def test_a_log_or_output_swapped_for_a_link_is_refused_with_the_reason(
    app: Any, tmp_path: Path
) -> None:
    secret = _secret(tmp_path)
    done = await run_job(app, nbs.simple(), path="Эксперимент.ipynb")
    assert done["state"] == "succeeded", done
    jid = done["id"]
    jobdir = Path(app.jobs.backend.job_dir(jid))
    # the job folder is the broker's: the job's user cannot replace its log at all
    assert stat.S_IMODE(jobdir.stat().st_mode) & 0o022 == 0
    # finding 4: a non-Latin name downloads (200) with both forms of the name
    resp = await fetch(app, f"/jobs/{jid}/output")
    assert resp.code == 200, resp.body
    disposition = resp.headers["Content-Disposition"]
    assert disposition.isascii() and "\r" not in disposition and "\n" not in disposition
    star = disposition.split("filename*=UTF-8''")[1]
    assert unquote(star) == Path(done["output_path"]).name
    assert Path(done["output_path"]).name.startswith("Эксперимент-")
    assert json.loads(resp.body)["nbformat"] == 4
    # what a hostile job (or an older layout where it owned the folder) does
    (jobdir / "log.txt").unlink()
    (jobdir / "log.txt").symlink_to(secret)
    output = jobdir / "attempt-1" / "output.ipynb"
    output.unlink()
    output.symlink_to(secret)
    for what in ("log", "log?tail=100", "output"):
        resp = await fetch(app, f"/jobs/{jid}/{what}")
        assert resp.code == 403, (what, resp.code, resp.body)
        body = resp.body.decode()
        assert SECRET not in body and "symbolic link" in body, body
    resp = await fetch(app, f"/jobs/{jid}/log?follow=1")
    assert SECRET not in resp.body.decode() and "symbolic link" in resp.body.decode()


@pytest.mark.parametrize(
    ("name", "fallback"),
    [
        ("work/Эксперимент.ipynb", "___________.ipynb"),
        ("a\r\nSet-Cookie: x=1.ipynb", "a__Set-Cookie: x=1.ipynb"),
        ('say "hi"\\.ipynb', "say _hi__.ipynb"),
        ("café.ipynb", "cafe.ipynb"),
    ],
)
def test_content_disposition_is_ascii_with_the_exact_name_encoded(
    name: str, fallback: str
) -> None:
    value = attachment(name)
    assert value.isascii() and "\r" not in value and "\n" not in value
    assert f'filename="{fallback}"' in value
    exact = unquote(value.split("filename*=UTF-8''")[1])
    assert exact == name.split("/")[-1].replace("\r", "_").replace("\n", "_")


@pytest.mark.slow
async def test_output_download_with_cr_lf_and_quote_in_the_name(app: Any) -> None:
    done = await run_job(app, nbs.simple())
    job = app.jobs.store.get(done["id"])
    for name in ('evil"\r\nX-Injected: 1.ipynb', "Эксперимент.ipynb"):
        app.jobs.store.update(job, output_path=name)
        resp = await fetch(app, f"/jobs/{job.id}/output")
        assert resp.code == 200, resp.body
        assert "X-Injected" not in resp.headers
        value = resp.headers["Content-Disposition"]
        assert value.count('"') == 2, value  # the quote in the name is not a quote here
        assert unquote(value.split("filename*=UTF-8''")[1]) == name.replace("\r", "_").replace(
            "\n", "_")


# -- finding 2: a checkpoint or next attempt folder swapped for a link --------------------------


def _spec(tmp_path: Path, attempt: int = 1) -> RunSpec:
    home = tmp_path / "home" / "nobody"
    return RunSpec(
        job_id="j-trust", attempt=attempt, user="nobody", notebook=nbs.simple(),
        parameters={}, output_path=str(home / "out.ipynb"), cwd=str(home), env={},
        max_runtime_s=60, output_root=str(home),
    )


@pytest.mark.parametrize("swapped", ["checkpoint", "attempt-2"])
def test_a_folder_swapped_for_a_link_is_refused_and_its_target_untouched(
    tmp_path: Path, swapped: str
) -> None:
    backend = LocalBackend(str(tmp_path / "jobs"), run_as="user")
    target = tmp_path / "root-only"
    target.mkdir(mode=0o700)
    (target / "keep").write_text("root's")
    before = _snapshot(target)
    jobdir = tmp_path / "jobs" / "j-trust"
    (jobdir / "attempt-1").mkdir(parents=True)
    (jobdir / swapped).symlink_to(target)
    with pytest.raises(UnsafeFile, match=f"{swapped} is a symbolic link"):
        backend.submit(_spec(tmp_path, attempt=2))
    assert _snapshot(target) == before  # nothing made, written or handed to the user there
    assert target.stat().st_uid == 0 and (jobdir / swapped).is_symlink()
    assert not (jobdir / "log.txt").exists()  # refused before anything was started


def test_the_job_folder_stays_roots_and_only_its_own_folders_are_the_users(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = LocalBackend(str(tmp_path / "jobs"), run_as="user")
    started: list[Any] = []

    def popen(*args: Any) -> subprocess.Popen[bytes]:  # the run itself is not the point
        started.append(args)
        return subprocess.Popen(["sleep", "30"])

    monkeypatch.setattr(backend, "_popen", popen)
    older = tmp_path / "jobs" / "j-trust"  # as an older version left it: the user's
    older.mkdir(mode=0o755)
    os.chown(older, NOBODY.pw_uid, NOBODY.pw_gid)
    handle = backend.submit(_spec(tmp_path))
    try:
        assert started and started[0][3].pw_uid == NOBODY.pw_uid  # run as the user
        jobdir = tmp_path / "jobs" / "j-trust"
        owners = {p: (jobdir / p).lstat().st_uid for p in ("", "attempt-1", "checkpoint",
                                                           "log.txt", "attempt-1/spec.json")}
        assert owners == {"": 0, "attempt-1": NOBODY.pw_uid, "checkpoint": NOBODY.pw_uid,
                          "log.txt": 0, "attempt-1/spec.json": 0}
        assert stat.S_IMODE(jobdir.stat().st_mode) == 0o711
    finally:
        os.kill(handle.ref["pid"], 9)


@pytest.mark.slow
async def test_a_requeue_into_a_linked_attempt_folder_fails_the_job_with_the_reason(
    app: Any, tmp_path: Path
) -> None:
    """The broker's side: the attempt folder appears as a link just before the broker
    makes it (as a job racing its own requeue would): the job fails, nothing is made."""
    target = tmp_path / "root-only"
    target.mkdir(mode=0o700)
    before = _snapshot(target)
    backend = app.jobs.backend
    real_submit = backend.submit

    def racing_submit(spec: RunSpec) -> RunHandle:
        (Path(backend.job_dir(spec.job_id))).mkdir(parents=True, exist_ok=True)
        Path(backend.attempt_dir(spec.job_id, spec.attempt)).symlink_to(target)
        return real_submit(spec)

    backend.submit = racing_submit
    done = await run_job(app, nbs.simple())
    assert done["state"] == "failed", done
    assert "attempt-1 is a symbolic link" in done["reason"], done["reason"]
    assert _snapshot(target) == before
    assert not app.broker.state.grants  # its grant was released


# -- finding 3: output_path re-pointed while the job ran ----------------------------------------


def _executed(tmp_path: Path) -> Path:
    local = tmp_path / "attempt" / "output.ipynb"
    local.parent.mkdir()
    local.write_text(json.dumps(nbs.simple()))
    return local


@pytest.mark.parametrize("link", ["work", "work/sub"])
def test_delivery_through_a_link_to_a_sibling_with_a_common_prefix_is_refused(
    tmp_path: Path, link: str
) -> None:
    """/home/al and /home/alice share a prefix: a link in al's files to alice's is refused
    wherever it is on the way, and nothing lands in alice's folder."""
    home = tmp_path / "home"
    al, alice = home / "al", home / "alice"
    (alice / "work" / "sub").mkdir(parents=True)
    (al / "work").mkdir(parents=True)
    before = _snapshot(alice)
    if link == "work":
        (al / "work").rmdir()
    (al / link).symlink_to(alice / link)
    spec = {"output_root": str(al), "output_rel": "work/sub/out.ipynb",
            "output_path": str(al / "work/sub/out.ipynb")}
    with pytest.raises(UnsafeFile, match="is a symbolic link"):
        deliver(_executed(tmp_path), spec)
    assert _snapshot(alice) == before
    # without the link it lands where it should (the missing folders made on the way)
    (al / link).unlink()
    assert deliver(tmp_path / "attempt" / "output.ipynb", spec) == spec["output_path"]
    assert json.loads((al / "work/sub/out.ipynb").read_text())["nbformat"] == 4
    assert _snapshot(alice) == before


def test_delivery_replaces_a_link_at_the_output_name_instead_of_writing_through_it(
    tmp_path: Path
) -> None:
    secret = _secret(tmp_path)
    al = tmp_path / "home" / "al"
    al.mkdir(parents=True)
    (al / "out.ipynb").symlink_to(secret)
    where = deliver(_executed(tmp_path), {"output_root": str(al), "output_rel": "out.ipynb",
                                          "output_path": str(al / "out.ipynb")})
    assert where == str(al / "out.ipynb")
    assert secret.read_text() == SECRET
    assert not (al / "out.ipynb").is_symlink()
    assert json.loads((al / "out.ipynb").read_text())["nbformat"] == 4


REPOINT = """
import os, time
home, sibling = os.environ['AL_HOME'], os.environ['ALICE_HOME']
os.chdir(home)
os.rename('work', 'work.moved')
os.symlink(os.path.join(sibling, 'work'), 'work')
print('re-pointed', flush=True)
"""


@pytest.mark.slow
async def test_output_path_re_pointed_after_submit_does_not_write_outside(
    app: Any, tmp_path: Path
) -> None:
    al, alice = tmp_path / "home" / "al", tmp_path / "home" / "alice"
    (al / "work").mkdir()
    (alice / "work").mkdir()
    before = _snapshot(alice)
    app.jobs.extra_env = {"AL_HOME": str(al), "ALICE_HOME": str(alice)}
    nb = nbs.notebook(nbs._cell(REPOINT))
    status, job = await call(app, "POST", "/jobs", "tok-al-srv",
                             {"notebook": nb, "profile": "job-1gpu", "max_runtime": 300,
                              "output_path": "work/out.ipynb"})
    assert status == 201, job
    deadline = time.monotonic() + 90
    while True:
        _, done = await call(app, "GET", f"/jobs/{job['id']}", "tok-al")
        if done["state"] in ("succeeded", "failed"):
            break
        assert time.monotonic() < deadline, done
        await asyncio.sleep(0.2)
    assert done["state"] == "failed", done
    assert "could not write the output notebook" in done["reason"], done["reason"]
    assert "work is a symbolic link" in done["reason"], done["reason"]
    assert _snapshot(alice) == before  # nothing landed in the sibling's folder
    assert (al / "work").is_symlink()


@pytest.mark.slow
async def test_the_output_is_sent_in_bounded_chunks_never_read_whole(
    app: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Finding 7: the download holds one chunk at a time (the benchmark measures the memory:
    benchmarks/download_output.py); a Range asks for a part only."""
    from jupyter_gpushare.broker.api import job_handlers

    done = await run_job(app, nbs.simple())
    output = Path(app.jobs.backend.attempt_dir(done["id"], 1)) / "output.ipynb"
    output.unlink()
    planted = json.dumps({"cells": [], "pad": "p" * (3 << 20)}).encode()
    output.write_bytes(planted)
    sizes: list[int] = []
    real_write = job_handlers.JobOutputHandler.write

    def counting(self: Any, chunk: Any) -> None:
        sizes.append(len(chunk))
        real_write(self, chunk)

    monkeypatch.setattr(job_handlers.JobOutputHandler, "write", counting)
    monkeypatch.setattr(app.jobs.backend, "fetch_output", None)  # the whole-file read
    resp = await fetch(app, f"/jobs/{done['id']}/output")
    assert resp.code == 200 and resp.body == planted
    assert max(sizes) <= job_handlers.STREAM_CHUNK and len(sizes) >= len(planted) // (256 << 10)
    req = HTTPRequest(f"http://127.0.0.1:{app.port}{BASE}/jobs/{done['id']}/output",
                      headers={"Authorization": "token tok-alice", "Range": "bytes=10-19"})
    part = await AsyncHTTPClient().fetch(req, raise_error=False)
    assert part.code == 206 and part.body == planted[10:20]
    assert part.headers["Content-Range"] == f"bytes 10-19/{len(planted)}"


def test_a_forged_pid_file_does_not_make_the_broker_kill_another_process(
    tmp_path: Path,
) -> None:
    """The pid file is in the job's own folder: a job that writes another process's pid
    there (with its start time) must not get that process killed by the broker (root)."""
    import psutil

    backend = LocalBackend(str(tmp_path / "jobs"))
    victim = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        attempt = tmp_path / "jobs" / "j-forged" / "attempt-1"
        attempt.mkdir(parents=True)
        (attempt / "launched").write_text("1")
        created = psutil.Process(victim.pid).create_time()
        (attempt / "pid").write_text(json.dumps({"pid": victim.pid, "create_time": created}))
        handle = RunHandle("local", "j-forged", 1, {"dir": str(attempt)})
        backend.kill(handle)
        backend.signal(handle)
        time.sleep(0.2)
        assert victim.poll() is None  # still running
        assert backend.poll(handle).alive is False  # not mistaken for the job either
    finally:
        victim.kill()
        victim.wait()


def test_an_output_path_that_leaves_the_users_root_is_refused_by_the_runner(
    tmp_path: Path,
) -> None:
    """The spec keeps the root and the relative path even when it leaves the root (a row
    from before the submit checks): the runner refuses it instead of copying by path."""
    from jupyter_gpushare.backends.local import _runner_spec

    home = tmp_path / "home" / "al"
    home.mkdir(parents=True)
    spec = _runner_spec(RunSpec(
        job_id="j", attempt=1, user="al", notebook={}, parameters={},
        output_path=str(tmp_path / "home" / "alice" / "x.ipynb"), cwd="", env={},
        max_runtime_s=1, output_root=str(home)))
    assert spec["output_root"] == str(home) and spec["output_rel"] == "../alice/x.ipynb"
    with pytest.raises(UnsafeFile, match="not a path inside its folder"):
        deliver(_executed(tmp_path), spec)
    assert not (tmp_path / "home" / "alice").exists()
