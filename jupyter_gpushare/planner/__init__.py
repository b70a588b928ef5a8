"""Capacity planning: how many cards which teams need, and how to split them.

``jupyter-gpushare plan TEAMS.yaml`` reads a declarative input (teams, kinds of work, model
sizes, peak concurrency, scheduler, racks' power and cooling, growth; see
``hub_config/plan-example.yaml``), estimates memory per task from first principles
(:mod:`.memory`), packs the tasks into pools (:mod:`.packing`, :mod:`.plan`), checks power
and cooling (:mod:`.power`) and writes a draft policy (:mod:`.draft`) and a report
(:mod:`.report`). The card catalogue is ``cards.yaml`` next to this file.
"""

from __future__ import annotations

from .draft import draft_policy
from .plan import Plan, make_plan
from .reader import PlanError, load_catalogue, parse_plan_input, read_plan_file
from .report import html_report, markdown_report, text_summary

__all__ = [
    "Plan",
    "PlanError",
    "draft_policy",
    "html_report",
    "load_catalogue",
    "make_plan",
    "markdown_report",
    "parse_plan_input",
    "read_plan_file",
    "text_summary",
]
