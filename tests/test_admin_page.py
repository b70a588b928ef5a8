"""The admin page in a real browser (Debian's chromium through Playwright) on a real hub.

The hub (with its proxy) starts the broker from ``setup_gpushare``'s service entry. A
browser logs in at the hub's login form and opens ``/services/gpushare/admin/``, which goes
through the hub's OAuth. An admin sees every GPU with its holders drawn to scale, the
teams, the queue and the policy version, sees a new grant appear without reloading, and
drains and resumes a node with the page's buttons (XSRF-protected); a user who is not a
gpushare admin gets a 403 page, and so does the page's data for her cookie.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import requests
from labkit import browser, chromium_available
from realhub import REPO, free_port, proxy_available, real_hub

from jupyter_gpushare.broker.api.admin_page import policy_version_of
from jupyter_gpushare.policy import load_policy

pytestmark = [pytest.mark.hub, pytest.mark.slow]

POLICY = REPO / "hub_config" / "gpushare.yaml"
ADMIN = "/services/gpushare/admin/"


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Any:
    if not proxy_available():
        pytest.skip("configurable-http-proxy is not installed in hub_config/proxy (npm install)")
    missing = chromium_available()
    if missing:
        pytest.skip(missing)
    tmp = tmp_path_factory.mktemp("hub")
    port = free_port()
    extra = f"""
from jupyter_gpushare.hubsetup import setup_gpushare
setup_gpushare(c, {str(POLICY)!r}, spawner=None, broker_port={port}, admin_users=["ada"],
               data_dir=HUB_TMP, broker_args=["--BrokerApp.reconcile_interval_s=0",
                                              "--BrokerApp.reconcile_on_start=False"])
"""
    with real_hub(tmp, extra) as hub:
        deadline = time.monotonic() + 60
        while True:
            try:
                if requests.get(hub.url + "/services/gpushare/api/v1/health",
                                timeout=5).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("broker did not start:\n" + hub.log_text()[-5000:])
            time.sleep(0.3)
        hub.create_user("ada")
        hub.create_user("alice", ["vision"])
        hub.create_user("bob", ["nlp"])
        yield hub


def api(hub: Any, method: str, path: str, user: str, body: Any = None) -> Any:
    token = hub.token_for(user)
    r = requests.request(method, hub.url + "/services/gpushare/api/v1" + path, json=body,
                         headers={"Authorization": f"token {token}"}, timeout=30)
    assert r.status_code < 300, (r.status_code, r.text)
    return r.json()


def login(page: Any, hub: Any, user: str) -> None:
    page.goto(hub.url + "/hub/login")
    page.fill('input[name="username"]', user)
    page.fill('input[name="password"]', "any")
    page.click("#login_submit")
    # the hub's home, its spawn page, or (a server of the user's already running) that server
    page.wait_for_url(lambda url: "/hub/login" not in url)


def test_the_hub_lists_the_service(hub: Any) -> None:
    status, services = hub.api("GET", "/services")
    assert status == 200 and services["gpushare"]["display"] is True


def test_admin_sees_gpus_to_scale_teams_queue_and_drains_a_node(hub: Any) -> None:
    alice = api(hub, "POST", "/requests", "alice", {"profile": "lab-small", "server": "lab"})
    assert alice["status"] == "granted", alice
    gpu = alice["grant"]["gpus"][0]
    with browser() as b:
        page = b.new_page()
        login(page, hub, "ada")
        # the hub's Services menu links to the service, whose root leads to the admin page
        page.goto(hub.url + "/hub/home")
        link = page.locator('a[href$="/services/gpushare/"]')
        assert link.count() >= 1, page.content()[:3000]
        page.goto(link.first.evaluate("a => a.href"))
        page.wait_for_selector("#gpushare-admin[data-loaded]", timeout=30000)
        assert page.url.endswith(ADMIN)
        # every GPU of the inventory is drawn
        policy = load_policy(POLICY)
        assert page.locator(".gpu").count() == sum(len(n.gpus) for n in policy.nodes)
        assert page.locator("section.node").count() == len(policy.nodes)
        seg = page.locator(f'.seg[data-grant="{alice["grant"]["id"]}"]')
        assert seg.count() == 1 and seg.get_attribute("data-user") == "alice"
        # to scale: the segment's width is the share of the card's memory it holds
        width = seg.evaluate("e => e.getBoundingClientRect().width")
        bar = seg.evaluate("e => e.parentElement.getBoundingClientRect().width - 2")
        card = page.locator(f'.gpu[data-uuid="{gpu["uuid"]}"]')
        total = 141 * 1024
        assert width / bar == pytest.approx(gpu["memory_mib"] / total, abs=0.02)
        assert "alice (vision)" in (seg.get_attribute("title") or "")
        assert "1 grant(s)" in card.inner_text()
        # teams, policy version
        row = page.locator('tr[data-team="vision"][data-pool="interactive"]')
        assert row.locator("td").nth(2).inner_text() == str(alice["grant"]["units"])
        assert page.locator("#policy-version").inner_text() == policy_version_of(str(POLICY))
        # live: a grant made now shows up without a reload
        bob = api(hub, "POST", "/requests", "bob", {"profile": "lab-small", "server": "x"})
        page.wait_for_selector(f'.seg[data-grant="{bob["grant"]["id"]}"]', timeout=20000)
        # with the train nodes drained a batch request queues, and with the debug node
        # drained a debug request (no queue there) is refused: both show, with the reason
        for name in ("train-0", "train-1", "debug-0"):
            api(hub, "POST", f"/admin/nodes/{name}/drain", "ada")
        queued = api(hub, "POST", "/requests", "bob",
                     {"profile": "train-1gpu", "kind": "batch", "server": "job-1"})
        refused = requests.post(
            hub.url + "/services/gpushare/api/v1/requests",
            json={"profile": "debug-eighth", "server": "dbg"},
            headers={"Authorization": f"token {hub.token_for('bob')}"}, timeout=30).json()
        assert queued["status"] == "queued" and refused["status"] == "refused", (queued, refused)
        qrow = page.locator(f'tr[data-request="{queued["request_id"]}"]')
        qrow.wait_for(timeout=20000)
        cells = qrow.locator("td")
        assert cells.nth(0).inner_text() == "1" and cells.nth(1).inner_text() == "bob"
        assert cells.nth(8).inner_text() == queued["reason"]
        page.wait_for_selector(f'table.refusals td:text-is("{refused["reason"]}")',
                               timeout=20000)
        api(hub, "DELETE", f"/requests/{queued['request_id']}", "bob")
        for name in ("train-0", "train-1", "debug-0"):
            api(hub, "POST", f"/admin/nodes/{name}/resume", "ada")
        # drain and resume lab-0 with the page's buttons (XSRF token sent by the page)
        node = page.locator('section.node[data-node="lab-0"]')
        node.locator('button[data-action="drain"]').click()
        page.click("#confirm-yes")  # the page asks before draining (tests/test_pages_admin.py)
        page.wait_for_selector('section.node.drained[data-node="lab-0"]', timeout=20000)
        overview = api(hub, "GET", "/admin/overview", "ada")
        assert [n["drained"] for n in overview["nodes"] if n["name"] == "lab-0"] == [True]
        page.locator('section.node[data-node="lab-0"] button[data-action="resume"]').click()
        page.wait_for_selector('section.node:not(.drained)[data-node="lab-0"]', timeout=20000)
        page.close()
    for g in (alice, bob):
        api(hub, "DELETE", f"/grants/{g['grant']['id']}", "ada")


def test_a_non_admin_gets_403_in_the_browser(hub: Any) -> None:
    with browser() as b:
        page = b.new_page()
        login(page, hub, "alice")
        resp = page.goto(hub.url + ADMIN)
        assert resp is not None and resp.status == 403
        assert "alice is not a gpushare admin" in page.content()
        assert page.locator("#gpushare-admin").count() == 0
        # the page's data with her cookie: 403 too
        data = page.evaluate(
            "async () => (await fetch('/services/gpushare/api/v1/admin/overview')).status")
        assert data == 403
        page.close()


def test_without_login_the_page_sends_the_browser_to_the_hub(hub: Any) -> None:
    r = requests.get(hub.url + ADMIN, allow_redirects=False, timeout=30)
    assert r.status_code == 302 and "/hub/api/oauth2/authorize" in r.headers["Location"]
    r = requests.get(hub.url + "/services/gpushare/api/v1/admin/overview", timeout=30)
    assert r.status_code == 401
    # the service's root still answers programs with its health; browsers go to the page
    r = requests.get(hub.url + "/services/gpushare/", timeout=30)
    assert r.status_code == 200 and r.json()["status"] == "ok"
    r = requests.get(hub.url + "/services/gpushare/", headers={"Accept": "text/html"},
                     allow_redirects=False, timeout=30)
    assert r.status_code == 302 and r.headers["Location"].endswith("/services/gpushare/home")


def test_the_admin_page_links_the_monthly_report_as_a_page(hub: Any) -> None:
    """The admin page links the report of last month and of this month so far; the report
    page says a month in progress is partial, downloads in every format, names a bad month's
    field, and is for admins only."""
    with browser() as b:
        page = b.new_page()
        login(page, hub, "ada")
        page.goto(hub.url + ADMIN)
        page.wait_for_selector("#gpushare-admin[data-loaded]", timeout=30000)
        page.click("#report-now-link")
        page.wait_for_selector("h1", timeout=30000)
        month = time.strftime("%Y-%m", time.gmtime())
        heading = page.locator("h1").inner_text()
        assert heading.startswith(f"GPU report {month}") and "partial" in heading, heading
        assert page.locator('p.period[data-partial="yes"]').count() == 1
        page.goto(hub.url + ADMIN)
        page.wait_for_selector("#gpushare-admin[data-loaded]", timeout=30000)
        page.click("#report-link")
        page.wait_for_selector("h1", timeout=30000)
        assert "partial" not in page.locator("h1").inner_text()
        assert page.locator('p.period[data-partial="no"]').count() == 1
        token = hub.token_for("ada")
        for fmt, kind in (("csv", "text/csv"), ("json", "application/json"),
                          ("md", "text/markdown")):
            r = requests.get(f"{hub.url}{ADMIN}report?month={month}&format={fmt}",
                             headers={"Authorization": f"token {token}"}, timeout=60)
            assert r.status_code == 200, (r.status_code, r.text[:2000])
            assert r.headers["Content-Type"].startswith(kind), r.headers
            assert f"gpushare-report-{month}.{fmt}" in r.headers["Content-Disposition"]
            if fmt == "json":
                assert r.json()["partial"] is True and r.json()["month"] == month
        bad = page.goto(hub.url + ADMIN + "report?month=2026-13")
        assert bad is not None and bad.status == 400 and "month" in page.content()
        future = page.goto(hub.url + ADMIN + "report?month=2999-01")
        assert future is not None and future.status == 400 and "not begun" in page.content()
        page.close()
    with browser() as b:
        page = b.new_page()
        login(page, hub, "alice")
        resp = page.goto(hub.url + ADMIN + "report")
        assert resp is not None and resp.status == 403
        assert "GPU report" not in page.content()
        page.close()
