"""The spawners' one error shape: a SpawnException that reads as a sentence on the hub's pages."""

from __future__ import annotations

from jupyterhub.spawner import SpawnException


def spawn_error(message: str, *, reason: str, status_code: int) -> SpawnException:
    """A SpawnException whose text on the hub's pages is the sentence itself.

    JupyterHub shows ``str(exc)`` (``409 SpawnException(reason=...): ...``) unless the
    exception carries ``jupyterhub_message``."""
    message = message.strip()
    if message and message[-1] not in ".!?":
        message += "."
    exc = SpawnException(message, reason=reason, status_code=status_code)
    exc.jupyterhub_message = message  # type: ignore[attr-defined]
    return exc
