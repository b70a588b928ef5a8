"""The broker's own GPU-hour figures, read to be compared (never trusted): the ledger as its
team usage answers give it, and the monthly report's granted GPU-hours per team and pool."""

from __future__ import annotations

from typing import Any

from .drivers import http
from .stack import Stack


def ledger_hours(stack: Stack, admin_token: str) -> dict[str, float]:
    """team/pool -> ``gpu_hours_month`` of ``GET /teams/<team>/usage``."""
    hours: dict[str, float] = {}
    for team, quotas in stack_policy_teams(stack).items():
        status, usage = http(f"{stack.broker_url}/teams/{team}/usage", admin_token)
        if status != 200:
            raise RuntimeError(f"teams/{team}/usage answered {status}: {usage}")
        for pool in quotas:
            figure = (usage["pools"].get(pool) or {}).get("gpu_hours_month")
            if figure is not None:
                hours[f"{team}/{pool}"] = float(figure)
    return hours


def stack_policy_teams(stack: Stack) -> dict[str, Any]:
    from .stack import policy_facts

    return dict(policy_facts(stack.policy_file)["quotas"])


def report_hours(doc: dict[str, Any]) -> dict[str, float]:
    """team/pool -> ``granted_gpu_hours`` of the report's JSON document."""
    return {f"{row['team']}/{row['pool']}": float(row["granted_gpu_hours"]) for row in doc["teams"]}
