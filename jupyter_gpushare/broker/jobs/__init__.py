"""Batch jobs in the broker: submission, the job table, the runner that drives a backend,
each attempt's spec and how a run ends."""

from __future__ import annotations

from typing import Any

from .._moved import moved_warning

# the names of the old module ``jupyter_gpushare.broker.jobs`` (now ``.store``)
_OLD_NAMES = {"Job", "JobStore"}


def __getattr__(name: str) -> Any:
    if name in _OLD_NAMES:
        from . import store

        moved_warning(f"{__name__}.{name}", f"{store.__name__}.{name}")
        return getattr(store, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
