"""The gpushare Grafana dashboard, built with Grafana's grafana-foundation-sdk.

    jupyter-gpushare dashboard --rebuild -o jupyter_gpushare/grafana/gpushare-dashboard.json

Import the JSON in Grafana (Dashboards -> Import). Its variables: ``datasource`` (any
Prometheus data source; every panel and query refers to it by a uid object),
``job`` and ``instance`` (the scrape job and target of one broker, listed from
``gpushare_pool_capacity_gpus``); every query filters by both, so hubs scraped by one
Prometheus are never summed together. ``tests/test_grafana_dashboard.py`` decodes the JSON
with the SDK and runs every query against a real Prometheus scraping a real broker.
"""

from __future__ import annotations

import json
from typing import Any

from grafana_foundation_sdk.builders import dashboard as gd
from grafana_foundation_sdk.builders import prometheus, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard as dm

from .panels import INSTANCE_VAR, JOB_VAR, PANELS, VARIABLE_METRIC, PanelSpec

UID = "gpushare"
TITLE = "gpushare: GPU sharing"
DATASOURCE_VAR = "datasource"
DATASOURCE = dm.DataSourceRef(type_val="prometheus", uid=f"${{{DATASOURCE_VAR}}}")
"""Every panel, query and variable uses the data source the ``datasource`` variable picks."""

WIDTH, HEIGHT, COLUMNS = 12, 8, 2


def _datasource_variable() -> gd.DatasourceVariable:
    return gd.DatasourceVariable(DATASOURCE_VAR).label("Prometheus").type("prometheus")


def _label_variable(name: str, label: str, selector: str) -> gd.QueryVariable:
    return (
        gd.QueryVariable(name)
        .label(label)
        .datasource(DATASOURCE)
        .query(f"label_values({VARIABLE_METRIC}{selector}, {name})")
        .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(dm.VariableSort.ALPHABETICAL_ASC)
        .multi(False)
        .include_all(False)
    )


def _panel(index: int, spec: PanelSpec) -> timeseries.Panel:
    panel = (
        timeseries.Panel()
        .id(index + 1)
        .title(spec.title)
        .datasource(DATASOURCE)
        .unit(spec.unit)
        .line_width(1)
        .fill_opacity(10)
        .grid_pos(dm.GridPos(h=HEIGHT, w=WIDTH, x=WIDTH * (index % COLUMNS),
                             y=HEIGHT * (index // COLUMNS)))
    )
    if spec.description:
        panel = panel.description(spec.description)
    for k, query in enumerate(spec.queries):
        panel = panel.with_target(
            prometheus.Dataquery()
            .expr(query.expr)
            .legend_format(query.legend)
            .ref_id(chr(ord("A") + k))
            .datasource(DATASOURCE)
        )
    return panel


def build() -> dm.Dashboard:
    """The dashboard as the SDK's model."""
    board = (
        gd.Dashboard(TITLE)
        .uid(UID)
        .description("Team use against guarantee, utilisation, queue, preemptions, idle "
                     "shares, grant ends and power, from the jupyter-gpushare broker's "
                     "Prometheus metrics, for one broker (job and instance).")
        .tags(["gpushare", "jupyterhub", "gpu"])
        .timezone("utc")
        .refresh("30s")
        .time("now-6h", "now")
        .with_variable(_datasource_variable())
        .with_variable(_label_variable(JOB_VAR, "Job", ""))
        .with_variable(_label_variable(INSTANCE_VAR, "Instance", f'{{job=~"${JOB_VAR}"}}'))
    )
    for i, spec in enumerate(PANELS):
        board = board.with_panel(_panel(i, spec))
    return board.build()


def to_data() -> dict[str, Any]:
    """The dashboard as Grafana's JSON model (a dict)."""
    data: dict[str, Any] = json.loads(json.dumps(build(), cls=JSONEncoder))
    return data


def render() -> str:
    """The dashboard JSON, as ``jupyter-gpushare dashboard`` prints it."""
    return json.dumps(to_data(), indent=2, sort_keys=True) + "\n"
