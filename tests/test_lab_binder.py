"""binder/: the demo grant of ``binder/start`` and the server config ``binder/postBuild``
writes give a JupyterLab whose status bar and GPU panel show simulated figures against the
demo limit, with the demo notebook open (real JupyterLab, headless Chromium)."""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path

import pytest
from labkit import (
    REPO,
    browser,
    chromium_available,
    dismiss_news,
    ensure_built,
    screenshot,
    start_lab,
    wait_shell,
)

REASON = chromium_available()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(REASON is not None, reason=str(REASON))]
BINDER = REPO / "binder"


def start_env() -> dict[str, str]:
    return dict(re.findall(r'^export (GPUSHARE_\w+)="([^"]*)"', (BINDER / "start").read_text(),
                           re.M))


def server_config() -> str:
    text = (BINDER / "postBuild").read_text()
    return text.split("<<'PY'\n", 1)[1].split("\nPY\n", 1)[0]


def test_binder_files_are_complete() -> None:
    env = start_env()
    assert env["GPUSHARE_SIMULATED"] == "1" and env["GPUSHARE_GRANT_ID"]
    assert 'sampler = "simulated"' in server_config()
    assert "npm ci" in (BINDER / "postBuild").read_text()
    assert "nodejs" in (BINDER / "environment.yml").read_text()
    assert (BINDER / "gpushare-demo.ipynb").exists()


def test_binder_demo_shows_simulated_use_against_the_demo_limit(tmp_path: Path) -> None:
    ensure_built()
    cfg = tmp_path / "config"
    cfg.mkdir(parents=True)
    (cfg / "jupyter_server_config.py").write_text(server_config())
    with start_lab(tmp_path, start_env()) as lab:
        (lab.root / "binder").mkdir()
        shutil.copy(BINDER / "gpushare-demo.ipynb", lab.root / "binder")
        with browser() as b:
            page = b.new_page(viewport={"width": 1400, "height": 850})
            page.goto(lab.url("lab/tree/binder/gpushare-demo.ipynb"))
            wait_shell(page)
            page.wait_for_function(
                "() => (document.querySelector('.jp-gpushare-status')?.innerText || '')"
                ".includes('6.0/14.0 GiB')", timeout=90000)
            item = page.locator(".jp-gpushare-status")
            assert item.locator(".jp-gpushare-sim").is_visible()
            assert "Simulated data" in (item.get_attribute("title") or "")
            item.click()
            page.wait_for_selector(".jp-gpushare-chart path.series", timeout=30000)
            time.sleep(2)
            assert "simulated" in page.locator(".jp-gpushare-panel").inner_text().lower()
            dismiss_news(page)
            screenshot(page, "lab_binder_demo")
