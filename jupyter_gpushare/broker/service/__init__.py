"""The request and grant lifecycle: the :class:`~.broker.Broker` that owns the in-memory
``ClusterState``, its queue, preemptions, heartbeats, GPU-hour ledger and read-only views."""

from __future__ import annotations

from typing import Any

from .._moved import moved_warning

# the names of the old module ``jupyter_gpushare.broker.service`` (now ``.broker``)
_OLD_NAMES = {"Broker"}


def __getattr__(name: str) -> Any:
    if name in _OLD_NAMES:
        from . import broker

        moved_warning(f"{__name__}.{name}", f"{broker.__name__}.{name}")
        return getattr(broker, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
