"""The dashboard's panels and queries, as plain data (no Grafana library needed).

Every metric selector carries :data:`FILTER`, so a Prometheus that scrapes two hubs (two
jobs, or two instances of one job) never sums them: the dashboard's ``job`` and
``instance`` variables pick one broker.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

JOB_VAR = "job"
INSTANCE_VAR = "instance"
FILTER = f'job=~"${JOB_VAR}", instance=~"${INSTANCE_VAR}"'
"""The label matchers every selector of every query carries."""

VARIABLE_METRIC = "gpushare_pool_capacity_gpus"
"""The metric the ``job`` and ``instance`` variables list their values from (every broker
exports it for each pool of its policy)."""


def m(name: str, extra: str = "") -> str:
    """The selector of metric ``name`` with the dashboard's filter (and ``extra`` matchers)."""
    return f"{name}{{{FILTER}{', ' + extra if extra else ''}}}"


@dataclass(frozen=True)
class Query:
    legend: str
    expr: str


@dataclass(frozen=True)
class PanelSpec:
    title: str
    unit: str
    queries: tuple[Query, ...]
    description: str = ""


def _q(legend: str, expr: str) -> Query:
    return Query(legend, expr)


PANELS: tuple[PanelSpec, ...] = (
    PanelSpec("Team use against guarantee (GPUs)", "short", (
        _q("{{team}} in use", f"sum by (team) ({m('gpushare_team_used_gpus')})"),
        _q("{{team}} guaranteed", f"sum by (team) ({m('gpushare_team_guaranteed_gpus')})"),
        _q("{{team}} guarantee + borrow limit",
           f"sum by (team) ({m('gpushare_team_guaranteed_gpus')}"
           f" + {m('gpushare_team_borrow_limit_gpus')})"),
        _q("{{team}} borrowed", f"sum by (team) ({m('gpushare_team_borrowed_gpus')})"),
    )),
    PanelSpec("Utilisation of held GPUs (measured)", "percentunit", (
        _q("{{team}}", f"sum by (team) ({m('gpushare_team_busy_gpus')})"
                       f" / sum by (team) ({m('gpushare_team_measured_gpus')})"),
    )),
    PanelSpec("Idle share of held GPUs per pool", "percentunit", (
        _q("{{pool}}", f"1 - sum by (pool) ({m('gpushare_team_busy_gpus')})"
                       f" / sum by (pool) ({m('gpushare_team_measured_gpus')})"),
    )),
    PanelSpec("Pool capacity and use (GPUs)", "short", (
        _q("{{pool}} capacity", m("gpushare_pool_capacity_gpus")),
        _q("{{pool}} in use", f"sum by (pool) ({m('gpushare_team_used_gpus')})"),
    )),
    PanelSpec("Queue", "short", (
        _q("{{pool}} queued", m("gpushare_pool_queued_requests")),
        _q("waiting for preemption", m("gpushare_preempting_requests")),
    )),
    PanelSpec("Preemptions, refusals and idle culls per minute", "short", (
        _q("preempted: {{reason}}",
           f"sum by (reason) (rate({m('gpushare_preemptions_total')}[5m])) * 60"),
        _q("refused {{pool}}: {{code}}",
           f"sum by (pool, code) (rate({m('gpushare_refusals_total')}[5m])) * 60"),
        _q("culled {{pool}}: {{action}}",
           f"sum by (pool, action) (rate({m('gpushare_culls_total')}[5m])) * 60"),
    )),
    PanelSpec("GPU-hours this month against budget", "short", (
        _q("{{team}} {{pool}}", f"{m('gpushare_team_month_gpu_seconds')} / 3600"),
        _q("{{team}} {{pool}} budget",
           f"{m('gpushare_team_month_budget_gpu_seconds')} / 3600"),
    )),
    PanelSpec("Power per node", "watt", (
        _q("{{node}}", m("gpushare_node_power_watts")),
    )),
    PanelSpec("Live grants, admissions and grant ends per minute", "short", (
        _q("live {{pool}} {{kind}}", m("gpushare_grants")),
        _q("admitted {{pool}}: {{outcome}}",
           f"sum by (pool, outcome) (rate({m('gpushare_admissions_total')}[5m])) * 60"),
        _q("ended: {{reason}}",
           f"sum by (reason) (rate({m('gpushare_releases_total')}[5m])) * 60"),
    ), "Grants ended, by the kind of their end record (released, preempted, culled, "
       "expired, node_lost, reconciled, policy)."),
    PanelSpec("Drained nodes", "short", (
        _q("{{node}} ({{pool}})", m("gpushare_node_drained")),
    )),
)

METRIC_RE = re.compile(r"\b(gpushare_[a-z_]+)")


def queries() -> list[str]:
    """Every PromQL expression of the dashboard's panels, as written (with variables)."""
    return [q.expr for panel in PANELS for q in panel.queries]


def substitute(expr: str, job: str, instance: str) -> str:
    """``expr`` with the dashboard's variables replaced by values, as Grafana would."""
    return expr.replace(f"${JOB_VAR}", job).replace(f"${INSTANCE_VAR}", instance)


def metrics() -> list[str]:
    """The metric names the panels query (sorted, each once)."""
    return sorted({name for expr in queries() for name in METRIC_RE.findall(expr)})
