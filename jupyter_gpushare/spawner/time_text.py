"""Times as the spawner writes them on the progress page and in its state: ISO 8601 stamps
(UTC), a clock time and a short duration, and an ISO stamp read back from the broker. Pure
(no I/O)."""

from __future__ import annotations

import datetime
from typing import Any


def _iso(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts, datetime.timezone.utc).isoformat()


def _parse_iso(text: Any) -> float | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        d = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    if d.tzinfo is None:
        d = d.replace(tzinfo=datetime.timezone.utc)
    return d.timestamp()


def _clock(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts, datetime.timezone.utc).strftime("%H:%M:%S UTC")


def _duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    return f"{seconds // 60} min {seconds % 60:02d} s"
