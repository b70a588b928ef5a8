"""Inline SVG plots of the report page, drawn on the server (no script, no library).

Each plot has round axis ticks (quarters of 1, 2, 4 or 8 x 10^n: ``0 / 500 / 1,000``, never
``3.53e+03``), its unit on the axis, a legend in words, and a ``<title>`` per mark for the
exact figure.
"""

from __future__ import annotations

import math
from html import escape

from . import reading
from .plots import PALETTE

W, H = 800, 250
ML, MR, MT, MB = 64, 215, 14, 34
PLOT_W, PLOT_H = W - ML - MR, H - MT - MB
GUARANTEE = "#222"


def nice_max(value: float) -> float:
    """The smallest 1, 2, 4 or 8 x 10^n at least ``value`` (1 for nothing): four ticks of
    a quarter each are round numbers (0.25, 0.5, 1, 2 x 10^n)."""
    if value <= 0:
        return 1.0
    exp = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 4, 8, 10):  # a quarter of each is a round tick
        if step * exp >= value - 1e-12:
            return float(step * exp)
    return float(10 * exp)


def _y(value: float, ymax: float) -> float:
    return MT + PLOT_H - PLOT_H * value / ymax


def _axis(ymax: float, unit: str, xlabels: list[tuple[float, str]]) -> list[str]:
    mid = MT + PLOT_H / 2
    parts = [
        f'<line x1="{ML}" y1="{MT + PLOT_H}" x2="{ML + PLOT_W}" y2="{MT + PLOT_H}" stroke="#333"/>',
        f'<text x="14" y="{mid:.0f}" font-size="11" transform="rotate(-90 14 {mid:.0f})" '
        f'text-anchor="middle">{escape(unit)}</text>',
    ]
    for i in range(5):
        v = ymax * i / 4
        y = _y(v, ymax)
        parts.append(
            f'<line x1="{ML}" y1="{y:.1f}" x2="{ML + PLOT_W}" y2="{y:.1f}" stroke="#e4e4e4"/>'
        )
        parts.append(
            f'<text x="{ML - 5}" y="{y + 4:.1f}" font-size="10" text-anchor="end">'
            f"{escape(reading.amount(v))}</text>"
        )
    for x, label in xlabels:
        parts.append(
            f'<text x="{x:.1f}" y="{MT + PLOT_H + 14}" font-size="10" '
            f'text-anchor="middle">{escape(label)}</text>'
        )
    return parts


def _legend(items: list[tuple[str, str, str]]) -> list[str]:
    """``(colour, label, shape)`` with shape ``box`` or ``line``."""
    out = []
    shown = items[:14]
    for i, (colour, label, shape) in enumerate(shown):
        y = MT + 15 * i
        x = ML + PLOT_W + 12
        mark = (
            f'<line x1="{x}" y1="{y + 5}" x2="{x + 12}" y2="{y + 5}" stroke="{colour}" '
            'stroke-width="2" stroke-dasharray="4 2"/>'
            if shape == "line"
            else f'<rect x="{x}" y="{y}" width="11" height="11" fill="{colour}"/>'
        )
        out.append(f'{mark}<text x="{x + 17}" y="{y + 10}" font-size="11">{escape(label)}</text>')
    if len(items) > len(shown):
        out.append(
            f'<text x="{ML + PLOT_W + 12}" y="{MT + 15 * len(shown) + 10}" '
            f'font-size="11">+{len(items) - len(shown)} more teams</text>'
        )
    return out


def svg(plot_id: str, title: str, parts: list[str]) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" id="{escape(plot_id)}" role="img" '
        f'viewBox="0 0 {W} {H}" width="{W}" height="{H}"><title>{escape(title)}</title>'
        + "".join(parts)
        + "</svg>"
    )


def _day_labels(days: int) -> list[tuple[float, str]]:
    bw = PLOT_W / max(1, days)
    step = max(1, math.ceil(days / 10))
    return [(ML + bw * (d + 0.5), str(d + 1)) for d in range(0, days, step)]


def team_days(per_team: dict[str, list[float]], guarantee_per_day: float, days: int) -> str:
    """GPU-hours per team per day, stacked, against the guarantee (GPU-hours a day the
    teams shown are guaranteed) as a dashed line."""
    totals = [sum(v[d] for v in per_team.values()) for d in range(days)]
    ymax = nice_max(max([*totals, guarantee_per_day], default=0.0))
    bw = PLOT_W / max(1, days)
    parts = _axis(ymax, "GPU-hours per day", _day_labels(days))
    names = list(per_team)
    for d in range(days):
        base = 0.0
        for i, name in enumerate(names):
            v = per_team[name][d]
            if v <= 0:
                continue
            top, bottom = _y(base + v, ymax), _y(base, ymax)
            base += v
            parts.append(
                f'<rect class="bar" data-team="{escape(name)}" data-day="{d + 1}" '
                f'data-gpu-hours="{v}" x="{ML + bw * d + 1:.1f}" y="{top:.1f}" '
                f'width="{max(0.6, bw - 2):.1f}" height="{max(0.0, bottom - top):.1f}" '
                f'fill="{PALETTE[i % len(PALETTE)]}"><title>{escape(name)}, day {d + 1}: '
                f"{escape(reading.gpu_hours(v))}</title></rect>"
            )
    if guarantee_per_day > 0:
        y = _y(guarantee_per_day, ymax)
        parts.append(
            f'<line class="guarantee" x1="{ML}" y1="{y:.1f}" x2="{ML + PLOT_W}" '
            f'y2="{y:.1f}" stroke="{GUARANTEE}" stroke-width="2" '
            f'stroke-dasharray="6 3"><title>guaranteed: '
            f"{escape(reading.gpu_hours(guarantee_per_day))} a day</title></line>"
        )
    legend = [(PALETTE[i % len(PALETTE)], n, "box") for i, n in enumerate(names)]
    legend.append((GUARANTEE, "guarantee a day", "line"))
    return svg(
        "plot-team-days", "GPU-hours per team per day against guarantee", parts + _legend(legend)
    )


def utilisation(bins: list[float]) -> str:
    """Measured GPU-hours by how much of its share a grant computed (10 % bins)."""
    ymax = nice_max(max(bins, default=0.0))
    bw = PLOT_W / max(1, len(bins))
    labels = [(ML + bw * (i + 0.5), f"{10 * i}-{10 * (i + 1)} %") for i in range(len(bins))]
    parts = _axis(ymax, "GPU-hours", labels)
    for i, v in enumerate(bins):
        top = _y(v, ymax)
        colour = PALETTE[2] if i < 3 else PALETTE[0]
        parts.append(
            f'<rect class="bin" data-bin="{i}" data-gpu-hours="{v}" '
            f'x="{ML + bw * i + 3:.1f}" y="{top:.1f}" width="{bw - 6:.1f}" '
            f'height="{MT + PLOT_H - top:.1f}" fill="{colour}"><title>{10 * i}-'
            f"{10 * (i + 1)} % of the share used: {escape(reading.gpu_hours(v))}"
            "</title></rect>"
        )
    legend = [
        (PALETTE[2], "below 30 %: idle or data-bound", "box"),
        (PALETTE[0], "30 % and more", "box"),
    ]
    return svg("plot-utilisation", "Utilisation distribution", parts + _legend(legend))


def queue_wait(median: list[float | None], p95: list[float | None], days: int) -> str:
    """Median and p95 queue wait of each day's requests, in minutes: a dot per day with a
    value (so one day of data shows), joined by a line where days follow each other."""
    values = [v for v in (*median, *p95) if v is not None]
    ymax = nice_max(max(values, default=0.0) / 60)
    bw = PLOT_W / max(1, days)
    parts = _axis(ymax, "minutes of queue wait", _day_labels(days))
    for i, (name, series) in enumerate((("median", median), ("p95", p95))):
        colour = PALETTE[i]
        points = [
            (ML + bw * (d + 0.5), _y(v / 60, ymax), d, v)
            for d, v in enumerate(series)
            if v is not None
        ]
        if len(points) > 1:
            line = " ".join(f"{x:.1f},{y:.1f}" for x, y, _, _ in points)
            parts.append(
                f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="{line}"/>'
            )
        for x, y, d, v in points:
            parts.append(
                f'<circle class="wait" data-series="{name}" data-day="{d + 1}" '
                f'data-seconds="{v}" cx="{x:.1f}" cy="{y:.1f}" r="3.5" '
                f'fill="{colour}"><title>{name}, day {d + 1}: '
                f"{escape(reading.duration(v))}</title></circle>"
            )
    legend = [(PALETTE[0], "median wait", "box"), (PALETTE[1], "95th percentile", "box")]
    return svg("plot-queue-wait", "Queue wait per day", parts + _legend(legend))


def borrow_lend(rows: list[tuple[str, float, float]]) -> str:
    """Per team: GPU-hours borrowed above its guarantee and lent from its unused guarantee."""
    ymax = nice_max(max([max(b, v) for _, b, v in rows], default=0.0))
    gw = PLOT_W / max(1, len(rows))
    step = max(1, math.ceil(len(rows) / 12))
    labels = [(ML + gw * (i + 0.5), t) for i, (t, _, _) in enumerate(rows) if i % step == 0]
    parts = _axis(ymax, "GPU-hours", labels)
    for i, (team, borrowed, lent) in enumerate(rows):
        for j, (what, v) in enumerate((("borrowed", borrowed), ("lent", lent))):
            top = _y(v, ymax)
            bar_w = max(0.6, gw / 2 - 3)
            parts.append(
                f'<rect class="{what}" data-team="{escape(team)}" data-gpu-hours="{v}" '
                f'x="{ML + gw * i + 2 + j * (gw / 2 - 1):.1f}" y="{top:.1f}" '
                f'width="{bar_w:.1f}" height="{MT + PLOT_H - top:.1f}" '
                f'fill="{PALETTE[3] if j else PALETTE[1]}"><title>{escape(team)} '
                f"{what}: {escape(reading.gpu_hours(v))}</title></rect>"
            )
    legend = [
        (PALETTE[1], "borrowed (above guarantee)", "box"),
        (PALETTE[3], "lent (unused guarantee)", "box"),
    ]
    return svg("plot-borrow-lend", "Borrowing and lending per team", parts + _legend(legend))


__all__ = ["borrow_lend", "nice_max", "queue_wait", "team_days", "utilisation"]
