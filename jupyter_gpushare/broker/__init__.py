"""The gpushare broker: the JupyterHub service that owns all grants, quotas and GPU-hours."""

from .app import BrokerApp, main

__all__ = ["BrokerApp", "main"]
