"""Figures written for people to read on a page: rounded, with their unit named.

The report's document keeps four decimals (:func:`.document.num`) for the files and for
recomputing; a page shows ``2,822 GPU-h``, ``5.3 %``, ``5 min`` instead of ``2821.7553``,
``0.0526`` and ``303.3313``. Each function takes ``None`` (no figure) to ``"–"``.
"""

from __future__ import annotations

NONE = "–"


def _trim(text: str) -> str:
    return text.rstrip("0").rstrip(".") if "." in text else text


def amount(value: float | None) -> str:
    """A quantity without unit: 2 significant decimals below 10, 1 below 100, then whole
    numbers with thousands separators; a positive value too small to show is ``< 0.01``."""
    if value is None:
        return NONE
    v = float(value)
    if v == 0:
        return "0"
    if 0 < abs(v) < 0.005:
        return "< 0.01" if v > 0 else "> -0.01"
    if abs(v) < 10:
        return _trim(f"{v:.2f}")
    if abs(v) < 100:
        return _trim(f"{v:.1f}")
    return f"{v:,.0f}"


def gpu_hours(value: float | None) -> str:
    """``2,822 GPU-h``, ``0.41 GPU-h``."""
    return NONE if value is None else f"{amount(value)} GPU-h"


def units(value: float | None) -> str:
    """GPU units (a share of a GPU counts its fraction): ``1.5 GPUs``, ``1 GPU``."""
    if value is None:
        return NONE
    text = amount(value)
    return f"{text} GPU" if text == "1" else f"{text} GPUs"


def percent(share: float | None) -> str:
    """A share (0.0526) as a percentage: ``5.3 %``; whole numbers from 10 %."""
    if share is None:
        return NONE
    p = 100 * float(share)
    if p == 0:
        return "0 %"
    if 0 < p < 0.1:
        return "< 0.1 %"
    return f"{p:.0f} %" if abs(p) >= 10 else f"{_trim(f'{p:.1f}')} %"


def duration(seconds: float | None) -> str:
    """A wait: ``40 s``, ``5 min``, ``1.5 h``, ``2.1 days``."""
    if seconds is None:
        return NONE
    s = float(seconds)
    if s < 60:
        return f"{s:.0f} s"
    if s < 3600:
        return f"{s / 60:.0f} min"
    if s < 86400:
        return f"{_trim(f'{s / 3600:.1f}')} h"
    return f"{_trim(f'{s / 86400:.1f}')} days"


def watts(value: float | None) -> str:
    return NONE if value is None else f"{amount(value)} W"


def counts(by_reason: dict[str, int] | None) -> str:
    """``quota: 3, no-capacity: 1`` (most first); ``0`` when empty."""
    if not by_reason:
        return "0"
    return ", ".join(f"{k}: {v}" for k, v in sorted(by_reason.items(), key=lambda kv: -kv[1]))


__all__ = ["NONE", "amount", "counts", "duration", "gpu_hours", "percent", "units", "watts"]
