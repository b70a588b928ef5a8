"""The JupyterLab extension in a real JupyterLab in headless Chromium: status bar, GPU panel,
watchdog message, no-grant message. The server extension runs the simulated sampler with a
grant in its environment (as the spawner sets it), so the figures are real answers."""

from __future__ import annotations

import json
import time
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

NOTEBOOK = {
    "cells": [{"cell_type": "code", "metadata": {}, "source": "x = 1", "outputs": [],
               "execution_count": None}],
    "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3"}},
    "nbformat": 4, "nbformat_minor": 5,
}
HIDE = """() => {
  Object.defineProperty(document, 'hidden', {value: true, configurable: true});
  Object.defineProperty(document, 'visibilityState', {value: 'hidden', configurable: true});
  document.dispatchEvent(new Event('visibilitychange'));
}"""
SHOW = """() => {
  Object.defineProperty(document, 'hidden', {value: false, configurable: true});
  Object.defineProperty(document, 'visibilityState', {value: 'visible', configurable: true});
  document.dispatchEvent(new Event('visibilitychange'));
}"""


@pytest.fixture(scope="module")
def built() -> Path:
    return ensure_built()


@pytest.fixture(scope="module")
def chrome() -> Iterator[Any]:
    with browser() as b:
        yield b


class Traffic:
    """HTTP requests and WebSocket frames of the extension seen by the page."""

    def __init__(self, page: Any) -> None:
        self.requests: list[str] = []
        self.frames = 0
        page.on("request", self._request)
        page.on("websocket", self._ws)

    def _request(self, req: Any) -> None:
        if "/gpushare/" in req.url:
            self.requests.append(req.url)

    def _ws(self, ws: Any) -> None:
        if "/gpushare/" in ws.url:
            self.requests.append(ws.url)
            ws.on("framereceived", self._frame)

    def _frame(self, _payload: Any) -> None:
        self.frames += 1


def open_notebook(chrome: Any, lab: Any, name: str = "demo.ipynb") -> tuple[Any, Traffic]:
    (lab.root / name).write_text(json.dumps(NOTEBOOK))
    page = chrome.new_page(viewport={"width": 1400, "height": 850})
    traffic = Traffic(page)
    page.goto(lab.url(f"lab/tree/{name}"))
    wait_shell(page)
    return page, traffic


def test_status_bar_shows_own_memory_against_limit_and_which_is_high(
    tmp_path: Path, built: Path, chrome: Any
) -> None:
    # every kernel "uses" 12000 MiB of the 14336 MiB limit (84 %): memory is the high figure
    args = ["--GPUShareServerApp.simulated_kernel_memory_mib=12000",
            "--GPUShareServerApp.watchdog_enabled=False"]
    with start_lab(tmp_path, grant_env(), args) as lab:
        page, _ = open_notebook(chrome, lab)
        item = page.locator(".jp-gpushare-status")
        page.wait_for_function(
            "() => document.querySelector('.jp-gpushare-status')?.dataset.memory === 'warn'",
            timeout=60000,
        )
        text = item.inner_text()
        title = item.get_attribute("title") or ""
        assert "11.7/14.0 GiB" in text, text
        assert "of 12.5 %" in text, text  # own compute against the share, not the card's
        assert item.get_attribute("data-level") == "warn"
        assert item.get_attribute("data-compute") == "ok"
        assert "Memory is getting close to your limit" in title, title
        assert "11.7 GiB of 14.0 GiB" in title, title
        assert "Simulated data" in title
        assert page.locator(".jp-gpushare-status .jp-gpushare-sim").is_visible()
        dismiss_news(page)
        screenshot(page, "lab_statusbar_warn", ".jp-StatusBar-Widget")
        screenshot(page, "lab_statusbar_full")


def test_status_bar_sends_nothing_while_the_tab_is_hidden(
    tmp_path: Path, built: Path, chrome: Any
) -> None:
    with start_lab(tmp_path, grant_env()) as lab:
        page, traffic = open_notebook(chrome, lab)
        page.wait_for_selector(".jp-gpushare-status[data-level='ok']", timeout=120000)
        # (Playwright delivers page events only inside its own calls: wait with it, not sleep)
        page.wait_for_timeout(3000)
        assert traffic.frames >= 2, "the stream should deliver about one sample a second"
        # headless Chromium keeps every tab visible: hide this one as the browser would
        page.evaluate(HIDE)
        page.wait_for_timeout(500)
        before_req, before_frames = len(traffic.requests), traffic.frames
        received = page.evaluate("() => window.__gpushare.stream.received")
        page.wait_for_timeout(6000)
        assert traffic.requests[before_req:] == []
        assert traffic.frames == before_frames, "messages arrived while the tab was hidden"
        assert page.evaluate("() => window.__gpushare.stream.received") == received
        state = page.evaluate("() => window.__gpushare.stream.state")
        assert state == "paused"
        # one stream for the tab, not one per widget or per interval
        ws = [u for u in traffic.requests if "metrics/stream" in u]
        assert len(ws) == 1, ws
        page.evaluate(SHOW)
        deadline = time.monotonic() + 20
        while traffic.frames < before_frames + 2 and time.monotonic() < deadline:
            page.wait_for_timeout(250)
        state = page.evaluate("() => window.__gpushare.stream.state")
        assert traffic.frames >= before_frames + 2, f"the stream did not resume when shown: {state}"



def test_panel_charts_fill_from_history_and_update(
    tmp_path: Path, built: Path, chrome: Any
) -> None:
    args = ["--GPUShareServerApp.simulated_kernel_memory_mib=6000",
            "--GPUShareServerApp.watchdog_enabled=False"]
    with start_lab(tmp_path, grant_env(), args) as lab:
        page, traffic = open_notebook(chrome, lab)
        page.wait_for_selector(".jp-gpushare-status[data-level='ok']", timeout=120000)
        page.wait_for_timeout(4000)  # some history on the server before the panel opens
        seen = len(traffic.requests)
        page.locator(".jp-gpushare-status").click()
        page.wait_for_selector(".jp-gpushare-chart path.series", timeout=30000)
        assert any("metrics/history" in u for u in traffic.requests[seen:]), traffic.requests
        first = page.locator(".jp-gpushare-chart path.series").first.get_attribute("d") or ""
        assert first.count("L") >= 2, "history should fill the chart when the panel opens"
        page.wait_for_timeout(3000)
        later = page.locator(".jp-gpushare-chart path.series").first.get_attribute("d") or ""
        assert later.count("L") > first.count("L"), "the chart did not grow with live samples"
        panel = page.locator(".jp-gpushare-panel")
        assert "Your GPU memory" in panel.inner_text()
        assert "limit 14.0 GiB" in panel.locator(".jp-gpushare-chart").first.inner_text()
        assert "demo.ipynb" in panel.locator(".jp-gpushare-table").first.inner_text()
        assert "debug-eighth" in panel.inner_text()
        labels = page.locator(".jp-gpushare-chart").first.locator("text.axis").evaluate_all(
            "els => els.map(e => e.textContent)")
        times = [t for t in labels if t == "now" or t.startswith("-")]
        assert len(times) == len(set(times)) == 4, labels  # distinct time labels
        dismiss_news(page)
        screenshot(page, "lab_panel", "#jp-gpushare-panel")
        screenshot(page, "lab_panel_full")


def test_no_grant_says_so_instead_of_empty_axes(tmp_path: Path, built: Path, chrome: Any) -> None:
    with start_lab(tmp_path, {}) as lab:
        page, _ = open_notebook(chrome, lab)
        # the item is born with data-level 'none' (before any sample) and the host's CPU and
        # memory may be shown before the first GPU sample: wait for the GPU's own words
        page.wait_for_function(
            "() => document.querySelector('.jp-gpushare-status')"
            "?.textContent.includes('GPU: none')",
            timeout=60000,
        )
        status = page.locator(".jp-gpushare-status")
        assert status.inner_text().startswith("GPU: none")
        assert status.get_attribute("data-level") == "none"
        page.locator(".jp-gpushare-status").click()
        msg = page.locator(".jp-gpushare-message")
        msg.wait_for(timeout=30000)
        page.wait_for_function(
            "() => document.querySelector('.jp-gpushare-message')"
            "?.textContent.includes('no GPU grant')",
            timeout=30000,
        )
        assert not page.locator(".jp-gpushare-charts").is_visible()
        dismiss_news(page)
        screenshot(page, "lab_panel_no_grant", "#jp-gpushare-panel")


def test_watchdog_message_shows_in_the_notebook(tmp_path: Path, built: Path, chrome: Any) -> None:
    # every kernel "uses" 20000 MiB against a 14336 MiB limit: the watchdog restarts it
    args = ["--GPUShareServerApp.simulated_kernel_memory_mib=20000",
            "--GPUShareServerApp.watchdog_cooldown_s=60"]
    with start_lab(tmp_path, grant_env(), args) as lab:
        page, _ = open_notebook(chrome, lab)
        banner = page.locator(".jp-NotebookPanel .jp-gpushare-watchdog")
        banner.wait_for(timeout=90000)
        text = banner.inner_text()
        assert "GPU memory limit 14.0 GiB exceeded" in text, text
        assert "demo.ipynb" in text and "restarted" in text, text
        box = banner.bounding_box()
        assert box is not None and box["height"] >= 30, box  # laid out, not squeezed to 0
        dismiss_news(page)
        screenshot(page, "lab_watchdog_banner")
