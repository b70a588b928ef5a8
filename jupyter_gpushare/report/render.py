"""The report's output formats: json, csv (long format), md and html (one file, plots inline)."""

from __future__ import annotations

import csv
import io
import json
from html import escape
from typing import Any

from . import plots
from .document import POOL_COLUMNS, POWER_COLUMNS, TEAM_COLUMNS, num

FORMATS = ("html", "csv", "md", "json")

CSV_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
"""A spreadsheet runs a cell that starts with one of these as a formula."""

PARTIAL_LABELS = {
    "guaranteed_gpu_hours": "guaranteed GPU-h (elapsed hours)",
    "capacity_gpu_hours": "capacity GPU-h (elapsed hours)",
    "budget_used_share": "budget used so far",
}
"""Column labels that change on a month in progress (the figures stop at its ``until``)."""


def csv_text(value: str) -> str:
    """A text cell of the CSV: one that a spreadsheet would run as a formula gets a
    leading ``'`` (team names and reasons come from users and admins); line breaks are
    written as LF (inside quotes)."""
    text = "'" + value if value.startswith(CSV_FORMULA_START) else value
    # a bare CR is no line end to the writer (it would not quote it): make it one it quotes
    return text.replace("\r\n", "\n").replace("\r", "\n")


def md_text(value: Any) -> str:
    """Text for Markdown (also inside a table cell): HTML-escaped, backslash, table and
    link metacharacters escaped, line breaks made spaces."""
    text = escape(str(value).replace("\\", "\\\\"), quote=False)
    for ch in ("|", "[", "]", "`"):
        text = text.replace(ch, "\\" + ch)
    return text.replace("\r\n", " ").replace("\n", " ").replace("\r", " ")


def _labels(doc: dict[str, Any], columns: tuple[tuple[str, str], ...]) -> list[tuple[str, str]]:
    partial = bool(doc.get("partial"))
    return [(k, PARTIAL_LABELS.get(k, label) if partial else label) for k, label in columns]


def to_json(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=1, sort_keys=False) + "\n"


def _flat(row: dict[str, Any], columns: tuple[tuple[str, str], ...]) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for key, _label in columns:
        value = row.get(key)
        if isinstance(value, dict):
            out.extend((f"{key}.{k}", v) for k, v in sorted(value.items()))
        else:
            out.append((key, value))
    return out


def to_csv(doc: dict[str, Any]) -> str:
    """Long format: ``section,pool,team,node,metric,value`` (one figure per line)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["section", "pool", "team", "node", "metric", "value"])
    def row(section: str, pool: str, team: str, node: str, metric: str, value: Any) -> None:
        text = num(value)
        w.writerow([section, csv_text(pool), csv_text(team), csv_text(node), csv_text(metric),
                    csv_text(text) if isinstance(value, str) else text])

    for key in ("month", "period", "partial", "start", "until", "end", "hours", "month_hours",
                "elapsed_share", "policy_version", "power_note"):
        row("month", "", "", "", key, doc[key])
    for t in doc["teams"]:
        for metric, value in _flat(t, TEAM_COLUMNS + (("borrow_limit_units", ""),)):
            row("team", t["pool"], t["team"], "", metric, value)
    for p in doc["pools"]:
        for metric, value in _flat(p, POOL_COLUMNS):
            row("pool", p["pool"], "", "", metric, value)
    for n in doc["power"]:
        for metric, value in _flat(n, POWER_COLUMNS):
            row("power", n["pool"], "", n["node"], metric, value)
    for r in doc["recommendations"]:
        for key in ("action", "provisional", "text", "gpus", "units", "from_team", "to_team"):
            row("recommendation", r["pool"], "", "", key, r[key])
        for key, value in sorted(r["figures"].items()):
            row("recommendation", r["pool"], "", "", f"figures.{key}", value)
        if r.get("replay"):
            row("recommendation", r["pool"], "", "", "replay.supported", r["replay"]["supported"])
            row("recommendation", r["pool"], "", "", "replay.text", r["replay"]["text"])
    proj = doc.get("projection")
    if proj:
        row("projection", "", "", "", "label", proj["label"])
        row("projection", "", "", "", "factor", proj["factor"])
        for what in ("granted_gpu_hours", "budget_share"):
            for key, value in sorted(proj[what].items()):
                team, _, pool = key.rpartition("/")
                row("projection", pool, team, "", what, value)
    return buf.getvalue()


def _md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    cell = md_text
    out = ["| " + " | ".join(cell(h) for h in header) + " |"]
    out.append("|" + "|".join("---" for _ in header) + "|")
    out.extend("| " + " | ".join(cell(c) for c in r) + " |" for r in rows)
    return out


def _team_tables(doc: dict[str, Any]) -> list[tuple[str, list[str], list[list[str]]]]:
    """Per pool: (pool, header, rows) with one row per figure and one column per team."""
    out = []
    for pool in [p["pool"] for p in doc["pools"]]:
        teams = [t for t in doc["teams"] if t["pool"] == pool]
        if not teams:
            continue
        header = ["figure"] + [t["team"] for t in teams]
        rows = [[label] + [num(t[key]) for t in teams] for key, label in _labels(doc, TEAM_COLUMNS)]
        out.append((pool, header, rows))
    return out


def _pool_table(doc: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    header = ["figure"] + [p["pool"] for p in doc["pools"]]
    rows = [[label] + [num(p[key]) for p in doc["pools"]]
            for key, label in _labels(doc, POOL_COLUMNS)]
    return header, rows


def _power_table(doc: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    header = ["node"] + [label for _, label in POWER_COLUMNS]
    rows = [[n["node"]] + [num(n[key]) for key, _ in POWER_COLUMNS] for n in doc["power"]]
    return header, rows


def _period(doc: dict[str, Any]) -> str:
    """The period line every text format starts with (plain text: escape it where it goes)."""
    text = f"Period {doc['period']} ({num(doc['hours'])} hours"
    if doc.get("partial"):
        text += (f" of {num(doc['month_hours'])}; the month is in progress: every figure "
                 f"stops at {doc['until']}, nothing after it is counted")
    text += ")"
    if doc["policy_version"]:
        text += f"; policy {doc['policy_version']}"
    return text + "."


def _projection_rows(doc: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    proj = doc["projection"]
    header = ["team/pool", "projected granted GPU-h", "projected budget share"]
    rows = [[key, num(value), num(proj["budget_share"].get(key))]
            for key, value in sorted(proj["granted_gpu_hours"].items())]
    return header, rows


def to_md(doc: dict[str, Any]) -> str:
    title = f"# GPU report {md_text(doc['month'])}"
    if doc.get("partial"):
        title += f" ({md_text(doc['period'])})"
    lines = [title, "", md_text(_period(doc))]
    lines += ["", "## Recommendation", ""]
    for r in doc["recommendations"]:
        lines.append(f"- **{md_text(r['pool'])}: {md_text(r['action'])}**. {md_text(r['text'])}")
        if r.get("replay") and r["replay"]["supported"] is not None:
            lines.append(f"  - Checked by a replay of the month: {md_text(r['replay']['text'])}")
    lines += ["", "## Pools: demand against capacity", ""]
    header, rows = _pool_table(doc)
    lines += _md_table(header, rows)
    for pool, header, rows in _team_tables(doc):
        lines += ["", f"## Teams in pool {md_text(pool)}", ""]
        lines += _md_table(header, rows)
    lines += ["", "## Power per node", ""]
    if doc["power"]:
        header, rows = _power_table(doc)
        lines += _md_table(header, rows)
    if doc["power_note"]:
        lines += ["", md_text(doc["power_note"])]
    if doc.get("projection"):
        lines += ["", "## Projection (not a measurement)", "",
                  md_text(doc["projection"]["label"]) + ".", ""]
        lines += _md_table(*_projection_rows(doc))
    return "\n".join(lines) + "\n"


def _html_table(header: list[str], rows: list[list[str]], cls: str) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = "".join(
        "<tr>"
        + "".join(
            f"<th>{escape(c)}</th>" if i == 0 else f"<td>{escape(c)}</td>"
            for i, c in enumerate(r)
        )
        + "</tr>"
        for r in rows
    )
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


CSS = """
body{font-family:system-ui,sans-serif;margin:2em;color:#222;max-width:1200px}
table{border-collapse:collapse;margin:.5em 0 1.5em;font-size:13px}
th,td{border:1px solid #ccc;padding:3px 8px;text-align:right}
thead th{background:#eee}tbody th{text-align:left;font-weight:normal;background:#fafafa}
.rec{padding:.6em 1em;border-left:4px solid #4e79a7;background:#f4f7fb;margin:.4em 0}
.rec.buy{border-color:#e15759}.rec.move{border-color:#f28e2b}
figure{margin:1em 0}figcaption{font-size:13px;color:#555}
"""


def to_html(doc: dict[str, Any], series: dict[str, Any] | None = None) -> str:
    """One self-contained HTML file: tables plus inline SVG plots (no network)."""
    s = series if series is not None else doc["series"]
    days = int(s["days"])
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>GPU report {escape(doc['month'])}</title>",
        f"<style>{CSS}</style></head><body>",
        f"<h1>GPU report {escape(doc['month'])}"
        + (f' <span class="partial">({escape(doc["period"])})</span>'
           if doc.get("partial") else "")
        + "</h1>",
        f'<p class="period" data-partial="{"yes" if doc.get("partial") else "no"}">'
        f"{escape(_period(doc))}</p>",
        "<h2>Recommendation</h2>",
    ]
    for r in doc["recommendations"]:
        provisional = ' data-provisional="yes"' if r.get("provisional") else ""
        out.append(
            f'<div class="rec {escape(r["action"])}" data-pool="{escape(r["pool"])}" '
            f'data-action="{escape(r["action"])}"{provisional}><strong>{escape(r["pool"])}: '
            f"{escape(r['action'])}</strong>. {escape(r['text'])}</div>"
        )
        replayed = r.get("replay")
        if replayed and replayed["supported"] is not None:
            verdict = "supported" if replayed["supported"] else "not-supported"
            out.append(f'<div class="replay" data-pool="{escape(r["pool"])}" '
                       f'data-replay="{verdict}">Checked by a replay of the month: '
                       f"{escape(replayed['text'])}</div>")
    out.append("<h2>Pools: demand against capacity</h2>")
    header, rows = _pool_table(doc)
    out.append(_html_table(header, rows, "pools"))
    for pool, header, rows in _team_tables(doc):
        out.append(f"<h2>Teams in pool {escape(pool)}</h2>")
        out.append(_html_table(header, rows, f"teams pool-{escape(pool)}"))
    out.append("<h2>Plots</h2>")
    out.append(
        "<figure>"
        + plots.stacked_days("GPU-hours per team per day", s["gpu_hours_per_team_day"], days)
        + "<figcaption>GPU-hours granted per team per day (all pools).</figcaption></figure>"
    )
    out.append(
        "<figure>"
        + plots.histogram("Utilisation histogram", s["util_histogram_gpu_hours"])
        + "<figcaption>Measured GPU-hours by how much of its share a grant computed "
        "(red: below 30 %, data-bound or idle).</figcaption></figure>"
    )
    out.append(
        "<figure>"
        + plots.lines(
            "Queue wait over the month",
            {"median": s["wait_median_per_day_s"], "p95": s["wait_p95_per_day_s"]},
            days,
            "seconds",
        )
        + "<figcaption>Queue wait of the requests made each day (seconds).</figcaption>"
        "</figure>"
    )
    out.append("<h2>Power per node</h2>")
    if doc["power"]:
        header, rows = _power_table(doc)
        out.append(_html_table(header, rows, "power"))
    if doc["power_note"]:
        out.append(f'<p class="power-note">{escape(doc["power_note"])}</p>')
    if doc.get("projection"):
        out.append("<h2>Projection (not a measurement)</h2>")
        out.append(f'<p class="projection">{escape(doc["projection"]["label"])}.</p>')
        out.append(_html_table(*_projection_rows(doc), "projection"))
    out.append("</body></html>")
    return "\n".join(out) + "\n"


def render(doc: dict[str, Any], fmt: str) -> str:
    if fmt == "json":
        return to_json(doc)
    if fmt == "csv":
        return to_csv(doc)
    if fmt == "md":
        return to_md(doc)
    if fmt == "html":
        return to_html(doc)
    raise ValueError(f"unknown format {fmt!r}: one of {', '.join(FORMATS)}")
