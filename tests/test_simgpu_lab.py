"""Issue 26 item 4 as a newcomer tries it: a notebook in real JupyterLab (headless Chromium)
runs ``use_gpu_memory`` cells, and the status bar moves with them; past the limit the
watchdog restarts the kernel and the notebook says so. Screenshots are saved as artifacts.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from labkit import (
    browser,
    chromium_available,
    dismiss_news,
    ensure_built,
    grant_env,
    screenshot,
    start_lab,
    wait_shell,
)

REASON = chromium_available()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(REASON is not None, reason=str(REASON))]
STATUS = ".jp-gpushare-status"


def cell(source: str) -> dict[str, Any]:
    return {"cell_type": "code", "metadata": {}, "source": source, "outputs": [],
            "execution_count": None}


NOTEBOOK = {
    "cells": [cell("from jupyter_gpushare.simgpu import use_gpu_memory\n"
                   "use_gpu_memory('12 GiB')"),
              cell("use_gpu_memory('20 GiB')")],
    "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3"}},
    "nbformat": 4, "nbformat_minor": 5,
}


@pytest.fixture(scope="module")
def chrome() -> Iterator[Any]:
    ensure_built()
    with browser() as b:
        yield b


def status_shows(page: Any, text: str, level: str) -> None:
    """Wait until the status bar says ``text`` at memory level ``level``."""
    try:
        _wait_status(page, text, level)
    except Exception as exc:
        item = page.locator(STATUS)
        outputs = page.locator(".jp-Notebook .jp-OutputArea").all_inner_texts()
        raise AssertionError(f"status bar {item.inner_text()!r} "
                             f"(memory {item.get_attribute('data-memory')!r}), not {text!r} at "
                             f"{level!r}; cell outputs {outputs}") from exc


def _wait_status(page: Any, text: str, level: str) -> None:
    page.wait_for_function(
        "([sel, text, level]) => { const el = document.querySelector(sel);"
        " return el && el.innerText.includes(text) && el.dataset.memory === level; }",
        arg=[STATUS, text, level], timeout=60000)


def accept_kernel(page: Any) -> None:
    """Accept JupyterLab's "Select Kernel" dialog (Python 3), where it asks."""
    button = page.locator(".jp-Dialog .jp-mod-accept")
    try:
        button.wait_for(timeout=5000)
    except Exception:
        return
    button.click()
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']",
                           timeout=60000)


def run_cell(page: Any, index: int) -> None:
    page.locator(".jp-Notebook .jp-Cell").nth(index).locator(".jp-InputArea-editor").click()
    page.keyboard.press("Shift+Enter")


def test_cells_that_use_simulated_memory_move_the_status_bar_and_trip_the_watchdog(
    tmp_path: Path, chrome: Any
) -> None:
    args = ["--GPUShareServerApp.watchdog_cooldown_s=60"]
    with start_lab(tmp_path, grant_env(), args) as lab:
        (lab.root / "try-simgpu.ipynb").write_text(json.dumps(NOTEBOOK))
        page = chrome.new_page(viewport={"width": 1400, "height": 850})
        page.goto(lab.url("lab/tree/try-simgpu.ipynb"))
        wait_shell(page)
        page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60000)
        accept_kernel(page)
        status_shows(page, "0.0/14.0 GiB", "ok")  # an idle kernel uses nothing
        run_cell(page, 0)
        status_shows(page, "12.0/14.0 GiB", "warn")  # 86 % of the limit
        dismiss_news(page)
        screenshot(page, "simgpu_statusbar_12gib", ".jp-StatusBar-Widget")
        run_cell(page, 1)
        banner = page.locator(".jp-NotebookPanel .jp-gpushare-watchdog")
        banner.wait_for(timeout=60000)
        text = banner.inner_text()
        assert "GPU memory limit 14.0 GiB exceeded: kernel of try-simgpu.ipynb used 20.0 GiB" \
            in text, text
        assert "restarted" in text, text
        status_shows(page, "0.0/14.0 GiB", "ok")  # the restarted kernel starts from nothing
        screenshot(page, "simgpu_watchdog_restarted")
