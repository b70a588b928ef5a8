"""Broker notices (preemption, idle culling) as the server shows them to its user:
the notices of a broker answer, the time left until their deadline, and their words."""

from __future__ import annotations

import time
from typing import Any

from ..telemetry.broker_link import BrokerAnswer

__all__ = ["notice_text", "notices_of", "with_time_left"]


def notices_of(ans: BrokerAnswer) -> list[dict[str, Any]]:
    if not ans.ok or not isinstance(ans.data, dict):
        return []
    return [n for n in ans.data.get("notices", []) if isinstance(n, dict)]


def notice_text(notice: dict[str, Any]) -> str:
    """A preemption notice in words, with its deadline and the time left."""
    import datetime as dt

    left = notice.get("seconds_left")
    when = ""
    deadline = notice.get("deadline_ts")
    if not isinstance(deadline, (int, float)) and isinstance(left, (int, float)):
        deadline = time.time() + left
    if isinstance(deadline, (int, float)):
        clock = dt.datetime.fromtimestamp(deadline, dt.timezone.utc).strftime("%H:%M:%S UTC")
        when = f" at {clock}"
        if isinstance(left, (int, float)):
            when += f" (in {max(0, round(left))} s)"
    if notice.get("kind") == "idle":  # the broker's GPU idle culler
        why = notice.get("reason") or "no GPU activity"
        return (
            f"IDLE GPU: this server's GPU share has shown no GPU activity ({why}). "
            f"The server will be stopped{when} unless a kernel uses the GPU: save your work."
        )
    why = notice.get("reason") or "the owning team needs its GPU share back"
    return (
        f"PREEMPTION: this server's GPU share is borrowed and is being reclaimed ({why}). "
        f"The server will be stopped{when}: save your work now."
    )


def with_time_left(notice: dict[str, Any]) -> dict[str, Any]:
    """Add ``seconds_left`` until the notice's ISO 8601 deadline."""
    import datetime as dt

    out = dict(notice)
    try:
        d = dt.datetime.fromisoformat(str(notice.get("deadline")).replace("Z", "+00:00"))
        if d.tzinfo is None:
            d = d.replace(tzinfo=dt.timezone.utc)
        out["seconds_left"] = round(d.timestamp() - time.time(), 1)
    except ValueError:
        out["seconds_left"] = None
    return out
