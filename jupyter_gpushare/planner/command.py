"""The ``plan`` subcommand: ``jupyter-gpushare plan TEAMS.yaml``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..cli import Command, register


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="the planning input (YAML), e.g. hub_config/plan-example.yaml")
    parser.add_argument("--policy", metavar="FILE",
                        help="write the draft policy here (check it with check-policy)")
    parser.add_argument("--report", metavar="FILE",
                        help="write the report here, markdown (.md) or HTML (.html/.htm)")
    parser.add_argument("--html", metavar="FILE", help="also write the HTML report here")
    parser.add_argument("--cards", metavar="FILE", action="append", default=[],
                        help="an extra card catalogue (may repeat; overrides cards by name)")
    parser.add_argument("--for", dest="when", choices=("grown", "now"), default="grown",
                        help="which plan the draft policy is for (default: after growth)")


def _write(path: str, text: str) -> None:
    Path(path).write_text(text, encoding="utf-8")
    print(f"wrote {path}")


def _run(args: argparse.Namespace) -> int:
    from . import PlanError, draft_policy, make_plan, read_plan_file, text_summary
    from .report import html_report, markdown_report

    try:
        inp = read_plan_file(args.file, tuple(args.cards))
    except PlanError as exc:
        count = len(exc.errors)
        print(f"{args.file}: {count} error{'s' if count != 1 else ''}", file=sys.stderr)
        for issue in exc.errors:
            print(f"  {issue}", file=sys.stderr)
        return 1
    plan = make_plan(inp)
    print(text_summary(plan))
    if args.policy:
        _write(args.policy, draft_policy(plan, plan.now if args.when == "now" else plan.grown))
    if args.report:
        html = args.report.lower().endswith((".html", ".htm"))
        _write(args.report, html_report(plan) if html else markdown_report(plan))
    if args.html:
        _write(args.html, html_report(plan))
    return 0


register(Command(
    "plan",
    "Plan GPU capacity from teams' work: cards per pool, a draft policy and a report",
    _arguments,
    _run,
))
