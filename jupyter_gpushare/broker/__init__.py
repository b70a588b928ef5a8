"""The gpushare broker: the JupyterHub service that owns all grants, quotas and GPU-hours.

Its rooms: ``api/`` (what speaks HTTP), ``service/`` (the request and grant lifecycle),
``store/`` (tables, migrations, commits), ``jobs/`` (batch jobs), ``ops/`` (running it);
``app.py`` composes them and ``client.py`` is what the spawner and backends use to call it
(see docs/architecture.md). Importing this package imports none of them.
"""

from __future__ import annotations

from typing import Any

from ._moved import install

install()  # the modules' old paths keep importing, with a warning

__all__ = ["BrokerApp", "main"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import app

        return getattr(app, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
