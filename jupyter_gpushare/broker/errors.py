"""Errors of the broker's service layer that carry an HTTP status for the handlers."""

from __future__ import annotations


class BrokerError(Exception):
    """An error with an HTTP status for the handlers (and the field it is about, if any)."""

    def __init__(
        self,
        status: int,
        message: str,
        field: str | None = None,
        headers: dict[str, str] | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.field = field
        self.headers = headers or {}
        self.code = code  # a stable, machine-readable reason (e.g. the rules' codes)
