"""Browsers reach the broker with the hub's OAuth login (issue 8 item 19), through a real hub.

One real JupyterHub with its proxy, the broker started by the hub from ``setup_gpushare``.
A browser session (``requests.Session``: cookies, redirects) logs in at the hub's login form,
opens a broker page, is sent through the hub's OAuth and comes back with the broker's cookie.
Then: the admin's cookie reaches ``GET /api/v1/admin/queue``, a non-admin's gets 403, a POST
with the cookie and without the XSRF token is refused, the same POST with it succeeds, and
tokens keep working for the API without any XSRF token.
"""

from __future__ import annotations

import re
import time
from typing import Any

import pytest
import requests
from realhub import REPO, free_port, proxy_available, real_hub
from tornado import web

pytestmark = [pytest.mark.hub, pytest.mark.slow]

POLICY = REPO / "hub_config" / "gpushare.yaml"


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Any:
    if not proxy_available():
        pytest.skip("configurable-http-proxy is not installed in hub_config/proxy (npm install)")
    tmp = tmp_path_factory.mktemp("hub")
    port = free_port()
    extra = f"""
from jupyter_gpushare.hubsetup import setup_gpushare
setup_gpushare(c, {str(POLICY)!r}, spawner=None, broker_port={port}, admin_users=["ada"],
               data_dir=HUB_TMP, broker_args=["--BrokerApp.reconcile_interval_s=0"])
"""
    with real_hub(tmp, extra) as hub:
        deadline = time.monotonic() + 60
        while True:
            try:
                r = requests.get(hub.url + "/services/gpushare/api/v1/health", timeout=5)
                if r.status_code == 200:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("broker did not start:\n" + hub.log_text()[-5000:])
            time.sleep(0.3)
        hub.create_user("ada")
        hub.create_user("alice", ["vision"])
        yield hub


def browser(hub: Any, user: str) -> requests.Session:
    """A browser session logged in at the hub's login form (DummyAuthenticator)."""
    s = requests.Session()
    form = s.get(hub.url + "/hub/login", timeout=30)
    match = re.search(r'name="_xsrf" value="([^"]+)"', form.text)
    assert match, form.text[:2000]
    r = s.post(hub.url + "/hub/login", data={"username": user, "password": "any",
                                               "_xsrf": match.group(1)}, timeout=30)
    assert r.status_code == 200, (r.status_code, r.text[:2000])
    assert any(c.name.startswith("jupyterhub-session") or c.name == "jupyterhub-hub-login"
               for c in s.cookies), list(s.cookies.keys())
    return s


def xsrf_of(page: str) -> str:
    match = re.search(r'<meta name="gpushare-xsrf" content="([^"]+)"', page)
    assert match, page[:2000]
    return match.group(1)


@pytest.fixture(scope="module")
def ada(hub: Any) -> tuple[requests.Session, str]:
    s = browser(hub, "ada")
    page = s.get(hub.url + "/services/gpushare/admin/session", timeout=30)
    assert page.status_code == 200, (page.status_code, page.text[:2000], hub.log_text()[-3000:])
    # the way there went through the hub's OAuth and back through the callback
    assert any("/hub/api/oauth2/authorize" in h.url for h in page.history), page.history
    assert any("/services/gpushare/oauth_callback" in h.url for h in page.history)
    assert "Logged in as <b>ada</b>" in page.text
    assert "custom:gpushare:admin" in page.text
    return s, xsrf_of(page.text)


def test_without_login_a_page_sends_the_browser_to_the_hub(hub: Any) -> None:
    r = requests.get(hub.url + "/services/gpushare/admin/session", allow_redirects=False,
                     timeout=30)
    assert r.status_code == 302
    assert "/hub/api/oauth2/authorize" in r.headers["Location"]
    assert "client_id=service-gpushare" in r.headers["Location"]


def test_an_admins_cookie_reaches_the_admin_api(hub: Any, ada: tuple[requests.Session, str]
                                                ) -> None:
    s, _ = ada
    r = s.get(hub.url + "/services/gpushare/api/v1/admin/queue", timeout=30)
    assert r.status_code == 200, r.text
    assert "queue" in r.json()


def test_a_post_with_the_cookie_needs_the_xsrf_token(hub: Any, ada: tuple[requests.Session, str]
                                                     ) -> None:
    s, xsrf = ada
    url = hub.url + "/services/gpushare/api/v1/admin/reconcile"
    r = s.post(url, timeout=30)
    assert r.status_code == 403, r.text
    assert r.json()["field"] == "_xsrf" and "XSRF" in r.json()["error"]
    r = s.post(url, headers={"X-XSRFToken": "not-the-token"}, timeout=30)
    assert r.status_code == 403, r.text
    r = s.post(url, headers={"X-XSRFToken": xsrf}, timeout=30)
    assert r.status_code == 200, r.text


def test_a_non_admin_login_gets_403(hub: Any) -> None:
    s = browser(hub, "alice")
    page = s.get(hub.url + "/services/gpushare/admin/session", timeout=30)
    assert page.status_code == 403, page.text[:2000]
    assert "alice is not a gpushare admin" in page.text
    r = s.get(hub.url + "/services/gpushare/api/v1/admin/queue", timeout=30)
    assert r.status_code == 403, r.text
    # her own things she may read with the same cookie
    r = s.get(hub.url + "/services/gpushare/api/v1/grants?user=alice", timeout=30)
    assert r.status_code == 200, r.text


def test_tokens_keep_working_without_xsrf(hub: Any) -> None:
    token = hub.token_for("ada")
    headers = {"Authorization": f"token {token}"}
    r = requests.get(hub.url + "/services/gpushare/api/v1/admin/queue", headers=headers,
                     timeout=30)
    assert r.status_code == 200, r.text
    r = requests.post(hub.url + "/services/gpushare/api/v1/admin/reconcile", headers=headers,
                      timeout=30)
    assert r.status_code == 200, r.text


def test_no_cookie_and_no_token_is_401(hub: Any) -> None:
    r = requests.get(hub.url + "/services/gpushare/api/v1/admin/queue", timeout=30)
    assert r.status_code == 401, r.text
    # a forged cookie (not signed by the broker) is no login either
    r = requests.get(hub.url + "/services/gpushare/api/v1/admin/queue", timeout=30,
                     cookies={"service-gpushare": "forged"})
    assert r.status_code == 401, r.text


def test_a_page_with_a_login_the_hub_does_not_know_logs_in_again(hub: Any) -> None:
    # a cookie the broker signed (its secret is in the data dir) around a token the hub
    # never issued: the API answers 403, a page sends the browser to log in again
    secret = bytes.fromhex((hub.tmp / "gpushare_cookie_secret").read_text().strip())
    value = web.create_signed_value(secret, "service-gpushare", "not-a-token").decode()
    cookies = {"service-gpushare": value}
    r = requests.get(hub.url + "/services/gpushare/api/v1/admin/queue", cookies=cookies,
                     timeout=30)
    assert r.status_code == 403, r.text
    r = requests.get(hub.url + "/services/gpushare/admin/session", cookies=cookies,
                     allow_redirects=False, timeout=30)
    assert r.status_code == 302, r.text
    assert "/hub/api/oauth2/authorize" in r.headers["Location"]
