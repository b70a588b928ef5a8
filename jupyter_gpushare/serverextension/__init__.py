"""jupyter_server extension: live GPU telemetry, watchdog, grant and team usage."""

from __future__ import annotations

from typing import Any

from .._version import __version__
from .app import GPUShareServerApp


def _jupyter_server_extension_points() -> list[dict[str, Any]]:
    return [{"module": "jupyter_gpushare.serverextension", "app": GPUShareServerApp}]


__all__ = ["GPUShareServerApp", "__version__", "_jupyter_server_extension_points"]
