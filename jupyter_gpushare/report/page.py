"""The monthly report as a page people read at a glance (the broker's ``admin/report``).

The same document as every file format (:mod:`.document`), shown for reading: the
recommendation on top with the figures behind it, four plots (GPU-hours per team per day
against the guarantee, the utilisation distribution, the queue wait, borrowing and
lending), then the tables with every figure rounded and its unit named
(:mod:`.reading`). A month in progress says so in its title and period. Every figure keeps
its exact value in a ``data-value`` attribute (what the tests recompute).

:func:`for_team` cuts a document down to one team (what a team admin may see): the team's
rows, the recommendations that name it, its own daily GPU-hours and its projection.
"""

from __future__ import annotations

import copy
from html import escape
from typing import Any

from . import page_plots, reading
from .document import POOL_COLUMNS, TEAM_COLUMNS

RECOMMENDATION_FIGURES = {
    "capacity_gpu_hours": "capacity",
    "granted_gpu_hours": "granted",
    "demand_gpu_hours": "demand (granted + queued + refused)",
    "unmet_gpu_hours": "unmet demand (queued + refused)",
    "occupancy": "granted / capacity",
    "utilisation": "utilisation of granted GPUs",
    "need_units": "needed above guarantee (average)",
    "spare_units": "unused guarantee (average)",
    "elapsed_share": "share of the month elapsed",
}

CSS = """
body{max-width:1700px!important}
.rec{padding:.6em 1em;border-left:5px solid #4e79a7;background:#f4f7fb;margin:.5em 0}
.rec.buy{border-color:#e15759}.rec.move{border-color:#f28e2b}.rec h3{margin:0 0 .3em;font-size:16px}
.rec dl{display:grid;grid-template-columns:max-content max-content;gap:.1em 1em;margin:.4em 0 0;
font-size:13px}.rec dt{color:#555}.rec dd{margin:0;text-align:right}
.plots{display:grid;grid-template-columns:repeat(auto-fill,minmax(800px,1fr));gap:1em}
figure{margin:0}figcaption{font-size:13px;color:#555;max-width:720px}
.partial-badge{background:#f28e2b;color:#fff;border-radius:3px;padding:0 .4em;font-size:14px}
.downloads a{margin-right:.8em}td.num,th.num{text-align:right}
table.figures{font-size:13px;margin:.4em 0 1.4em}table.figures tbody th{text-align:left;
font-weight:normal;background:#fafafa}.note{color:#555;font-size:13px}
"""


def for_team(doc: dict[str, Any], team: str) -> dict[str, Any]:
    """The document as team ``team``'s admins may see it (a copy)."""
    out = copy.deepcopy(doc)
    out["team"] = team
    out["teams"] = [t for t in doc["teams"] if t["team"] == team]
    out["pools"] = []
    out["power"] = []
    out["power_note"] = ""
    out["recommendations"] = [
        r for r in doc["recommendations"] if team in (r.get("from_team"), r.get("to_team"))
    ]
    series = dict(doc["series"])
    series["gpu_hours_per_team_day"] = {
        k: v for k, v in doc["series"]["gpu_hours_per_team_day"].items() if k == team
    }
    series["util_histogram_gpu_hours"] = []
    series["wait_median_per_day_s"] = []
    series["wait_p95_per_day_s"] = []
    out["series"] = series
    if doc.get("projection"):
        proj = dict(doc["projection"])
        for what in ("granted_gpu_hours", "budget_share"):
            proj[what] = {k: v for k, v in proj[what].items() if k.rpartition("/")[0] == team}
        out["projection"] = proj
    return out


def figure_text(key: str, value: Any) -> str:
    """A figure of the document for reading, its unit chosen by its key."""
    if isinstance(value, dict):
        return reading.counts(value)
    if value is None:
        return reading.NONE
    if key.endswith("gpu_hours"):
        return reading.gpu_hours(value)
    if key.endswith(("_share", "share")) or key in ("occupancy", "utilisation"):
        return reading.percent(value)
    if key.endswith("_s"):
        return reading.duration(value)
    if key.endswith("_units") or key == "units":
        return reading.units(value)
    if key.endswith("_w"):
        return reading.watts(value)
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    return reading.amount(value)


def _cell(key: str, value: Any) -> str:
    raw = "" if value is None or isinstance(value, dict) else f' data-value="{value}"'
    return f'<td class="num" data-key="{escape(key)}"{raw}>{escape(figure_text(key, value))}</td>'


def title(doc: dict[str, Any]) -> str:
    text = f"GPU report {doc['month']}"
    if doc.get("team"):
        text += f", team {doc['team']}"
    return text + (" (partial: month in progress)" if doc.get("partial") else "")


def period(doc: dict[str, Any]) -> str:
    hours = reading.amount(doc["hours"])
    if doc.get("partial"):
        return (
            f"Partial month: {doc['start'][:10]} to {doc['until'][:16].replace('T', ' ')}"
            f" UTC ({hours} of {reading.amount(doc['month_hours'])} hours, "
            f"{reading.percent(doc['elapsed_share'])} of the month). Every figure stops "
            "there; nothing after it is counted."
        )
    return f"The whole month: {doc['start'][:10]} to {doc['end'][:10]} ({hours} hours)."


def downloads(links: dict[str, str]) -> str:
    names = {
        "html": "HTML (one file, plots inline)",
        "csv": "CSV",
        "md": "Markdown",
        "json": "JSON",
    }
    items = "".join(
        f'<a class="download" data-format="{escape(f)}" href="{escape(href)}" '
        f"download>{escape(names.get(f, f))}</a>"
        for f, href in links.items()
    )
    return f'<p class="downloads">Download: {items}</p>'


def recommendations(doc: dict[str, Any]) -> str:
    if not doc["recommendations"]:
        return '<p class="note">No recommendation names this team this month.</p>'
    out = []
    for r in doc["recommendations"]:
        figs = "".join(
            f"<dt>{escape(RECOMMENDATION_FIGURES.get(k, k.replace('_', ' ')))}</dt>"
            f'<dd data-key="{escape(k)}" data-value="{v}">{escape(figure_text(k, v))}</dd>'
            for k, v in r["figures"].items()
        )
        replay = r.get("replay")
        checked = (
            f'<p class="replay">Checked by a replay of the month: {escape(replay["text"])}</p>'
            if replay and replay.get("supported") is not None
            else ""
        )
        provisional = (
            ' <span class="partial-badge">provisional</span>' if r.get("provisional") else ""
        )
        out.append(
            f'<div class="rec {escape(r["action"])}" data-pool="{escape(r["pool"])}" '
            f'data-action="{escape(r["action"])}"><h3>Pool {escape(r["pool"])}: '
            f"{escape(r['action'])}{provisional}</h3><p>{escape(r['text'])}</p>{checked}"
            f"<dl>{figs}</dl></div>"
        )
    return "".join(out)


def _guarantee_per_day(doc: dict[str, Any]) -> float:
    return 24.0 * sum(float(t["guaranteed_units"] or 0) for t in doc["teams"])


def plots(doc: dict[str, Any]) -> str:
    s = doc["series"]
    days = int(s["days"])
    figures = [
        (
            page_plots.team_days(s["gpu_hours_per_team_day"], _guarantee_per_day(doc), days),
            "GPU-hours granted per team per day (all pools), stacked; the dashed line is the "
            "GPU-hours a day the teams shown are guaranteed."
            + (" The last day is in progress." if doc.get("partial") else ""),
        )
    ]
    if s["util_histogram_gpu_hours"]:
        figures.append(
            (
                page_plots.utilisation(s["util_histogram_gpu_hours"]),
                "Measured GPU-hours by the share of its GPUs a grant computed: "
                "red bars are idle or data-bound time.",
            )
        )
    if s["wait_median_per_day_s"]:
        figures.append(
            (
                page_plots.queue_wait(s["wait_median_per_day_s"], s["wait_p95_per_day_s"], days),
                "Queue wait of the requests made each day that got a grant "
                "(a dot per day with requests).",
            )
        )
    per_team: dict[str, list[float]] = {}
    for t in doc["teams"]:
        acc = per_team.setdefault(t["team"], [0.0, 0.0])
        acc[0] += float(t["borrowed_gpu_hours"] or 0)
        acc[1] += float(t["lent_gpu_hours"] or 0)
    figures.append(
        (
            page_plots.borrow_lend([(k, v[0], v[1]) for k, v in per_team.items()]),
            "GPU-hours each team used above its guarantee (borrowed) and let others "
            "use from its unused guarantee (lent), all pools.",
        )
    )
    return (
        '<div class="plots">'
        + "".join(
            f"<figure>{svg}<figcaption>{escape(cap)}</figcaption></figure>" for svg, cap in figures
        )
        + "</div>"
    )


def _figures_table(cls: str, names: list[str], rows: list[tuple[str, str, list[Any]]]) -> str:
    head = "".join(f'<th class="num">{escape(n)}</th>' for n in names)
    body = "".join(
        f'<tr data-key="{escape(key)}"><th>{escape(label)}</th>'
        + "".join(_cell(key, v) for v in values)
        + "</tr>"
        for key, label, values in rows
    )
    return (
        f'<table class="figures {escape(cls)}"><thead><tr><th>figure</th>{head}</tr>'
        f"</thead><tbody>{body}</tbody></table>"
    )


def _label(label: str) -> str:
    """Column labels for reading: ``(s)`` goes (the cell says ``5 min``), ``(units)``
    becomes ``GPUs`` and ``GPU-h`` ``GPU-hours`` (so ``guaranteed GPUs`` and ``guaranteed
    GPU-hours`` stay two rows a reader tells apart)."""
    return label.replace(" (s)", "").replace(" (units)", " GPUs").replace(" GPU-h", " GPU-hours")


def tables(doc: dict[str, Any]) -> str:
    out = []
    if doc["pools"]:
        names = [p["pool"] for p in doc["pools"]]
        rows = [(k, _label(lbl), [p[k] for p in doc["pools"]]) for k, lbl in POOL_COLUMNS]
        out.append("<h2>Pools: demand against capacity</h2>" + _figures_table("pools", names, rows))
    if doc.get("team"):  # one team: its pools side by side
        rows_t = [(k, _label(lbl), [t[k] for t in doc["teams"]]) for k, lbl in TEAM_COLUMNS]
        out.append(
            f"<h2>Team {escape(doc['team'])} per pool</h2>"
            + _figures_table("teams team-pools", [t["pool"] for t in doc["teams"]], rows_t)
        )
    for pool in () if doc.get("team") else dict.fromkeys(t["pool"] for t in doc["teams"]):
        teams = [t for t in doc["teams"] if t["pool"] == pool]
        rows = [(k, _label(lbl), [t[k] for t in teams]) for k, lbl in TEAM_COLUMNS]
        out.append(
            f"<h2>Teams in pool {escape(pool)}</h2>"
            + _figures_table(f"teams pool-{pool}", [t["team"] for t in teams], rows)
        )
    if doc["power"]:
        rows_p = "".join(
            f'<tr data-node="{escape(n["node"])}"><th>{escape(n["node"])}</th>'
            f"<td>{escape(n['pool'])}</td>{_cell('hours', n['hours'])}"
            f"{_cell('peak_w', n['peak_w'])}{_cell('average_w', n['average_w'])}"
            f'<td class="num">{escape(reading.amount(n["peak_to_average"]))}</td></tr>'
            for n in doc["power"]
        )
        out.append(
            '<h2>Power per node</h2><table class="figures power"><thead><tr><th>node'
            '</th><th>pool</th><th class="num">hours with samples</th><th class="num">'
            'peak</th><th class="num">average</th><th class="num">peak / average</th>'
            f"</tr></thead><tbody>{rows_p}</tbody></table>"
        )
    if doc["power_note"]:
        out.append(f'<p class="note power-note">{escape(doc["power_note"])}</p>')
    proj = doc.get("projection")
    if proj and proj["granted_gpu_hours"]:
        rows_j = "".join(
            f"<tr><th>{escape(k)}</th>{_cell('granted_gpu_hours', v)}"
            f"{_cell('budget_share', proj['budget_share'].get(k))}</tr>"
            for k, v in sorted(proj["granted_gpu_hours"].items())
        )
        out.append(
            f'<h2>Projection to the month\'s end (not a measurement)</h2><p class="note">'
            f'{escape(proj["label"])}.</p><table class="figures projection"><thead><tr>'
            '<th>team/pool</th><th class="num">projected granted</th><th class="num">'
            f"projected budget used</th></tr></thead><tbody>{rows_j}</tbody></table>"
        )
    return "".join(out)


def body(doc: dict[str, Any], links: dict[str, str]) -> str:
    """The page's body (inside the broker's page frame, whose ``<h1>`` is :func:`title`)."""
    partial = "yes" if doc.get("partial") else "no"
    badge = '<span class="partial-badge">partial month</span> ' if doc.get("partial") else ""
    return (
        f"<style>{CSS}</style>"
        f'<div id="gpushare-report" data-month="{escape(doc["month"])}" '
        f'data-partial="{partial}" data-start="{escape(doc["start"])}" '
        f'data-until="{escape(doc["until"])}">'
        f'<p class="period" data-partial="{partial}">{badge}{escape(period(doc))}'
        + (f" Policy {escape(doc['policy_version'])}." if doc.get("policy_version") else "")
        + "</p>"
        + downloads(links)
        + "<h2>Recommendation</h2>"
        + recommendations(doc)
        + "<h2>At a glance</h2>"
        + plots(doc)
        + tables(doc)
        + "</div>"
    )


def standalone(doc: dict[str, Any]) -> str:
    """The page as one HTML file (a team's ``format=html`` download)."""
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{escape(title(doc))}</title><style>body{{font-family:system-ui,sans-serif;"
        "margin:2em;max-width:1600px}table{border-collapse:collapse}td,th{border:1px solid "
        f"#ccc;padding:3px 8px}}</style></head><body><h1>{escape(title(doc))}</h1>"
        f"{body(doc, {})}</body></html>\n"
    )


__all__ = ["body", "figure_text", "for_team", "standalone", "title"]
