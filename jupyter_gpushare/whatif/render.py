"""The what-if document (:func:`~.compare.side_by_side`) as Markdown, JSON or HTML."""

from __future__ import annotations

import html
import json
from typing import Any

FORMATS = ("md", "json", "html")


def _dur(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f} %"


def _count(value: int | None) -> str:
    return "-" if value is None else str(value)


def _pair(a: dict[str, Any] | None, b: dict[str, Any] | None, key: str, fmt: Any) -> str:
    left = fmt(a.get(key)) if a else "-"
    right = fmt(b.get(key)) if b else "-"
    return left if left == right else f"{left} → {right}"


TEAM_COLUMNS: tuple[tuple[str, str, Any], ...] = (
    ("demands", "demands", lambda v: "-" if v is None else str(v)),
    ("wait p50", "wait_p50_s", _dur),
    ("wait p95", "wait_p95_s", _dur),
    ("refused", "refused", lambda v: "-" if v is None else str(v)),
    ("gave up", "gave_up", lambda v: "-" if v is None else str(v)),
    ("lost GPU-h", "lost_gpu_hours", _num),
    ("preemptions", "preemptions", lambda v: "-" if v is None else str(v)),
    ("GPU-h granted", "gpu_hours", _num),
    ("GPU-h measured", "measured_gpu_hours", _num),
    ("GPU-h idle", "idle_gpu_hours", _num),
    ("unmeasured", "unmeasured_demands", _count),
    ("guarantee met", "guarantee_met_share", _share),
)
POOL_COLUMNS: tuple[tuple[str, str, Any], ...] = (
    ("GPUs", "gpus", lambda v: "-" if v is None else f"{v:g}"),
    ("GPU-h granted", "gpu_hours", _num),
    ("GPU-h unallocated", "unallocated_gpu_hours", _num),
    ("GPU-h measured", "measured_gpu_hours", _num),
    ("GPU-h idle", "idle_gpu_hours", _num),
    ("unmeasured", "unmeasured_demands", _count),
    ("guarantee met", "guarantee_met_share", _share),
)


def _rows(doc: dict[str, Any], section: str, first: tuple[str, ...],
          columns: tuple[tuple[str, str, Any], ...]) -> list[list[str]]:
    a_label, b_label = doc["labels"]
    rows = []
    for item in doc[section]:
        a, b = item.get(a_label), item.get(b_label)
        rows.append([str(item[k]) for k in first] + [_pair(a, b, key, fmt)
                                                    for _, key, fmt in columns])
    return rows


def _summary_lines(doc: dict[str, Any]) -> list[str]:
    a_label, b_label = doc["labels"]
    origin = (f"from {doc['source']}" if doc.get("source")
              else f"{doc.get('requests', '?')} recorded requests")
    lines = [f"Month {doc.get('month', '?')}: {doc.get('demands', '?')} demands ({origin}), "
             f"replayed under the {a_label} policy and under the {b_label} "
             f"(figures `{a_label} → {b_label}`)."]
    if doc.get("added"):
        lines.append(f"Cards added: {', '.join(doc['added'])}; GPU-hours gained per card: "
                     f"{_num(doc.get('gpu_hours_gained_per_card'))}.")
    fid = doc.get("fidelity")
    if fid:
        lines.append(f"Fidelity: the {a_label} policy replayed puts "
                     f"{fid['exact_share'] * 100:.1f} % of the {fid['recorded']} recorded grants "
                     f"on the same node and GPUs; largest team GPU-hour difference "
                     f"{fid['max_hours_error'] * 100:.2f} %.")
    return lines


def to_markdown(doc: dict[str, Any]) -> str:
    out = [f"# What if: {doc.get('title', 'replay')}", ""]
    out += _summary_lines(doc) + ["", f"Demand model: {doc['demand_model']}", ""]
    for title, section, first, cols in (
        ("Per team and pool", "teams", ("team", "pool"), TEAM_COLUMNS),
        ("Per pool", "pools", ("pool",), POOL_COLUMNS),
    ):
        head = [*first, *(c[0] for c in cols)]
        out += [f"## {title}", "", "| " + " | ".join(head) + " |",
                "|" + "---|" * len(head)]
        out += ["| " + " | ".join(r) + " |" for r in _rows(doc, section, first, cols)]
        out.append("")
    return "\n".join(out)


def to_json(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=2, sort_keys=False) + "\n"


def _bars(doc: dict[str, Any]) -> str:
    """An inline SVG: GPU-hours granted per team and pool, both replays side by side."""
    a_label, b_label = doc["labels"]
    items = [(f"{t['team']}/{t['pool']}", (t.get(a_label) or {}).get("gpu_hours", 0.0),
              (t.get(b_label) or {}).get("gpu_hours", 0.0)) for t in doc["teams"]]
    top = max([max(a, b) for _, a, b in items] + [1.0])
    width, row = 600, 26
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width + 180}" '
             f'height="{row * len(items) + 30}" role="img" aria-label="GPU-hours granted">']
    for i, (name, a, b) in enumerate(items):
        y = i * row + 20
        parts.append(f'<text x="0" y="{y + 12}" font-size="12">{html.escape(name)}</text>')
        parts.append(f'<rect x="170" y="{y}" width="{a / top * width:.1f}" height="10" '
                     f'fill="#888"><title>{a_label}: {a:.1f}</title></rect>')
        parts.append(f'<rect x="170" y="{y + 11}" width="{b / top * width:.1f}" height="10" '
                     f'fill="#2a6"><title>{b_label}: {b:.1f}</title></rect>')
    parts.append(f'<text x="170" y="12" font-size="12">GPU-hours granted: grey {a_label}, '
                 f'green {b_label}</text></svg>')
    return "".join(parts)


def to_html(doc: dict[str, Any]) -> str:
    esc = html.escape
    out = ["<!doctype html><html><head><meta charset='utf-8'>",
           f"<title>What if: {esc(str(doc.get('title', 'replay')))}</title>",
           "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
           "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}"
           "td:first-child,th:first-child{text-align:left}</style></head><body>",
           f"<h1>What if: {esc(str(doc.get('title', 'replay')))}</h1>"]
    out += [f"<p>{esc(line)}</p>" for line in _summary_lines(doc)]
    out.append(f"<p><em>Demand model:</em> {esc(doc['demand_model'])}</p>")
    out.append(_bars(doc))
    for title, section, first, cols in (
        ("Per team and pool", "teams", ("team", "pool"), TEAM_COLUMNS),
        ("Per pool", "pools", ("pool",), POOL_COLUMNS),
    ):
        out.append(f"<h2>{esc(title)}</h2><table><tr>")
        out += [f"<th>{esc(h)}</th>" for h in (*first, *(c[0] for c in cols))]
        out.append("</tr>")
        for r in _rows(doc, section, first, cols):
            out.append("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in r) + "</tr>")
        out.append("</table>")
    out.append("</body></html>\n")
    return "".join(out)


def render(doc: dict[str, Any], fmt: str) -> str:
    if fmt == "json":
        return to_json(doc)
    if fmt == "html":
        return to_html(doc)
    return to_markdown(doc)
