"""Prometheus and Grafana: a real Prometheus scrapes the broker of a real hub.

The hub (with its proxy) starts the broker from ``setup_gpushare``'s service entry; alice gets
a grant and sends a heartbeat through the proxy with her token; Debian's ``prometheus`` runs
with a private config (scraping only 127.0.0.1, 1 s interval, storage in a temporary folder,
a free port) and every query of the Grafana dashboard must return data. ``promtool check
metrics`` must find nothing to say about the broker's exposition.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from realhub import REPO, free_port, proxy_available, real_hub

from jupyter_gpushare.grafana import panels as dashboard

pytestmark = [pytest.mark.hub, pytest.mark.slow]

POLICY = REPO / "hub_config" / "gpushare.yaml"
PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
NO_PROMETHEUS = "Debian's prometheus is not installed (.ci/run installs it: apt prometheus)"


def _get(url: str, token: str | None = None, data: Any = None, method: str = "GET") -> Any:
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"token {token}"
    body = None if data is None else json.dumps(data).encode()
    req = urllib.request.Request(url, data=body, method=method, headers=headers)
    with urllib.request.urlopen(req, timeout=30) as resp:
        raw = resp.read()
        kind = resp.headers.get("Content-Type", "")
    if "json" in kind:
        return json.loads(raw)
    return raw.decode()


@pytest.fixture(scope="module")
def hub_and_broker(tmp_path_factory: pytest.TempPathFactory) -> Any:
    if not proxy_available():
        pytest.skip("configurable-http-proxy is not installed in hub_config/proxy (npm install)")
    if PROMETHEUS is None or PROMTOOL is None:
        pytest.skip(NO_PROMETHEUS)
    tmp = tmp_path_factory.mktemp("hub")
    port = free_port()
    extra = f"""
from jupyter_gpushare.hubsetup import setup_gpushare
setup_gpushare(c, {str(POLICY)!r}, spawner=None, broker_port={port}, admin_users=["ada"],
               data_dir=HUB_TMP, broker_args=["--BrokerApp.reconcile_interval_s=0",
                                              "--BrokerApp.reconcile_on_start=False",
                                              "--BrokerLimits.heartbeat_min_interval_s=0"])
"""
    with real_hub(tmp, extra) as hub:
        api = hub.url + "/services/gpushare/api/v1"
        deadline = time.monotonic() + 60
        while True:
            try:
                if _get(api + "/health").get("status") == "ok":
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("broker did not start:\n" + hub.log_text()[-5000:])
            time.sleep(0.3)
        hub.create_user("alice", ["vision"])
        yield hub, api, port


def test_every_dashboard_query_returns_data(hub_and_broker: Any, tmp_path: Path) -> None:
    hub, api, broker_port = hub_and_broker
    alice = hub.token_for("alice")
    ada = hub.token_for("ada")
    ans = _get(api + "/requests", alice, {"profile": "lab-small", "server": "lab"}, "POST")
    assert ans["status"] == "granted", ans
    grant = ans["grant"]
    uuid = grant["gpus"][0]["uuid"]
    beat = {"grant_id": grant["id"], "ts": time.time(), "simulated": True,
            "gpus": [{"uuid": uuid, "memory_used_mib": 2048, "utilization_pct": 40,
                      "power_w": 250.0}]}
    _get(api + "/heartbeats", alice, beat, "POST")

    text = _get(api + "/metrics", ada)
    lint = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True,
                          text=True, timeout=60)
    assert lint.returncode == 0 and not (lint.stdout + lint.stderr).strip(), lint
    assert 'gpushare_node_power_watts{node="lab-0",pool="interactive"} 250.0' in text

    prom_port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        "  - job_name: gpushare\n"
        "    metrics_path: /services/gpushare/api/v1/metrics\n"
        f"    authorization: {{credentials: {ada}}}\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{broker_port}']}}]\n"
    )
    assert PROMETHEUS is not None
    log = (tmp_path / "prometheus.log").open("w")
    proc = subprocess.Popen(
        [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
         f"--web.listen-address=127.0.0.1:{prom_port}"],
        stdout=log, stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{prom_port}/api/v1/query?query="
    try:
        def query(expr: str) -> list[Any]:
            out = _get(base + urllib.parse.quote(expr))
            assert out["status"] == "success", (expr, out)
            return list(out["data"]["result"])

        deadline = time.monotonic() + 90
        queries = [dashboard.substitute(q, "gpushare", f"127.0.0.1:{broker_port}")
                   for q in dashboard.queries()]  # as tests/test_grafana_dashboard.py does
        missing: list[str] = queries
        while time.monotonic() < deadline:
            try:
                up = query('up{job="gpushare"}')
            except OSError:
                up = []
            if up and up[0]["value"][1] == "1":
                _get(api + "/heartbeats", alice, dict(beat, ts=time.time()), "POST")
                missing = [q for q in queries if not query(q)]
                if not missing:
                    break
            time.sleep(1.0)
        assert missing == [], (missing, (tmp_path / "prometheus.log").read_text()[-3000:])
        (used,) = query('gpushare_team_used_gpus{team="vision",pool="interactive"}')
        assert float(used["value"][1]) == grant["units"]
        (busy,) = query('gpushare_team_busy_gpus{team="vision",pool="interactive"}')
        # the share's compute (lab-small: 10 %) caps what the card's 40 % counts for
        share = grant["gpus"][0]["compute_pct"] / 100
        assert float(busy["value"][1]) == pytest.approx(min(share, 0.40))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()
        _get(api + f"/grants/{grant['id']}", alice, method="DELETE")
