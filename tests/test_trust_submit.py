"""Issue 23, findings 5 and 6 and the jobs rules: what ``POST /jobs`` refuses before it
holds a GPU share, and what a requeue resets.

An in-process broker runs the small policy of ``data/jobs_policy.yaml`` with an inert
backend: it is the local backend (so the broker knows which kernels are installed) that
starts nothing, so admitted jobs stay "running" and no kernel process is spent.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jobnotebooks as nbs
import pytest
from brokerkit import call, start_broker, static_tokens
from traitlets.config import Config

from jupyter_gpushare.backends.base import RunHandle, RunSpec, RunStatus
from jupyter_gpushare.backends.local import LocalBackend
from jupyter_gpushare.core.jobs import parameter_name_error
from jupyter_gpushare.policy import load_policy

POLICY = Path(__file__).resolve().parent / "data" / "jobs_policy.yaml"


class InertBackend(LocalBackend):
    """The local backend (same name, same folders) whose runs never start a process."""

    def submit(self, spec: RunSpec) -> RunHandle:
        self.attempt_dir(spec.job_id, spec.attempt).mkdir(parents=True, exist_ok=True)
        return RunHandle(self.name, spec.job_id, spec.attempt, {"inert": True})

    def poll(self, handle: RunHandle) -> RunStatus:
        return RunStatus(alive=True, started=True)

    def signal(self, handle: RunHandle) -> None:
        return None

    def kill(self, handle: RunHandle) -> None:
        return None


async def _start(tmp_path: Path, **jobs: Any) -> Any:
    config = Config()
    config.JobManager.backend_class = InertBackend
    config.JobManager.user_root_template = str(tmp_path / "home" / "{username}")
    for key, value in jobs.items():
        setattr(config.JobManager, key, value)
    for user in ("alice", "bob"):
        (tmp_path / "home" / user).mkdir(parents=True)
    return await start_broker(
        load_policy(str(POLICY)), f"sqlite:///{tmp_path}/jobs.sqlite",
        static_tokens({"alice": ["vision"], "bob": ["nlp"]}), config=config,
    )


@pytest.fixture
async def app(tmp_path: Path) -> Any:
    app = await _start(tmp_path)
    yield app
    await app.stop_async()


async def submit(app: Any, nb: dict[str, Any] | None = None, token: str = "tok-bob",
                 **body: Any) -> tuple[int, Any]:
    body.setdefault("profile", "job-1gpu")
    body.setdefault("max_runtime", 300)
    return await call(app, "POST", "/jobs", token, {"notebook": nb or nbs.simple(), **body})


async def assert_nothing_stored(app: Any) -> None:
    assert (await call(app, "GET", "/jobs?all=1", "tok-admin"))[1]["jobs"] == []
    assert not app.broker.state.grants and not app.broker.queue


# -- finding 5: parameter names ----------------------------------------------------------------


@pytest.mark.parametrize("name", ["class", "None", "True", "lambda", "import", "1x", "a-b",
                                  "ﬁle", ""])
def test_a_parameter_name_that_cannot_be_assigned_is_refused(name: str) -> None:
    assert parameter_name_error(name) is not None


@pytest.mark.parametrize("name", ["lr", "_", "match", "type", "case", "épsilon", "x" * 100])
def test_a_parameter_name_python_can_assign_is_accepted(name: str) -> None:
    assert parameter_name_error(name) is None
    exec(compile(f"{name} = 1", "<injected>", "exec"), {})  # what papermill writes


async def test_keyword_parameter_names_are_refused_at_submit(app: Any) -> None:
    for name in ("class", "None", "x" * 101):
        status, answer = await submit(app, parameters={name: 1, "ok": 2})
        assert status == 400, answer
        assert answer["field"].startswith("parameters.") and len(answer["field"]) < 60, answer
        assert name[:40] in answer["field"]
    too_many = {f"p{i}": i for i in range(65)}
    status, answer = await submit(app, parameters=too_many)
    assert (status, answer["field"]) == (400, "parameters")
    status, answer = await submit(app, parameters={"big": "x" * 20000})
    assert (status, answer["field"]) == (400, "parameters") and "bytes" in answer["error"]
    await assert_nothing_stored(app)
    status, answer = await submit(app, parameters={"match": 1, "lr": 0.1})
    assert status == 201, answer


# -- finding 6: the kernel ---------------------------------------------------------------------


async def test_a_notebook_without_kernelspec_is_refused_before_any_grant(app: Any) -> None:
    nb = nbs.simple()
    nb["metadata"] = {}
    status, answer = await submit(app, nb, name="train.ipynb")
    assert (status, answer["field"]) == (400, "notebook.metadata.kernelspec"), answer
    assert "train.ipynb" in answer["error"] and "kernelspec" in answer["error"]
    nb["metadata"] = {"kernelspec": {"display_name": "Python 3"}}
    status, answer = await submit(app, nb, path="dir/exp.ipynb")
    assert (status, answer["field"]) == (400, "notebook.metadata.kernelspec.name"), answer
    assert "dir/exp.ipynb" in answer["error"]
    await assert_nothing_stored(app)


async def test_a_kernel_not_installed_where_jobs_run_is_refused(app: Any) -> None:
    nb = nbs.simple()
    nb["metadata"]["kernelspec"]["name"] = "julia-1.9"
    status, answer = await submit(app, nb, name="jl.ipynb")
    assert (status, answer["field"]) == (400, "notebook.metadata.kernelspec.name"), answer
    assert "julia-1.9" in answer["error"] and "python3" in answer["error"], answer
    await assert_nothing_stored(app)
    nb["metadata"]["kernelspec"]["name"] = "Python3"  # kernel names are case-insensitive
    status, answer = await submit(app, nb)
    assert status == 201, answer


async def test_a_cluster_backend_cannot_know_the_kernels_and_does_not_guess(app: Any) -> None:
    app.jobs.backend.name = "elsewhere"  # e.g. Slurm: kernels are installed on its nodes
    nb = nbs.simple()
    nb["metadata"]["kernelspec"]["name"] = "julia-1.9"
    status, answer = await submit(app, nb, backend="elsewhere")
    assert status == 201, answer
    nb["metadata"] = {}  # but it must still name one
    status, answer = await submit(app, nb, backend="elsewhere")
    assert (status, answer["field"]) == (400, "notebook.metadata.kernelspec"), answer
