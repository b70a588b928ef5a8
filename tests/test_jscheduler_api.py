"""jupyter-scheduler's own REST API, answered by :mod:`jupyter_gpushare.scheduler` in a real
``jupyter lab`` against a real broker (issue 25, item 2): the environments are alice's
profiles, a job is a broker job with the form's priority, runtime and parameters, its
status and files come back, refusals carry the broker's reason, and each run of a job
definition is its own broker submission."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import jobnotebooks as nbs
import pytest
from jscheduler_kit import FINISHED, scheduler_stack

pytestmark = pytest.mark.slow


def job_form(**over: Any) -> dict[str, Any]:
    form = {
        "input_uri": "hello.ipynb",
        "name": "hello",
        "runtime_environment_name": "job-1gpu",
        "output_formats": ["ipynb", "html", "log"],
        "compute_type": "training",
        "parameters": {"greeting": '"hi"', "gpushare_max_runtime": "5m"},
    }
    form.update(over)
    return form


async def test_environments_are_the_users_profiles_and_priorities(tmp_path: Path) -> None:
    async with scheduler_stack(tmp_path) as s:
        status, envs = await s.lab_api("GET", "scheduler/runtime_environments")
        assert status == 200, envs
        by_name = {e["name"]: e for e in envs}
        assert set(by_name) == {"job-1gpu", "vision-1gpu", "debug-quarter"}  # not nlp-1gpu
        assert by_name["job-1gpu"]["label"] == "job-1gpu"  # the form selects by label
        assert by_name["job-1gpu"]["description"].startswith("Job on 1 GPU: 1 GPU in pool train")
        assert by_name["job-1gpu"]["compute_types"] == ["training", "research"]
        assert by_name["job-1gpu"]["default_compute_type"] == "research"
        assert by_name["debug-quarter"]["compute_types"] == ["interactive"]
        assert "runtime up to 1 h" in by_name["job-1gpu"]["description"]
        assert {f["name"] for f in by_name["job-1gpu"]["output_formats"]} == {
            "ipynb",
            "html",
            "log",
        }


async def test_a_job_runs_as_a_broker_job_and_its_files_come_back(tmp_path: Path) -> None:
    async with scheduler_stack(tmp_path) as s:
        status, made = await s.lab_api("POST", "scheduler/jobs", job_form())
        assert status == 200, made
        job_id = made["job_id"]
        status, broker_job = await s.broker_api("GET", f"/jobs/{job_id}")
        assert status == 200, broker_job
        assert (broker_job["profile"], broker_job["priority"], broker_job["max_runtime"]) == (
            "job-1gpu",
            "training",
            300,
        )
        assert broker_job["parameters"] == {"greeting": "hi"}  # the reserved ones removed
        status, panel = await s.lab_api("GET", "gpushare/api/jobs")  # the gpushare panel's list
        assert status == 200 and job_id in {j["id"] for j in panel["jobs"]}, panel
        job = await s.wait_status(job_id, FINISHED)
        assert job["status"] == "COMPLETED", job
        assert job["status_message"].startswith("gpushare succeeded"), job
        assert job["start_time"] and job["end_time"] and job["end_time"] >= job["start_time"]
        status, _ = await s.lab_api("GET", f"scheduler/jobs/{job_id}/download_files")
        assert status == 204
        folder = s.root / "jobs" / f"hello-{job_id}"
        deadline = asyncio.get_running_loop().time() + 30
        while len(list(folder.glob("*"))) < 4:  # input, ipynb, html, log
            assert asyncio.get_running_loop().time() < deadline, list(folder.glob("*"))
            await asyncio.sleep(0.2)
        executed = json.loads(next(folder.glob("hello-*-*.ipynb")).read_text())
        printed = "".join(
            "".join(o.get("text", "")) for c in executed["cells"] for o in c.get("outputs", [])
        )
        assert f"hi {job_id}" in printed, printed
        assert f"hi {job_id}" in next(folder.glob("*.html")).read_text()
        assert f"gpushare job {job_id} attempt 1" in next(folder.glob("*.log")).read_text()
        status, listed = await s.lab_api("GET", "scheduler/jobs")
        assert [j["job_id"] for j in listed["jobs"]] == [job_id]
        assert listed["jobs"][0]["downloaded"] is True


@pytest.mark.parametrize(
    ("over", "words"),
    [
        (
            {"parameters": {"gpushare_max_runtime": "2h"}},
            "(400): max_runtime 7200s is above the limit of 3600s for this profile "
            "(field max_runtime)",
        ),
        (
            {"runtime_environment_name": "nlp-1gpu"},
            "(403): profile nlp-1gpu is only for teams nlp, not team vision (field profile)",
        ),
        ({"compute_type": "interactive"}, "(field priority)"),
    ],
)
async def test_a_refusal_carries_the_brokers_reason_and_stores_nothing(
    tmp_path: Path,
    over: dict[str, Any],
    words: str,
) -> None:
    async with scheduler_stack(tmp_path) as s:
        status, answer = await s.lab_api("POST", "scheduler/jobs", job_form(**over))
        assert status == 500, answer
        assert answer["message"].startswith("gpushare broker refused the job ("), answer
        assert words in answer["message"], answer
        assert (await s.lab_api("GET", "scheduler/jobs"))[1]["jobs"] == []
        assert (await s.broker_api("GET", "/jobs"))[1]["jobs"] == []


async def test_a_bad_form_value_is_named_before_the_broker_is_asked(tmp_path: Path) -> None:
    async with scheduler_stack(tmp_path) as s:
        form = job_form(parameters={"gpushare_checkpoint": "maybe"})
        status, answer = await s.lab_api("POST", "scheduler/jobs", form)
        assert (
            status == 500
            and "gpushare_checkpoint: 'maybe' is not true or false" in answer["message"]
        ), answer
        assert (await s.broker_api("GET", "/jobs"))[1]["jobs"] == []


async def test_each_run_of_a_definition_is_admitted_on_its_own_and_stops(tmp_path: Path) -> None:
    async with scheduler_stack(tmp_path) as s:
        s.write_notebook("sleep.ipynb", nbs.sleeping(60))
        status, made = await s.lab_api(
            "POST",
            "scheduler/job_definitions",
            {
                "input_uri": "sleep.ipynb",
                "name": "sleepy",
                "output_formats": ["ipynb"],
                "runtime_environment_name": "debug-quarter",
                "compute_type": "interactive",
            },
        )
        assert status == 200, made
        runs = f"scheduler/job_definitions/{made['job_definition_id']}/jobs"
        status, first = await s.lab_api("POST", runs, {})
        assert status == 200, first
        job = await s.wait_status(first["job_id"], {"IN_PROGRESS"})
        assert job["job_definition_id"] == made["job_definition_id"]
        # the debug pool never queues: vision's 1/4 GPU is taken, so the next run is refused
        status, second = await s.lab_api("POST", runs, {})
        assert status == 500 and "gpushare broker refused the job (409)" in second["message"]
        status, _ = await s.lab_api(
            "PATCH", f"scheduler/jobs/{first['job_id']}", {"status": "STOPPED"}
        )
        assert status == 204
        job = await s.wait_status(first["job_id"], {"STOPPED"}, timeout=60)
        assert (await s.broker_api("GET", f"/jobs/{first['job_id']}"))[1]["state"] == "cancelled"
        status, third = await s.lab_api("POST", runs, {})  # the quota is free again
        assert status == 200, third
        assert third["job_id"] != first["job_id"]
        status, listed = await s.lab_api(
            "GET", f"scheduler/jobs?job_definition_id={made['job_definition_id']}"
        )
        assert {j["job_id"] for j in listed["jobs"]} == {first["job_id"], third["job_id"]}
