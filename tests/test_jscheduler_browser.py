"""jupyter-scheduler's own Create Job UI in real JupyterLab in headless Chromium, with
:mod:`jupyter_gpushare.scheduler` behind it and a real broker (issue 25, item 2): a job over
its profile's runtime limit is refused with the broker's reason shown in the form; the same
form with a runtime the profile allows creates a broker job that runs, shows "Completed",
brings its executed notebook back through "Download output files", and appears in the
gpushare jobs panel too."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from jscheduler_kit import Stack, scheduler_stack
from labkit import browser, chromium_available, dismiss_news, ensure_built, screenshot, wait_shell

REASON = chromium_available()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(REASON is not None, reason=str(REASON))]


def open_create_job(page: Any, notebook: str) -> None:
    """jupyter-scheduler's "Create Job" from the file browser's context menu."""
    page.locator(".jp-DirListing-item", has_text=notebook).first.click(button="right")
    page.locator(".lm-Menu-item", has_text="Create Job").first.click()
    page.wait_for_selector("#jp-create-job-environment")
    page.wait_for_selector("#jp-create-job-computeType")


def choose(page: Any, select_id: str, option: str) -> None:
    page.locator(f"#{select_id}").click()
    page.locator("li[role=option]", has_text=option).first.click()


def type_into(page: Any, name: str, text: str) -> None:
    box = page.locator(f"input[name={name}]")
    box.click()
    box.fill("")
    box.press_sequentially(text)
    box.press("Tab")


def wait_row(page: Any, status: str, timeout_s: float = 120) -> Any:
    """The job list's row once it shows ``status`` (the list reloads only when asked)."""
    for _ in range(int(timeout_s)):
        row = page.locator("tr", has_text=status)
        if row.count():
            return row.first
        page.get_by_role("button", name="Reload").click()
        page.wait_for_timeout(1000)
    raise AssertionError(f"no job row reached {status}")


def drive(s: Stack) -> str:
    with browser() as chrome:
        page = chrome.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(s.lab.url("lab"))
        wait_shell(page)
        dismiss_news(page)
        open_create_job(page, "hello.ipynb")
        choose(page, "jp-create-job-environment", "job-1gpu")
        page.get_by_title("Add new parameter").click()
        type_into(page, "parameter-0-name", "gpushare_max_runtime")
        type_into(page, "parameter-0-value", "2h")
        page.get_by_role("button", name="Create").click()
        alert = page.locator(".MuiAlert-message", has_text="gpushare broker refused")
        alert.wait_for(timeout=30000)
        assert "max_runtime 7200s is above the limit of 3600s for this profile" in (
            alert.inner_text()
        ), alert.inner_text()
        screenshot(page, "jscheduler-refused")
        type_into(page, "parameter-0-value", "5m")
        choose(page, "jp-create-job-computeType", "training")
        page.get_by_role("button", name="Create").click()
        row = wait_row(page, "Completed")
        row.get_by_role("button", name="download").click()
        link = page.locator("tr", has_text="Completed").get_by_role("link", name="Notebook")
        for _ in range(30):
            if link.count():
                break
            page.get_by_role("button", name="Reload").click()
            page.wait_for_timeout(1000)
        href = link.first.get_attribute("href") or ""
        job_id = href.split("/jobs/hello-")[1].split("/")[0]
        link.first.click()  # the executed notebook opens in the lab
        page.locator(".jp-OutputArea-output", has_text=f"hello {job_id}").first.wait_for(
            timeout=30000
        )
        screenshot(page, "jscheduler-output")
        page.get_by_title("Your GPU batch jobs").first.click()
        page.locator(f'.jp-gpushare-job[data-job-id="{job_id}"][data-state="succeeded"]').wait_for(
            timeout=30000
        )
        return job_id


async def test_create_job_in_jupyter_scheduler_ui_runs_through_the_broker(tmp_path: Path) -> None:
    await asyncio.to_thread(ensure_built)
    async with scheduler_stack(tmp_path) as s:
        job_id = await asyncio.to_thread(drive, s)
        status, jobs = await s.broker_api("GET", "/jobs")
        assert status == 200
        assert [(j["id"], j["profile"], j["priority"], j["max_runtime"]) for j in jobs["jobs"]] == [
            (job_id, "job-1gpu", "training", 300)
        ]  # the refused form stored nothing
        folder = s.root / "jobs" / f"hello-{job_id}"
        executed = json.loads(next(folder.glob("hello-*-*.ipynb")).read_text())
        assert executed["metadata"]["papermill"]["exception"] in (None, False)
