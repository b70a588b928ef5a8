"""The gpushare Grafana dashboard, built with grafanalib (a maintained dashboard library).

    .venv/bin/python hub_config/grafana/dashboard.py          # writes gpushare-dashboard.json

Import ``gpushare-dashboard.json`` in Grafana (Dashboards -> Import) and pick the Prometheus
data source that scrapes the broker's ``/services/gpushare/api/v1/metrics``. The queries
are listed once in :data:`PANELS`; ``tests/test_prometheus.py`` runs every one of them
against a real Prometheus scraping the broker of a real hub and checks that each returns
data, and that the committed JSON is what this script generates.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from grafanalib._gen import DashboardEncoder
from grafanalib.core import Dashboard, GridPos, Target, Template, Templating, TimeSeries

HERE = Path(__file__).resolve().parent
OUT = HERE / "gpushare-dashboard.json"
DS = "${datasource}"

# (title, unit, [(legend, PromQL)])
PANELS: list[tuple[str, str, list[tuple[str, str]]]] = [
    ("Team use against guarantee (GPUs)", "short", [
        ("{{team}} in use", "sum by (team) (gpushare_team_used_gpus)"),
        ("{{team}} guaranteed", "sum by (team) (gpushare_team_guaranteed_gpus)"),
        ("{{team}} guarantee + borrow limit",
         "sum by (team) (gpushare_team_guaranteed_gpus + gpushare_team_borrow_limit_gpus)"),
        ("{{team}} borrowed", "sum by (team) (gpushare_team_borrowed_gpus)"),
    ]),
    ("Utilisation of held GPUs (measured)", "percentunit", [
        ("{{team}}", "sum by (team) (gpushare_team_busy_gpus)"
                     " / sum by (team) (gpushare_team_measured_gpus)"),
    ]),
    ("Idle share of held GPUs per pool", "percentunit", [
        ("{{pool}}", "1 - sum by (pool) (gpushare_team_busy_gpus)"
                     " / sum by (pool) (gpushare_team_measured_gpus)"),
    ]),
    ("Pool capacity and use (GPUs)", "short", [
        ("{{pool}} capacity", "gpushare_pool_capacity_gpus"),
        ("{{pool}} in use", "sum by (pool) (gpushare_team_used_gpus)"),
    ]),
    ("Queue", "short", [
        ("{{pool}} queued", "gpushare_pool_queued_requests"),
        ("waiting for preemption", "gpushare_preempting_requests"),
    ]),
    ("Preemptions, refusals and idle culls per minute", "short", [
        ("preempted: {{reason}}",
         "sum by (reason) (rate(gpushare_preemptions_total[5m])) * 60"),
        ("refused {{pool}}: {{code}}",
         "sum by (pool, code) (rate(gpushare_refusals_total[5m])) * 60"),
        ("culled {{pool}}: {{action}}",
         "sum by (pool, action) (rate(gpushare_culls_total[5m])) * 60"),
    ]),
    ("GPU-hours this month against budget", "short", [
        ("{{team}} {{pool}}", "gpushare_team_month_gpu_seconds / 3600"),
        ("{{team}} {{pool}} budget", "gpushare_team_month_budget_gpu_seconds / 3600"),
    ]),
    ("Power per node", "watt", [
        ("{{node}}", "gpushare_node_power_watts"),
    ]),
]


def queries() -> list[str]:
    """Every PromQL expression the dashboard uses."""
    return [expr for _, _, targets in PANELS for _, expr in targets]


def dashboard() -> Dashboard:
    panels = []
    for i, (title, unit, targets) in enumerate(PANELS):
        panels.append(TimeSeries(
            title=title,
            dataSource=DS,
            unit=unit,
            targets=[
                Target(expr=expr, legendFormat=legend, refId=chr(ord("A") + k), datasource=DS)
                for k, (legend, expr) in enumerate(targets)
            ],
            gridPos=GridPos(h=8, w=12, x=12 * (i % 2), y=8 * (i // 2)),
        ))
    return Dashboard(
        title="gpushare: GPU sharing",
        uid="gpushare",
        description="Team use against guarantee, utilisation, queue, preemptions, idle shares "
        "and power, from the jupyter-gpushare broker's Prometheus metrics.",
        tags=["gpushare", "jupyterhub", "gpu"],
        timezone="utc",
        refresh="30s",
        templating=Templating(list=[
            Template(name="datasource", query="prometheus", type="datasource",
                     label="Prometheus"),
        ]),
        panels=panels,
    ).auto_panel_ids()


def render() -> str:
    data = dashboard().to_json_data()
    return json.dumps(data, cls=DashboardEncoder, indent=2, sort_keys=True) + "\n"


def main() -> int:
    OUT.write_text(render())
    print(f"wrote {OUT} ({len(queries())} queries)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
