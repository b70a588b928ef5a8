"""The Grafana dashboard: built with Grafana's grafana-foundation-sdk, decoded by it, and every
query run against a real Prometheus scraping the real broker of a real hub.

The Prometheus scrapes the one broker as two jobs (``gpushare`` and ``hub-b``, the second with
its own ``instance`` label), as a Prometheus shared by two hubs would: each dashboard query,
with the ``job`` and ``instance`` variables set to one of them, returns data; with the job of
one and the instance of the other, or an unknown job, it returns nothing; and a team's GPUs in
the first panel are those of one broker, not the two summed.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.cog.plugins import register_default_plugins
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models import prometheus as pm
from realhub import REPO, free_port
from test_prometheus import PROMETHEUS, _get, hub_and_broker  # noqa: F401 (a fixture)

from jupyter_gpushare.cli import main as cli_main
from jupyter_gpushare.grafana import dashboard, panels

COMMITTED = REPO / "jupyter_gpushare" / "grafana" / "gpushare-dashboard.json"
DS = {"type": "prometheus", "uid": "${datasource}"}
FILTER_RE = re.compile(r'(gpushare_[a-z_]+)(\{job=~"\$job", instance=~"\$instance"[,}])?')

#: the panels of the grafanalib dashboard this one replaces: none may be lost
OLD_PANELS = (
    "Team use against guarantee (GPUs)",
    "Utilisation of held GPUs (measured)",
    "Idle share of held GPUs per pool",
    "Pool capacity and use (GPUs)",
    "Queue",
    "Preemptions, refusals and idle culls per minute",
    "GPU-hours this month against budget",
    "Power per node",
)


def _data() -> dict[str, Any]:
    return dict(json.loads(dashboard.render()))


def _exprs(data: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in data["panels"] for t in p["targets"]]


# ------------------------------------------------------------------ the JSON, no hub


def test_grafanas_sdk_decodes_the_dashboard_whole() -> None:
    register_default_plugins()  # the SDK's decoders of panel and query kinds
    data = _data()
    board = dm.Dashboard.from_json(data)
    # nothing lost or changed on the way through the SDK's model
    assert json.loads(json.dumps(board, cls=JSONEncoder)) == data
    assert board.schema_version == data["schemaVersion"] == dm.Dashboard().schema_version >= 41
    assert board.panels is not None and len(board.panels) == len(data["panels"])
    for panel in board.panels:
        assert isinstance(panel, dm.Panel) and panel.type_val == "timeseries", panel.title
        assert panel.datasource is not None and panel.datasource.to_json() == DS
        assert panel.targets, panel.title
        for target in panel.targets:
            assert isinstance(target, pm.Dataquery), (panel.title, target)
            assert target.datasource is not None and target.datasource.to_json() == DS
            assert target.expr and target.ref_id and target.legend_format
    assert [p.title for p in board.panels if p.title in OLD_PANELS] == list(OLD_PANELS)
    ids = [p.id_val for p in board.panels]
    assert len(set(ids)) == len(ids)


def test_variables_datasource_job_and_instance() -> None:
    register_default_plugins()
    board = dm.Dashboard.from_json(_data())
    assert board.templating is not None and board.templating.list_val is not None
    by_name = {v.name: v for v in board.templating.list_val}
    assert list(by_name) == ["datasource", "job", "instance"]
    ds = by_name["datasource"]
    assert ds.type_val == dm.VariableType.DATASOURCE and ds.query == "prometheus"
    for name in ("job", "instance"):
        var = by_name[name]
        assert var.type_val == dm.VariableType.QUERY, name
        assert var.datasource is not None and var.datasource.to_json() == DS, name
        assert isinstance(var.query, str) and var.query.startswith("label_values("), name
        assert var.query.endswith(f", {name})") and not var.multi and not var.include_all
    assert by_name["instance"].query == (
        'label_values(gpushare_pool_capacity_gpus{job=~"$job"}, instance)')


def test_every_selector_of_every_query_filters_by_job_and_instance() -> None:
    exprs = _exprs(_data())
    assert exprs == panels.queries() and len(exprs) >= 20
    for expr in exprs:
        found = FILTER_RE.findall(expr)
        assert found, expr
        unfiltered = [name for name, filt in found if not filt]
        assert unfiltered == [], expr


def test_committed_json_is_what_the_builder_writes() -> None:
    assert COMMITTED.read_text() == dashboard.render()


def test_the_dashboard_command_prints_it(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "jupyter_gpushare.cli", "dashboard"],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout == dashboard.render()
    target = tmp_path / "d.json"
    assert cli_main(["dashboard", "-o", str(target)]) == 0
    assert target.read_text() == dashboard.render()
    assert cli_main(["dashboard", "--rebuild", "-o", str(target)]) == 0
    assert target.read_text() == dashboard.render()


def _without_the_sdk(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in sys.modules if n.split(".")[0] == "grafana_foundation_sdk"]:
        monkeypatch.setitem(sys.modules, name, None)  # as if not installed
    monkeypatch.delitem(sys.modules, "jupyter_gpushare.grafana.dashboard")
    monkeypatch.delattr("jupyter_gpushare.grafana.dashboard", raising=False)


def test_the_shipped_dashboard_prints_without_the_sdk(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _without_the_sdk(monkeypatch)
    assert cli_main(["dashboard"]) == 0
    assert capsys.readouterr().out == dashboard_text()


def test_rebuild_says_how_to_install_the_sdk(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _without_the_sdk(monkeypatch)
    assert cli_main(["dashboard", "--rebuild"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "pip install 'jupyter-gpushare[grafana]'" in captured.err
    assert "grafana-foundation-sdk" in captured.err


def dashboard_text() -> str:
    return COMMITTED.read_text()


# --------------------------------------------------- every query, real Prometheus and broker


@contextlib.contextmanager
def prometheus(tmp_path: Path, broker_port: int, token: str) -> Iterator[Callable[[str], list]]:
    """A real Prometheus scraping the broker as two jobs; yields ``query(expr) -> result``."""
    assert PROMETHEUS is not None
    target = f"static_configs: [{{targets: ['127.0.0.1:{broker_port}']}}]"
    job = ("    metrics_path: /services/gpushare/api/v1/metrics\n"
           f"    authorization: {{credentials: {token}}}\n"
           f"    {target}\n")
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        "  - job_name: gpushare\n" + job +
        "  - job_name: hub-b\n" + job +
        "    relabel_configs: [{target_label: instance, replacement: 'hub-b:8081'}]\n"
    )
    port = free_port()
    log_path = tmp_path / "prometheus.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}"],
            stdout=log, stderr=subprocess.STDOUT,
        )
        base = f"http://127.0.0.1:{port}/api/v1/"

        def query(expr: str) -> list[Any]:
            out = _get(base + "query?query=" + urllib.parse.quote(expr))
            assert out["status"] == "success", (expr, out)
            return list(out["data"]["result"])

        query.base = base  # type: ignore[attr-defined]
        query.log = log_path  # type: ignore[attr-defined]
        try:
            yield query
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def test_every_query_returns_data_for_one_broker_only(hub_and_broker: Any,  # noqa: F811
                                                      tmp_path: Path) -> None:
    hub, api, broker_port = hub_and_broker
    alice, ada = hub.token_for("alice"), hub.token_for("ada")
    ans = _get(api + "/requests", alice, {"profile": "lab-small", "server": "lab"}, "POST")
    assert ans["status"] == "granted", ans
    grant = ans["grant"]
    beat = {"grant_id": grant["id"], "ts": time.time(), "simulated": True,
            "gpus": [{"uuid": grant["gpus"][0]["uuid"], "memory_used_mib": 2048,
                      "utilization_pct": 40, "power_w": 250.0}]}
    _get(api + "/heartbeats", alice, beat, "POST")
    exposition = _get(api + "/metrics", ada)
    # every metric a panel queries is one the broker exports
    exported = set(re.findall(r"^# TYPE (\S+) ", exposition, re.M))
    counters = {n + "_total" for n in re.findall(r"^# TYPE (\S+) counter", exposition, re.M)}
    assert [n for n in panels.metrics() if n not in exported | counters] == []

    a = ("gpushare", f"127.0.0.1:{broker_port}")
    b = ("hub-b", "hub-b:8081")
    try:
        with prometheus(tmp_path, broker_port, ada) as query:
            def run(expr: str, job: str, instance: str) -> list[Any]:
                return query(panels.substitute(expr, job, instance))

            deadline = time.monotonic() + 120
            missing = panels.queries()
            while missing and time.monotonic() < deadline:
                _get(api + "/heartbeats", alice, dict(beat, ts=time.time()), "POST")
                with contextlib.suppress(OSError):
                    missing = [q for q in panels.queries()
                               if not (run(q, *a) and run(q, *b))]
                time.sleep(1.0)
            assert missing == [], (missing, query.log.read_text()[-3000:])  # type: ignore
            for expr in panels.queries():
                assert run(expr, a[0], b[1]) == [], expr  # the instance filters
                assert run(expr, b[0], a[1]) == [], expr  # the job filters
                assert run(expr, "nosuch", ".*") == [], expr

            # what the variables offer: both jobs; for one job, its instance only
            jobs = _get(query.base + "label/job/values?match[]="  # type: ignore
                        + urllib.parse.quote(panels.VARIABLE_METRIC))["data"]
            assert sorted(jobs) == ["gpushare", "hub-b"]
            sel = urllib.parse.quote(f'{panels.VARIABLE_METRIC}{{job=~"{a[0]}"}}')
            assert _get(query.base + "label/instance/values?match[]="  # type: ignore
                        + sel)["data"] == [a[1]]

            # one broker's GPUs, not the two jobs summed
            first = panels.PANELS[0].queries[0].expr
            assert "gpushare_team_used_gpus" in first
            vision = [r for r in run(first, *a) if r["metric"].get("team") == "vision"]
            assert [float(r["value"][1]) for r in vision] == [grant["units"]]
            both = query('sum(gpushare_team_used_gpus{team="vision"})')
            assert float(both[0]["value"][1]) == 2 * grant["units"]
    finally:
        _get(api + f"/grants/{grant['id']}", alice, method="DELETE")
