"""GPU-aware idle culling: when a server holding GPU share is warned, and when acted on.

Pure: the culler (``broker/ops/culler.py``) gathers the facts and carries out the verdict.

A grant's *idle clock* starts at the latest of: the grant's start, its last GPU activity
(a heartbeat with utilisation at or above the activity threshold on one of its GPUs), its
server's last kernel or user activity (from the hub), and the end of a batch job the server
ran. Then, with ``window_s`` the pool's idle window and ``warn_s`` the warning period:

* a grant that is not interactive (a batch job holds it), has no window, or whose holder has
  not sent a heartbeat for ``stale_s`` (no evidence it is idle) is left alone (``NONE``), and
  a warning it had is withdrawn (``CLEAR``);
* idle for less than ``window_s``: ``NONE``; a warning it had is withdrawn (``CLEAR``);
* idle for ``window_s`` or more with no warning yet: ``WARN`` (the deadline is
  ``now + warn_s``);
* warned, still idle since before the warning, and ``warn_s`` have passed since it: ``ACT``
  (stop the server or move it to the CPU-only profile, and release the grant). Nothing is
  ever acted on without a warning first.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Verdict(str, Enum):
    NONE = "none"
    WARN = "warn"
    CLEAR = "clear"
    ACT = "act"


@dataclass(frozen=True)
class CullFacts:
    """What the culler knows about one live grant at ``now``."""

    now: float
    interactive: bool
    granted_at: float
    last_gpu_activity: float | None = None
    last_kernel_activity: float | None = None
    last_job_activity: float | None = None
    last_heartbeat: float | None = None
    warned_at: float | None = None


@dataclass(frozen=True)
class CullRule:
    """The pool's settings: ``window_s`` idle before the warning (0: never culled)."""

    window_s: float
    warn_s: float = 600.0
    stale_s: float = 300.0


def idle_since(f: CullFacts) -> float:
    """The start of the idle clock (module docstring)."""
    return max(
        f.granted_at,
        f.last_gpu_activity or 0.0,
        f.last_kernel_activity or 0.0,
        f.last_job_activity or 0.0,
    )


def verdict(f: CullFacts, rule: CullRule) -> Verdict:
    """Warn, act, withdraw a warning, or nothing (module docstring)."""
    warned = f.warned_at is not None
    if (
        not f.interactive
        or rule.window_s <= 0
        or f.last_heartbeat is None
        or f.now - f.last_heartbeat > rule.stale_s
    ):
        return Verdict.CLEAR if warned else Verdict.NONE
    since = idle_since(f)
    if f.now - since < rule.window_s:
        return Verdict.CLEAR if warned else Verdict.NONE
    if f.warned_at is None:
        return Verdict.WARN
    if since > f.warned_at:  # activity after the warning: it starts over
        return Verdict.CLEAR
    if f.now - f.warned_at >= rule.warn_s:
        return Verdict.ACT
    return Verdict.NONE
