"""Identifiers of requests (``r-…``) and grants (``g-…``)."""

from __future__ import annotations

import secrets


def new_id(prefix: str) -> str:
    """``prefix-`` and 20 random hex digits (as ``uuid4().hex[:20]`` was)."""
    return f"{prefix}-{secrets.token_hex(10)}"
