"""The lab extension's rough edges (issue 26 items 7, 8, 11-16) against a REAL JupyterHub with
its proxy, the broker it starts and real single-user servers (simulated GPUs), in headless
Chromium: the job history (names, times in local time, sorting, filtering, delete, download,
HTML beside the notebook, launcher tile), the live log that follows, a confirmation before
cancelling, a job without output says so, the CPU-only profile in the switch dialog, the team
table that fits, and the spawn page that says why a preempted server stopped."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import jobnotebooks as nbs
import pytest
from labkit import browser, chromium_available, ensure_built, lab_dirs, screenshot
from playwright.sync_api import TimeoutError as PlaywrightTimeout
from realhub import free_port, proxy_available, real_hub

REASON = chromium_available() or (
    None if proxy_available() else "configurable-http-proxy is not installed (hub_config/proxy)"
)
pytestmark = [pytest.mark.hub, pytest.mark.slow,
              pytest.mark.skipif(REASON is not None, reason=str(REASON))]
POLICY = Path(__file__).resolve().parent / "data" / "lab_edges_policy.yaml"
ZONE = "Asia/Kolkata"  # +05:30: a local time no UTC clock shows


class Hub:
    def __init__(self, hub: Any, tmp: Path) -> None:
        self.hub, self.tmp, self.url = hub, tmp, hub.url

    def home(self, user: str) -> Path:
        return self.tmp / "home" / user

    def spawn(self, user: str, profile: str, wait: bool = True) -> int:
        status, _ = self.hub.api("POST", f"/users/{user}/server", {"profile": profile},
                                 timeout=120)
        if wait and status in (201, 202):
            deadline = time.monotonic() + 120
            while True:
                srv = (self.hub.api("GET", f"/users/{user}")[1].get("servers") or {}).get("")
                if srv and srv.get("ready"):
                    break
                assert time.monotonic() < deadline, self.hub.log_text()[-4000:]
                time.sleep(0.4)
        return int(status)

    def stop(self, user: str) -> None:
        self.hub.api("DELETE", f"/users/{user}/server", timeout=60)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if "" not in (self.hub.api("GET", f"/users/{user}")[1].get("servers") or {}):
                return
            time.sleep(0.3)

    def lab_api(self, user: str, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        import urllib.error
        import urllib.request

        req = urllib.request.Request(
            f"{self.url}/user/{user}/{path}", method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"token {self.hub.token_for(user)}",
                     "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                raw = r.read()
                return r.status, json.loads(raw) if raw else None
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode(errors="replace")

    def submit(self, user: str, path: str, **over: Any) -> dict[str, Any]:
        body = {"path": path, "profile": "job-1gpu", "max_runtime": 300, **over}
        code, job = self.lab_api(user, "POST", "gpushare/api/jobs", body)
        assert code in (200, 201), (code, job)
        return dict(job)

    def wait_job(self, user: str, job_id: str, states: tuple[str, ...]) -> dict[str, Any]:
        deadline = time.monotonic() + 150
        while True:
            code, job = self.lab_api(user, "GET", f"gpushare/api/jobs/{job_id}")
            if code == 200 and job["state"] in states:
                return dict(job)
            assert time.monotonic() < deadline, (states, job.get("state"), job.get("reason"))
            time.sleep(0.5)


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    ensure_built()
    tmp = tmp_path_factory.mktemp("labedges")
    env = lab_dirs(tmp / "lab")
    port = free_port()
    extra = f"""
c.SimpleLocalProcessSpawner.home_dir_template = HUB_TMP + "/home/{{username}}"
c.Spawner.default_url = "/lab"
c.Spawner.args = ["--allow-root", "--GPUShareServerApp.notices_interval_s=1"]
from jupyter_gpushare.hubsetup import setup_gpushare
setup_gpushare(c, {str(POLICY)!r}, spawner="simple", broker_port={port}, data_dir=HUB_TMP,
               admin_users=["ada"], broker_args=["--BrokerApp.reconcile_min_age_s=0",
                                                 "--JobManager.cancel_grace_s=2"])
c.GPUShareSpawner.policy_file = {str(POLICY)!r}
c.Spawner.environment.update({json.dumps(env)})
"""
    with real_hub(tmp, extra) as h:
        for name, groups in [("alice", ["vision"]), ("amy", ["vision"]), ("bob", ["nlp"]),
                             ("bea", ["nlp"])]:
            h.create_user(name, groups=groups)
        hub = Hub(h, tmp)
        work = hub.home("alice") / "work"
        work.mkdir(parents=True)
        (work / "demo.ipynb").write_text(json.dumps(nbs.simple()))
        (work / "fails.ipynb").write_text(json.dumps(nbs.raising()))
        steps = nbs.notebook(nbs._cell(
            "import time\nfor i in range(1500):\n"
            "    print('\\n'.join(f'step {i} line {j}' for j in range(30)), flush=True)\n"
            "    time.sleep(0.1)"))
        (work / "count.ipynb").write_text(json.dumps(steps))
        yield hub
        for user in ("alice", "amy", "bob", "bea"):
            h.api("DELETE", f"/users/{user}/server")


@pytest.fixture(scope="module")
def chrome() -> Iterator[Any]:
    with browser() as b:
        yield b


def login(chrome: Any, hub: Hub, user: str, path: str = "lab") -> Any:
    ctx = chrome.new_context(viewport={"width": 1400, "height": 900}, timezone_id=ZONE,
                             accept_downloads=True)
    page = ctx.new_page()
    page.goto(f"{hub.url}/hub/login")
    page.fill("#username_input", user)
    page.fill("#password_input", "any")
    page.click("#login_submit")
    page.wait_for_url(lambda url: "/hub/login" not in url, timeout=60000)
    if path:
        page.goto(f"{hub.url}/user/{user}/{path}")
        page.wait_for_selector("#jp-main-dock-panel", timeout=90000)
        page.wait_for_selector(".jp-gpushare-status", timeout=60000)
    return page


def open_jobs(page: Any) -> Any:
    tile = page.locator(".jp-LauncherCard", has_text="GPU Jobs")
    try:
        tile.first.wait_for(timeout=15000)
    except PlaywrightTimeout:  # a restored workspace opened other tabs: File > New Launcher
        page.locator(".lm-MenuBar-itemLabel", has_text="File").click()
        page.locator(".lm-Menu-item", has_text="New Launcher").click()
    tile.first.click()  # the launcher tile
    panel = page.locator("#jp-gpushare-jobs")
    panel.wait_for(state="visible", timeout=30000)
    return panel


def row_of(page: Any, job_id: str) -> Any:
    return page.locator(f".jp-gpushare-job[data-job-id='{job_id}']")


def local(iso: str) -> str:
    """The time the page must show for ``iso`` in the page's zone (24-hour, today)."""
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).astimezone(
        ZoneInfo(ZONE)).strftime("%H:%M")


def test_live_log_follows_and_cancel_asks_first_and_the_cancelled_run_says_so(
    hub: Hub, chrome: Any
) -> None:
    """Items 8, 15, 7: the log box follows new lines (not after the user scrolls up), a
    running job is cancelled only after a confirmation, and a run without output says so."""
    hub.spawn("alice", "debug-eighth")
    job = hub.submit("alice", "work/count.ipynb", max_runtime=600)
    hub.wait_job("alice", job["id"], ("running",))
    page = login(chrome, hub, "alice")
    open_jobs(page)
    row = row_of(page, job["id"])
    row.wait_for(timeout=30000)
    row.locator("button[data-action=log]").click()
    log = row.locator("pre.jp-gpushare-log-tail")
    deadline = time.monotonic() + 90
    while not re.search(r"step [3-9]\d* line 29", log.text_content() if log.count() else ""):
        if time.monotonic() > deadline:
            screenshot(page, "lab_edges_log_follows_failed")
            pytest.fail(f"no 'step 3+ line 29' in the log box: {log.count()} box(es), "
                        f"{(log.text_content() if log.count() else '')[-600:]!r}")
        page.wait_for_timeout(500)
    at_end = ("() => { const p = document.querySelector('pre.jp-gpushare-log-tail');"
              " return p.scrollHeight > p.clientHeight + 20"
              " && p.scrollTop + p.clientHeight >= p.scrollHeight - 8; }")
    # more lines and at least one redraw of the list (every 5 s): still at the newest line
    page.wait_for_timeout(6000)
    assert page.evaluate(at_end), log.evaluate(
        "p => [p.scrollTop, p.clientHeight, p.scrollHeight]")
    screenshot(page, "lab_edges_log_follows", "#jp-gpushare-jobs")
    # the user scrolls up to read: new lines do not pull the box down
    log.evaluate("p => { p.scrollTop = 0; p.dispatchEvent(new Event('scroll')); }")
    page.wait_for_timeout(3000)
    assert log.evaluate("p => p.scrollTop") == 0
    assert log.get_attribute("data-follow") == "no"
    # cancel asks first; "Keep running" keeps it running
    row.locator("button[data-action=cancel]").click()
    dialog = page.locator(".jp-Dialog")
    dialog.wait_for(timeout=10000)
    text = dialog.inner_text()
    assert "Cancel job count.ipynb?" in text and "running since" in text, text
    screenshot(page, "lab_edges_cancel_confirm", ".jp-Dialog-content")
    dialog.locator("button", has_text="Keep running").click()
    page.wait_for_timeout(2000)
    assert hub.lab_api("alice", "GET", f"gpushare/api/jobs/{job['id']}")[1]["state"] == "running"
    row.locator("button[data-action=cancel]").click()
    page.locator(".jp-Dialog button", has_text="Cancel job").click()
    ended = hub.wait_job("alice", job["id"], ("cancelled",))
    page.wait_for_function(
        f"() => document.querySelector(\"[data-job-id='{job['id']}']\")?.dataset.state"
        " === 'cancelled'", timeout=30000)
    # the log ends saying it was stopped on request and that the job was cancelled
    page.wait_for_function(
        "() => /\\[job cancelled at \\d\\d:\\d\\d/.test("
        "document.querySelector('pre.jp-gpushare-log-tail')?.textContent || '')", timeout=30000)
    tail = log.text_content() or ""
    assert "stopped on request (SIGTERM)" in tail, tail[-800:]
    assert "DeadKernelError" not in tail, tail[-800:]
    # its output: offered when the run wrote some, else the button says why there is none
    buttons = row.locator(".jp-gpushare-job-buttons")
    page.wait_for_function(
        f"() => !!document.querySelector(\"[data-job-id='{job['id']}'] "
        ".jp-gpushare-job-buttons\")?.dataset.output", timeout=30000)
    if buttons.get_attribute("data-output") == "yes":
        row.locator("button[data-action=open]").click()
        page.locator(".lm-TabBar-tab", has_text=re.compile(r"count-.*\.ipynb")).wait_for(
            timeout=30000)
    else:
        row.locator("button[data-action=no-output]").click()
        dialog = page.locator(".jp-Dialog")
        dialog.wait_for(timeout=10000)
        text = dialog.inner_text()
        assert "has no output notebook" in text and "cancelled" in text, text
        assert ended["output_path"] in text, text
        screenshot(page, "lab_edges_cancelled_no_output", ".jp-Dialog-content")
        dialog.locator("button", has_text="Close").click()
    screenshot(page, "lab_edges_cancelled_row", "#jp-gpushare-jobs")
    page.context.close()


def test_a_failed_job_without_output_says_so_instead_of_a_silent_404(hub: Hub, chrome: Any) -> None:
    """Item 7: "Open output" of a failed job whose notebook was never written explains."""
    hub.spawn("alice", "debug-eighth")
    # over its runtime of 1 s before its notebook ran: failed
    job = hub.submit("alice", "work/demo.ipynb", max_runtime=1)
    ended = hub.wait_job("alice", job["id"], ("failed",))
    out = hub.home("alice") / ended["output_path"]
    if out.exists():
        out.unlink()  # as when the run failed before papermill wrote it
    page = login(chrome, hub, "alice")
    open_jobs(page)
    row = row_of(page, job["id"])
    row.wait_for(timeout=30000)
    buttons = row.locator(".jp-gpushare-job-buttons[data-output='no']")
    buttons.wait_for(timeout=30000)
    assert not row.locator("button[data-action=open]").is_visible()  # nothing to open
    row.locator("button[data-action=no-output]").click()
    dialog = page.locator(".jp-Dialog", has_text="No output notebook")
    dialog.wait_for(timeout=10000)
    assert ended["output_path"] in dialog.inner_text()
    screenshot(page, "lab_edges_no_output_dialog", ".jp-Dialog-content")
    assert "failed" in dialog.inner_text() and "maximum runtime" in dialog.inner_text()
    dialog.locator("button", has_text="Show log").click()
    row.locator("pre.jp-gpushare-log-tail").wait_for(timeout=10000)
    screenshot(page, "lab_edges_failed_no_output_row", "#jp-gpushare-jobs")
    page.context.close()


def test_job_history_times_sort_filter_download_html_and_delete(hub: Hub, chrome: Any) -> None:
    """Items 16 and 14: the job history as jupyter-scheduler users expect it."""
    hub.spawn("alice", "debug-eighth")
    ok = hub.submit("alice", "work/demo.ipynb")
    bad = hub.submit("alice", "work/fails.ipynb")
    ok = hub.wait_job("alice", ok["id"], ("succeeded",))
    bad = hub.wait_job("alice", bad["id"], ("failed",))
    page = login(chrome, hub, "alice")
    panel = open_jobs(page)
    row = row_of(page, ok["id"])
    row.wait_for(timeout=30000)
    times = row.locator(".jp-gpushare-job-time")
    texts = times.all_inner_texts()
    assert [t.split(" ")[0] for t in texts] == ["submitted", "started", "ended"], texts
    # the user's local time (the browser's zone, +05:30), 24-hour, not UTC or ISO
    assert texts[0] == f"submitted {local(ok['created_at'])}", (texts, ok["created_at"])
    assert texts[2] == f"ended {local(ok['ended_at'])}", (texts, ok["ended_at"])
    title = times.first.get_attribute("title") or ""
    assert re.search(r"\d\d:\d\d:\d\d (GMT\+5:30|IST)", title), title
    # filter and sort
    panel.locator("input.jp-gpushare-jobs-search").fill("fails")
    page.wait_for_timeout(300)
    shown = panel.locator(".jp-gpushare-job").evaluate_all("rs => rs.map(r => r.dataset.jobId)")
    assert bad["id"] in shown and ok["id"] not in shown, shown
    panel.locator("input.jp-gpushare-jobs-search").fill("")
    panel.locator("select.jp-gpushare-jobs-state").select_option("succeeded")
    states = panel.locator(".jp-gpushare-job").evaluate_all("rs => rs.map(r => r.dataset.state)")
    assert states and set(states) == {"succeeded"}, states
    panel.locator("select.jp-gpushare-jobs-state").select_option("all")
    panel.locator("select.jp-gpushare-jobs-sort").select_option("oldest")
    ids = panel.locator(".jp-gpushare-job").evaluate_all("rs => rs.map(r => r.dataset.jobId)")
    assert ids.index(ok["id"]) < ids.index(bad["id"]), ids
    panel.locator("select.jp-gpushare-jobs-sort").select_option("newest")
    ids = panel.locator(".jp-gpushare-job").evaluate_all("rs => rs.map(r => r.dataset.jobId)")
    assert ids.index(bad["id"]) < ids.index(ok["id"]), ids
    page.add_style_tag(content=".Toastify { display: none !important; }")  # toasts cover it
    box = panel.bounding_box()
    for b in row.locator("button:visible").all():  # none cut by the narrow panel
        bb = b.bounding_box()
        assert bb and box and bb["x"] + bb["width"] <= box["x"] + box["width"] + 0.5, b.inner_text()
        assert b.evaluate("e => e.scrollWidth <= e.clientWidth + 1"), b.inner_text()
    screenshot(page, "lab_edges_job_history", "#jp-gpushare-jobs")
    # download: the executed notebook under its own name
    with page.expect_download(timeout=30000) as dl:
        row.locator("button[data-action=download]").click()
    name = Path(ok["output_path"]).name
    assert dl.value.suggested_filename == name, dl.value.suggested_filename
    assert json.loads(Path(dl.value.path()).read_text())["cells"], "an empty download"
    # HTML beside the notebook, opened
    row.locator("button[data-action=html]").click()
    html = (hub.home("alice") / ok["output_path"]).with_suffix(".html")
    deadline = time.monotonic() + 30
    while not html.exists():
        assert time.monotonic() < deadline, "no HTML beside the output notebook"
        time.sleep(0.3)
    assert "<html" in html.read_text().lower()
    page.locator(".lm-TabBar-tab", has_text=html.name).wait_for(timeout=30000)
    # delete: asks, then the row and the output files are gone
    row.locator("button[data-action=delete]").click()
    dialog = page.locator(".jp-Dialog", has_text="Delete job")
    dialog.wait_for(timeout=10000)
    assert ok["output_path"] in dialog.inner_text()
    dialog.locator("button", has_text="Delete").click()
    row.wait_for(state="detached", timeout=10000)
    assert not (hub.home("alice") / ok["output_path"]).exists()
    assert not html.exists()
    page.context.close()


def test_switch_dialog_offers_cpu_only_without_saying_not_for_your_teams(
    hub: Hub, chrome: Any
) -> None:
    """Item 11."""
    hub.spawn("alice", "debug-eighth")
    page = login(chrome, hub, "alice")
    page.locator(".jp-gpushare-status").click()
    page.locator(".jp-gpushare-switch-button").click()
    dialog = page.locator(".jp-Dialog", has=page.locator(".jp-gpushare-switch"))
    dialog.wait_for(timeout=30000)
    option = dialog.locator("select[name=profile] option[value='cpu-only']")
    text = option.inner_text()
    assert "not for your teams" not in text, text
    assert "no GPU" in text and "starts now" in text, text
    dialog.locator("select[name=profile]").select_option("cpu-only")
    screenshot(page, "lab_edges_switch_cpu_only", ".jp-Dialog-content")
    dialog.locator(".jp-mod-reject").click()
    page.context.close()


def test_team_table_shows_its_gpu_hours_column_whole(hub: Hub, chrome: Any) -> None:
    """Item 13: the panel's team table fits the side panel."""
    hub.spawn("alice", "debug-eighth")
    page = login(chrome, hub, "alice")
    page.locator(".jp-gpushare-status").click()
    table = page.locator(".jp-gpushare-team-table")
    table.wait_for(timeout=60000)
    head = table.locator("th").last
    assert head.inner_text().startswith("GPU-hours"), head.inner_text()
    panel = page.locator("#jp-gpushare-panel").bounding_box()
    for cell in [head, *table.locator("td:last-child").all()]:
        box = cell.bounding_box()
        assert box is not None and panel is not None
        assert box["x"] + box["width"] <= panel["x"] + panel["width"] + 0.5, (box, panel)
        assert cell.evaluate("c => c.scrollWidth <= c.clientWidth + 1"), cell.inner_text()
    cut = table.evaluate("t => t.scrollWidth > t.parentElement.clientWidth + 1")
    assert not cut, "the team table is wider than the panel"
    page.add_style_tag(content=".Toastify { display: none !important; }")  # toasts cover it
    page.locator(".jp-gpushare-team-table").scroll_into_view_if_needed()
    screenshot(page, "lab_edges_team_table", ".jp-gpushare-section:has(.jp-gpushare-team-table)")
    page.context.close()


def test_spawn_page_says_why_the_server_stopped_after_a_preemption(
    hub: Hub, chrome: Any
) -> None:
    """Item 12: JupyterLab's "Restart" after a preemption leads to the spawn page: it says why."""
    for user in ("alice",):
        hub.stop(user)
    assert hub.spawn("bea", "half") in (201, 202)
    assert hub.spawn("bob", "half") in (201, 202)  # borrowed from vision: preemptible
    caller = threading.Thread(target=lambda: hub.spawn("amy", "half", wait=False))
    caller.start()
    deadline = time.monotonic() + 120
    while "" in (hub.hub.api("GET", "/users/bob")[1].get("servers") or {}):
        assert time.monotonic() < deadline, hub.hub.log_text()[-3000:]
        time.sleep(0.5)
    caller.join(120)
    page = login(chrome, hub, "bob", path="")
    page.goto(f"{hub.url}/hub/spawn/bob")
    reason = page.locator(".gpushare-stop-reason")
    reason.wait_for(timeout=30000)
    text = reason.inner_text()
    assert "borrowed" in text and "owning team" in text, text
    assert re.search(r"\d\d:\d\d GMT\+5:30|\d\d:\d\d IST", text), text  # local time, zone
    assert page.locator("#spawn_form").count() == 1  # still the options form
    screenshot(page, "lab_edges_spawn_page_reason")
    page.context.close()
    for user in ("amy", "bea"):
        hub.stop(user)
