"""The broker's pages for people, in Debian's chromium on a real hub (issue 26 items 15, 17,
18 and 19): the team admins' page, the admin page an operator keeps open, and the report
as a page.

One hub for the module (the demo policy: alice is an admin of team vision, bob of nlp; ada
is a gpushare admin; carol is a plain member of vision). Screenshots go to
``benchmarks/out/screens/pages-*.png`` (``GPUSHARE_SCREENS`` elsewhere).
"""

from __future__ import annotations

import re
import time
from datetime import datetime
from typing import Any

import pytest
import requests
from labkit import SCREENS, browser, chromium_available
from realhub import REPO, free_port, proxy_available, real_hub
from sqlalchemy import create_engine, select

from jupyter_gpushare.broker.store.db import grants_table
from jupyter_gpushare.core.ledger import month_bounds

pytestmark = [pytest.mark.hub, pytest.mark.slow]

POLICY = REPO / "hub_config" / "gpushare.yaml"
SVC = "/services/gpushare/"


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
                if requests.get(hub.url + SVC + "api/v1/health", timeout=5).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("broker did not start:\n" + hub.log_text()[-5000:])
            time.sleep(0.3)
        hub.create_user("ada")
        hub.create_user("alice", ["vision"])
        hub.create_user("carol", ["vision"])
        hub.create_user("bob", ["nlp"])
        hub.db = tmp / "gpushare.sqlite"
        yield hub


def api(hub: Any, method: str, path: str, user: str, body: Any = None, ok: bool = True) -> Any:
    r = requests.request(
        method,
        hub.url + SVC + "api/v1" + path,
        json=body,
        timeout=30,
        headers={"Authorization": f"token {hub.token_for(user)}"},
    )
    if ok:
        assert r.status_code < 300, (r.status_code, r.text)
        return r.json()
    return r


def screenshot(page: Any, name: str) -> None:
    """The whole page (not only the window), as an artifact to look at."""
    SCREENS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENS / f"{name}.png"), full_page=True)
    print(f"screenshot: {SCREENS / name}.png")


def login(page: Any, hub: Any, user: str) -> None:
    page.goto(hub.url + "/hub/login")
    page.fill('input[name="username"]', user)
    page.fill('input[name="password"]', "any")
    page.click("#login_submit")
    page.wait_for_url(lambda url: "/hub/login" not in url)


def granted_gpu_hours(hub: Any, team: str, pool: str, until: float) -> float:
    """GPU-hours of ``team`` in ``pool`` this month, summed over the broker's grant rows."""
    start, _ = month_bounds(*time.gmtime(until)[:2])
    g = grants_table.c
    engine = create_engine(f"sqlite:///{hub.db}")
    total = 0.0
    with engine.connect() as conn:
        for units_milli, granted, released in conn.execute(
            select(g.units_milli, g.granted_at, g.released_at).where(g.team == team, g.pool == pool)
        ):
            lo, hi = max(granted, start), min(released or until, until)
            total += units_milli / 1000 * max(0.0, hi - lo) / 3600
    engine.dispose()
    return total


@pytest.fixture(scope="module")
def world(hub: Any) -> dict[str, Any]:
    """A live grant of vision, a queued batch request each of carol (vision) and bob (nlp),
    a refusal of carol: the train and debug nodes drained for it."""
    alice = api(hub, "POST", "/requests", "alice", {"profile": "lab-small", "server": "lab"})
    for name in ("train-0", "train-1", "debug-0"):
        api(hub, "POST", f"/admin/nodes/{name}/drain", "ada")
    carol_q = api(
        hub,
        "POST",
        "/requests",
        "carol",
        {"profile": "train-1gpu", "kind": "batch", "server": "carol-train"},
    )
    bob_q = api(
        hub,
        "POST",
        "/requests",
        "bob",
        {"profile": "train-1gpu", "kind": "batch", "server": "bob-train"},
    )
    refused = api(
        hub, "POST", "/requests", "carol", {"profile": "debug-eighth", "server": "dbg"}, ok=False
    ).json()
    assert alice["status"] == "granted", alice
    assert carol_q["status"] == bob_q["status"] == "queued", (carol_q, bob_q)
    assert refused["status"] == "refused", refused
    return {"alice": alice, "carol_q": carol_q, "bob_q": bob_q, "refused": refused}


def test_the_menu_entry_shows_only_to_admins_and_team_admins(hub: Any, world: Any) -> None:
    with browser() as b:
        for user, lands in (
            ("carol", None),
            ("alice", SVC + "team/vision"),
            ("ada", SVC + "admin/"),
        ):
            page = b.new_context().new_page()
            login(page, hub, user)
            page.goto(hub.url + "/hub/home")
            link = page.locator(f'a[href$="{SVC}"]')
            if lands is None:
                assert link.count() == 0, page.content()[:3000]
                screenshot(page, f"pages-menu-{user}-no-entry")
                # and the page itself: the hub does not let her through to the service
                resp = page.goto(hub.url + SVC + "team/vision")
                assert resp is not None and resp.status == 403
                page.close()
                continue
            assert link.count() >= 1, page.content()[:3000]
            page.goto(link.first.evaluate("a => a.href"))
            page.wait_for_load_state()
            assert page.url.endswith(lands), page.url
            page.close()


def test_a_team_admin_sees_the_team_page(hub: Any, world: Any) -> None:
    with browser() as b:
        page = b.new_page(viewport={"width": 1300, "height": 1100})
        login(page, hub, "alice")
        resp = page.goto(hub.url + SVC + "team/vision")
        assert resp is not None and resp.status == 200
        root = page.locator("#gpushare-team")
        assert root.get_attribute("data-team") == "vision"
        # members from the hub's group, the team admin marked
        members = page.locator("ul.members li").evaluate_all("els => els.map(e => e.dataset.user)")
        assert sorted(members) == ["alice", "carol"]
        assert page.locator('ul.members li.admin[data-user="alice"]').count() == 1
        # the live grant, the queued request, the refusal
        assert (
            page.locator(f'table.grants tr[data-grant="{world["alice"]["grant"]["id"]}"]').count()
            == 1
        )
        assert (
            page.locator(f'table.queue tr[data-request="{world["carol_q"]["request_id"]}"]').count()
            == 1
        )
        assert (
            page.locator(f'table.queue tr[data-request="{world["bob_q"]["request_id"]}"]').count()
            == 0
        )
        refusal = page.locator(
            f'table.refusals tr[data-request="{world["refused"]["request_id"]}"]'
        )
        assert refusal.count() == 1 and world["refused"]["reason"] in refusal.inner_text()
        # GPU-hours this month: the page's figure against a sum over the grant rows
        cell = page.locator('table.usage tr[data-pool="interactive"] td[data-gpu-hours]')
        shown = float(cell.get_attribute("data-gpu-hours") or "nan")
        assert shown == pytest.approx(
            granted_gpu_hours(hub, "vision", "interactive", time.time()), abs=0.01
        )
        assert cell.inner_text().endswith("GPU-h")
        budget = page.locator('table.usage tr[data-pool="interactive"] td').nth(7).inner_text()
        assert budget == "600 GPU-h"
        # times are written in the reader's local time (the browser's zone), with the zone
        when = page.locator("table.grants time").first
        assert when.get_attribute("data-local") == "yes"
        assert re.search(r"\b(UTC|GMT)", when.inner_text()), when.inner_text()
        screenshot(page, "pages-team-vision-as-alice")
        # another team's page, the admin page and its data, the whole report: 403
        for path in ("team/nlp", "admin/", "admin/report", "admin/report?team=nlp"):
            resp = page.goto(hub.url + SVC + path)
            assert resp is not None and resp.status == 403, (path, resp and resp.status)
        assert "not an admin of team 'nlp'" in page.content()
        data = page.evaluate(f"async () => (await fetch('{SVC}api/v1/admin/overview')).status")
        assert data == 403
        page.close()
    r = api(
        hub, "POST", f"/admin/requests/{world['carol_q']['request_id']}/cancel", "alice", ok=False
    )
    assert r.status_code == 403


def test_the_admin_page_shows_holders_legend_jobs_and_asks_before_acting(
    hub: Any, world: Any
) -> None:
    gid = world["alice"]["grant"]["id"]
    carol_rid = world["carol_q"]["request_id"]
    with browser() as b:
        page = b.new_page(viewport={"width": 1400, "height": 1400})
        login(page, hub, "ada")
        page.goto(hub.url + SVC + "admin/")
        page.wait_for_selector("#gpushare-admin[data-loaded]", timeout=30000)
        # holders written out under the bar, in the team's colour, with a legend
        holder = page.locator(f'.holders li[data-grant="{gid}"]')
        assert holder.count() == 1 and holder.is_visible()
        text = holder.inner_text()
        assert "alice" in text and "vision" in text and "lab" in text and "GiB" in text
        seg_colour = page.locator(f'.seg[data-grant="{gid}"]').evaluate(
            "e => getComputedStyle(e).backgroundColor"
        )
        legend = page.locator('#legend span[data-team="vision"] .swatch')
        assert legend.evaluate("e => getComputedStyle(e).backgroundColor") == seg_colour
        assert "borrowed" in page.locator("#legend").inner_text()
        colours = page.locator("#legend span[data-team] .swatch").evaluate_all(
            "els => els.map(e => getComputedStyle(e).backgroundColor)"
        )
        assert len(set(colours)) == len(colours) == 3  # one colour per team
        # the queue names what waits
        row = page.locator(f'tr[data-request="{carol_rid}"]')
        assert row.locator("td.holder").inner_text() == "carol-train job"
        # in the reader's local time with its zone, not ISO with microseconds
        since = row.locator("time")
        assert (since.get_attribute("datetime") or "")[:19] == world["carol_q"]["created_at"][:19]
        assert re.search(r"\b(UTC|GMT)", since.inner_text()) and "." not in since.inner_text()
        screenshot(page, "pages-admin-holders-legend-queue")
        # cancel someone's queued request: asked first; "Keep as is" keeps it
        row.locator("button[data-cancel]").click()
        page.wait_for_selector("#gpushare-confirm[open]")
        assert "carol" in page.locator("#gpushare-confirm .text").inner_text()
        screenshot(page, "pages-admin-cancel-confirmation")
        page.click("#confirm-no")
        time.sleep(2.5)  # a poll later
        assert api(hub, "GET", f"/requests/{carol_rid}", "ada")["status"] == "queued"
        row.locator("button[data-cancel]").click()
        page.click("#confirm-yes")
        page.wait_for_selector(f'tr[data-request="{carol_rid}"]', state="detached", timeout=20000)
        assert api(hub, "GET", f"/requests/{carol_rid}", "ada")["status"] == "cancelled"
        deadline = time.monotonic() + 10
        while f"admin ada cancelled request {carol_rid} of carol" not in hub.log_text():
            assert time.monotonic() < deadline, "no audit line in the broker's log"
            time.sleep(0.3)
        # draining asks first too
        node = page.locator('section.node[data-node="lab-0"]')
        node.locator('button[data-action="drain"]').click()
        page.wait_for_selector("#gpushare-confirm[open]")
        assert "Drain lab-0?" in page.locator("#gpushare-confirm .text").inner_text()
        screenshot(page, "pages-admin-drain-confirmation")
        page.click("#confirm-no")
        time.sleep(2.5)
        overview = api(hub, "GET", "/admin/overview", "ada")
        assert [n["drained"] for n in overview["nodes"] if n["name"] == "lab-0"] == [False]
        node.locator('button[data-action="drain"]').click()
        page.click("#confirm-yes")
        page.wait_for_selector('section.node.drained[data-node="lab-0"]', timeout=20000)
        page.locator('section.node[data-node="lab-0"] button[data-action="resume"]').click()
        page.wait_for_selector('section.node:not(.drained)[data-node="lab-0"]', timeout=20000)
        page.close()
    # a waiting request only, and never for someone without the admin scope
    r = api(hub, "POST", f"/admin/requests/{carol_rid}/cancel", "ada", ok=False)
    assert r.status_code == 409 and "cancelled" in r.json()["error"]


def test_the_report_page(hub: Any, world: Any) -> None:
    # bob's queued request is granted once the train nodes come back: a wait on day one
    for name in ("train-0", "train-1", "debug-0"):
        api(hub, "POST", f"/admin/nodes/{name}/resume", "ada")
    deadline = time.monotonic() + 20
    while (
        api(hub, "GET", f"/requests/{world['bob_q']['request_id']}", "ada")["status"] != "granted"
    ):
        assert time.monotonic() < deadline
        time.sleep(0.3)
    month = time.strftime("%Y-%m", time.gmtime())
    with browser() as b:
        page = b.new_page(viewport={"width": 1700, "height": 1300})
        login(page, hub, "ada")
        resp = page.goto(f"{hub.url}{SVC}admin/report?month={month}")
        assert resp is not None and resp.status == 200
        assert "partial" in page.locator("h1").inner_text()
        root = page.locator("#gpushare-report")
        assert root.get_attribute("data-partial") == "yes"
        # recommendation first, then the plots
        order = page.locator("h2").all_inner_texts()
        assert order[:2] == ["Recommendation", "At a glance"], order
        assert page.locator(".rec dl dd").count() >= 1
        for plot in ("plot-team-days", "plot-utilisation", "plot-queue-wait", "plot-borrow-lend"):
            assert page.locator(f"svg#{plot}").is_visible(), plot
        assert page.locator("circle.wait").count() >= 1  # one day of data shows
        # every granted GPU-hours figure against the grant rows, up to the page's `until`
        until = datetime.fromisoformat(
            (root.get_attribute("data-until") or "").replace("Z", "+00:00")
        ).timestamp()
        cells = page.locator('tr[data-key="granted_gpu_hours"] td[data-value]')
        assert cells.count() >= 10
        for table in page.locator("table.figures.teams").all():
            pool = (table.get_attribute("class") or "").split("pool-")[1]
            teams = table.locator("thead th.num").all_inner_texts()
            values = table.locator('tr[data-key="granted_gpu_hours"] td').evaluate_all(
                "els => els.map(e => Number(e.dataset.value))"
            )
            for team, value in zip(teams, values, strict=True):
                assert value == pytest.approx(
                    granted_gpu_hours(hub, team, pool, until), abs=2e-4
                ), (team, pool)
        text = page.locator("table.figures").all_inner_texts()
        assert not any(re.search(r"\d\.\d{3,}", t) for t in text)
        screenshot(page, "pages-report-admin")
        # every download from the page works and names its file
        links = page.locator("a.download").evaluate_all(
            "els => els.map(e => [e.dataset.format, e.href])"
        )
        assert sorted(f for f, _ in links) == ["csv", "html", "json", "md"]
        for fmt, href in links:
            r = page.request.get(href)
            assert r.status == 200, (fmt, r.status)
            assert f"gpushare-report-{month}.{fmt}" in r.headers["content-disposition"]
        page.close()
    with browser() as b:
        page = b.new_page(viewport={"width": 1700, "height": 1300})
        login(page, hub, "alice")
        resp = page.goto(f"{hub.url}{SVC}admin/report?month={month}&team=vision")
        assert resp is not None and resp.status == 200
        # one table of the team, a column per pool, each figure the grant rows' figure
        table = page.locator("table.figures.team-pools")
        pools = table.locator("thead th.num").all_inner_texts()
        assert sorted(pools) == ["debug", "inference", "interactive", "train"], pools
        until = datetime.fromisoformat(
            (page.locator("#gpushare-report").get_attribute("data-until") or "").replace(
                "Z", "+00:00"
            )
        ).timestamp()
        values = table.locator('tr[data-key="granted_gpu_hours"] td').evaluate_all(
            "els => els.map(e => Number(e.dataset.value))"
        )
        for pool, value in zip(pools, values, strict=True):
            assert value == pytest.approx(
                granted_gpu_hours(hub, "vision", pool, until), abs=2e-4
            ), pool
        assert page.locator("table.pools").count() == 0
        body = page.locator("#gpushare-report").inner_text()
        assert "nlp" not in body and "research" not in body
        links = page.locator("a.download").evaluate_all("els => els.map(e => e.href)")
        for href in links:
            r = page.request.get(href)
            assert r.status == 200 and "vision" in r.headers["content-disposition"]
        screenshot(page, "pages-report-team-vision")
        page.close()
