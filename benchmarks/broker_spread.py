"""The broker benchmark's figures over ``--reps``: each arm's median (min-max), and with
``--baseline`` the now/base ratio of each rep's two arms (they ran next to each other, so a
pair shares the machine's moment better than the medians of all runs do)."""

from __future__ import annotations

import statistics
from typing import Any

# (key in a run's figures, what it is, format)
FIGURES = (
    ("throughput", "admissions/s", "{:.0f}"),
    ("cpu_ms", "CPU per admission ms", "{:.3f}"),
    ("rate", "achieved/s", "{:.0f}"),
    ("p99", "p99 ms", "{:.2f}"),
)


def median_range(values: list[float], fmt: str = "{:.2f}") -> str:
    """``median (min-max)`` of ``values`` (at least one)."""
    if not values:
        raise ValueError("median_range: no values (--reps must be at least 1)")
    low, high = min(values), max(values)
    return f"{fmt.format(statistics.median(values))} ({fmt.format(low)}-{fmt.format(high)})"


def arm_lines(results: dict[str, dict[str, Any]]) -> list[str]:
    """One line per arm run more than once: the median (min-max) of each of ``FIGURES``."""
    by_arm: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for run in results.values():
        by_arm.setdefault(run["arm"], []).append(run)
    lines = []
    for (db, arm), runs in by_arm.items():
        if len(runs) < 2:
            continue
        parts = [
            f"{what} {median_range([r[key] for r in runs], fmt)}" for key, what, fmt in FIGURES
        ]
        lines.append(f"{db} {arm}: median (min-max) of {len(runs)} runs: " + ", ".join(parts))
    return lines


def pair_ratios(results: dict[str, dict[str, Any]], db: str, arm: str, key: str) -> list[float]:
    """``key`` of ``arm`` ("now" or "now/MODE") over its baseline's ("base", "base/MODE"),
    rep by rep, on database ``db``."""
    base_arm = "base" + arm.removeprefix("now")
    by_rep = {(r["arm"][1], r["rep"]): r[key] for r in results.values() if r["arm"][0] == db}
    ratios = []
    for (name, rep), value in sorted(by_rep.items()):
        if name != arm:
            continue
        if (base_arm, rep) not in by_rep:
            raise ValueError(f"pair_ratios: {db} {arm} rep {rep} has no {base_arm} run")
        base = by_rep[(base_arm, rep)]
        ratios.append(value / base if base else float("nan"))
    return ratios


def ratio_lines(results: dict[str, dict[str, Any]]) -> list[str]:
    """With a baseline: per database and arm, now/base of each rep's pair, median (min-max)."""
    lines = []
    arms = sorted({r["arm"] for r in results.values() if r["arm"][1].startswith("now")})
    for db, arm in arms:
        parts = []
        for key, what, _ in FIGURES:
            ratios = pair_ratios(results, db, arm, key)
            parts.append(f"{what} {median_range(ratios)} [{', '.join(f'{x:.2f}' for x in ratios)}]")
        lines.append(f"{db} {arm}/base, each rep's pair: " + ", ".join(parts))
    return lines
