"""Inline SVG plots of the HTML report (no library, no network, a few kB each)."""

from __future__ import annotations

from html import escape

PALETTE = (
    "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
    "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac",
)
W, H = 720, 260
ML, MR, MT, MB = 56, 150, 16, 36


def _axis(ymax: float, ylabel: str, xlabels: list[tuple[float, str]]) -> list[str]:
    parts = [
        f'<line x1="{ML}" y1="{H - MB}" x2="{W - MR}" y2="{H - MB}" stroke="#333"/>',
        f'<line x1="{ML}" y1="{MT}" x2="{ML}" y2="{H - MB}" stroke="#333"/>',
        f'<text x="12" y="{MT + (H - MT - MB) / 2:.0f}" font-size="11" '
        f'transform="rotate(-90 12 {MT + (H - MT - MB) / 2:.0f})" text-anchor="middle">'
        f"{escape(ylabel)}</text>",
    ]
    for i in range(5):
        v = ymax * i / 4
        y = H - MB - (H - MT - MB) * i / 4
        parts.append(
            f'<text x="{ML - 4}" y="{y + 4:.1f}" font-size="10" text-anchor="end">{v:.3g}</text>'
        )
        parts.append(
            f'<line x1="{ML}" y1="{y:.1f}" x2="{W - MR}" y2="{y:.1f}" stroke="#ddd"/>'
        )
    for x, label in xlabels:
        parts.append(
            f'<text x="{x:.1f}" y="{H - MB + 14}" font-size="10" text-anchor="middle">'
            f"{escape(label)}</text>"
        )
    return parts


def _svg(title: str, parts: list[str]) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" role="img" viewBox="0 0 {W} {H}" '
        f'width="{W}" height="{H}"><title>{escape(title)}</title>' + "".join(parts) + "</svg>"
    )


def _legend(names: list[str]) -> list[str]:
    out = []
    for i, name in enumerate(names[:20]):
        y = MT + 14 * i
        out.append(
            f'<rect x="{W - MR + 10}" y="{y}" width="10" height="10" '
            f'fill="{PALETTE[i % len(PALETTE)]}"/>'
            f'<text x="{W - MR + 24}" y="{y + 9}" font-size="10">{escape(name)}</text>'
        )
    if len(names) > 20:
        out.append(
            f'<text x="{W - MR + 10}" y="{MT + 14 * 20 + 9}" font-size="10">'
            f"+{len(names) - 20} more</text>"
        )
    return out


def stacked_days(title: str, per_team: dict[str, list[float]], days: int) -> str:
    """GPU-hours per team per day as stacked bars."""
    totals = [sum(v[d] for v in per_team.values()) for d in range(days)]
    ymax = max(totals, default=0.0) or 1.0
    plot_w = W - ML - MR
    bw = plot_w / max(1, days)
    xl = [(ML + bw * (d + 0.5), str(d + 1)) for d in range(0, days, max(1, days // 10))]
    parts = _axis(ymax, "GPU-hours", xl)
    scale = (H - MT - MB) / ymax
    names = list(per_team)
    for d in range(days):
        y = float(H - MB)
        for i, name in enumerate(names):
            v = per_team[name][d]
            if v <= 0:
                continue
            h = v * scale
            y -= h
            parts.append(
                f'<rect x="{ML + bw * d + 1:.1f}" y="{y:.1f}" width="{max(0.5, bw - 2):.1f}" '
                f'height="{h:.1f}" fill="{PALETTE[i % len(PALETTE)]}">'
                f"<title>{escape(name)} day {d + 1}: {v:.2f} GPU-h</title></rect>"
            )
    parts += _legend(names)
    return _svg(title, parts)


def histogram(title: str, bins: list[float]) -> str:
    """GPU-hours by utilisation of the share (10 bins of 10 %)."""
    ymax = max(bins, default=0.0) or 1.0
    plot_w = W - ML - MR
    bw = plot_w / len(bins)
    xl = [(ML + bw * (i + 0.5), f"{10 * i}-{10 * (i + 1)}%") for i in range(len(bins))]
    parts = _axis(ymax, "GPU-hours", xl)
    scale = (H - MT - MB) / ymax
    for i, v in enumerate(bins):
        h = v * scale
        parts.append(
            f'<rect x="{ML + bw * i + 2:.1f}" y="{H - MB - h:.1f}" width="{bw - 4:.1f}" '
            f'height="{h:.1f}" fill="{PALETTE[0] if i >= 3 else PALETTE[2]}">'
            f"<title>{10 * i}-{10 * (i + 1)} %: {v:.2f} GPU-h</title></rect>"
        )
    return _svg(title, parts)


def lines(title: str, series: dict[str, list[float | None]], days: int, ylabel: str) -> str:
    """One line per series over the days of the month (gaps where a day has no value)."""
    values = [v for s in series.values() for v in s if v is not None]
    ymax = max(values, default=0.0) or 1.0
    plot_w = W - ML - MR
    step = plot_w / max(1, days)
    xl = [(ML + step * (d + 0.5), str(d + 1)) for d in range(0, days, max(1, days // 10))]
    parts = _axis(ymax, ylabel, xl)
    scale = (H - MT - MB) / ymax
    for i, (_name, s) in enumerate(series.items()):
        points = " ".join(
            f"{ML + step * (d + 0.5):.1f},{H - MB - v * scale:.1f}"
            for d, v in enumerate(s)
            if v is not None
        )
        if points:
            parts.append(
                f'<polyline fill="none" stroke="{PALETTE[i % len(PALETTE)]}" '
                f'stroke-width="2" points="{points}"/>'
            )
    parts += _legend(list(series))
    return _svg(title, parts)
