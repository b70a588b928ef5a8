"""jupyter-gpushare: share scarce GPUs from JupyterHub and JupyterLab."""

from __future__ import annotations

from typing import Any

from ._version import __version__

__all__ = ["__version__"]


def _jupyter_server_extension_points() -> list[dict[str, Any]]:
    """Let ``jupyter_gpushare`` itself be enabled as a server extension (imports lazily, so
    importing the pure core never loads jupyter_server)."""
    from .serverextension import _jupyter_server_extension_points as points

    return points()
