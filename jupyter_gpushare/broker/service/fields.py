"""Readers of request fields: every invalid value is a 400 that names the field.

A value that is too long is never echoed back whole (:func:`shorten`), a number beyond
:attr:`~.limits.BrokerLimits.max_integer` is refused before any float conversion can
overflow, and a body nested too deep for the JSON parser is a 400, not a crash.
"""

from __future__ import annotations

import json
import math
from datetime import datetime
from typing import Any

from ...core.model import UNIT, GPUAsk
from ..errors import BrokerError
from .limits import BrokerLimits

ECHO = 64  # characters of a client's value quoted back in an error message


class BadField(BrokerError):
    """A 400 about one field of the request."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(400, message, field)


def shorten(value: Any, limit: int = ECHO) -> str:
    """``repr(value)`` cut to about ``limit`` characters (for error messages and logs)."""
    if isinstance(value, str) and len(value) > limit:
        return repr(value[:limit]) + f"… ({len(value)} characters)"
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "…"


def json_object(raw: bytes) -> dict[str, Any]:
    """The JSON object ``raw`` holds; a :class:`BadField` naming ``body`` when it is none."""
    try:
        body = json.loads(raw)
    except RecursionError as exc:
        raise BadField("body", "the body is nested too deeply") from exc
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadField("body", "the body must be a JSON object") from exc
    if not isinstance(body, dict):
        raise BadField("body", "the body must be a JSON object")
    return body


class Fields:
    """Field readers bound to the broker's limits."""

    def __init__(self, limits: BrokerLimits | None = None) -> None:
        self.limits = limits or BrokerLimits()

    def body(self, raw: bytes | None) -> dict[str, Any]:
        """The JSON object of a request body."""
        raw = raw or b"{}"
        if len(raw) > self.limits.max_body_bytes:
            raise BrokerError(
                413, f"the body is larger than {self.limits.max_body_bytes} bytes", "body"
            )
        return json_object(raw)

    def text(
        self,
        body: dict[str, Any],
        key: str,
        default: str | None = None,
        *,
        required: bool = False,
        max_len: int | None = None,
        name: str | None = None,
    ) -> str | None:
        field = name or key
        limit = self.limits.max_name_length if max_len is None else max_len
        value = body.get(key, default)
        if value is None:
            if required:
                raise BadField(field, f"{field} is required")
            return None
        if not isinstance(value, str) or len(value) > limit:
            raise BadField(field, f"{field} must be a string of at most {limit} characters")
        return value

    def number(
        self,
        body: dict[str, Any],
        key: str,
        *,
        minimum: float = 0,
        maximum: float | None = None,
        integer: bool = False,
        default: Any = None,
        name: str | None = None,
    ) -> Any:
        field = name or key
        value = body.get(key, default)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise BadField(field, f"{field} must be a number")
        if isinstance(value, int) and abs(value) > self.limits.max_integer:
            raise BadField(field, f"{field} is out of range")
        if not math.isfinite(value):
            raise BadField(field, f"{field} must be a finite number")
        if integer and not float(value).is_integer():
            raise BadField(field, f"{field} must be an integer")
        if value < minimum or (maximum is not None and value > maximum):
            raise BadField(
                field,
                f"{field} must be between {minimum} and {maximum if maximum is not None else '∞'}",
            )
        return int(value) if integer else float(value)

    def flag(self, body: dict[str, Any], key: str, default: bool = False) -> bool:
        value = body.get(key, default)
        if not isinstance(value, bool):
            raise BadField(key, f"{key} must be true or false")
        return value

    def timestamp(self, body: dict[str, Any], key: str) -> float | None:
        """Seconds since the epoch, given as a number or an ISO 8601 string with a zone."""
        value = body.get(key)
        if isinstance(value, str):
            if len(value) > 64:
                raise BadField(key, f"{key} must be a number (epoch seconds) or an ISO 8601 time")
            try:
                parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
            except ValueError as exc:
                raise BadField(
                    key, f"{key} must be a number (epoch seconds) or an ISO 8601 time"
                ) from exc
            if parsed.tzinfo is None:
                raise BadField(key, f"{key} needs a time zone (e.g. 2026-01-01T10:00:00Z)")
            return parsed.timestamp()
        return self.number(body, key, maximum=1e11)

    def gpu_ask(self, value: Any) -> GPUAsk:
        """The ``gpu`` object of an explicit request; it must ask for some GPU."""
        if value is None:
            raise BadField("gpu", "gpu is required: {count} or {fraction, memory_mib, compute_pct}")
        if not isinstance(value, dict):
            raise BadField(
                "gpu", "gpu must be an object {count} or {fraction, memory_mib, compute_pct}"
            )
        count = self.number(value, "count", integer=True, maximum=1024, name="gpu.count")
        fraction = self.number(value, "fraction", maximum=1, name="gpu.fraction")
        memory = self.number(
            value, "memory_mib", integer=True, maximum=10**8, name="gpu.memory_mib"
        )
        compute = self.number(value, "compute_pct", maximum=100, name="gpu.compute_pct")
        if count and fraction:
            raise BadField("gpu", "give gpu.count (whole GPUs) or gpu.fraction, not both")
        if count:
            return GPUAsk(whole=count)
        if fraction:
            milli = round(fraction * UNIT)
            if milli < 1:
                raise BadField("gpu.fraction", "gpu.fraction is too small")
            return GPUAsk(
                fraction_milli=milli,
                memory_mib=memory if memory else None,
                compute_milli=round(compute * 10) if compute is not None else None,
            )
        if memory or compute:
            raise BadField("gpu", "gpu.memory_mib and gpu.compute_pct need gpu.fraction")
        which = (
            "gpu.count" if "count" in value else "gpu.fraction" if "fraction" in value else "gpu"
        )
        raise BadField(
            which,
            "a request must ask for some GPU: gpu.count ≥ 1 or gpu.fraction > 0 "
            "(a server without GPU needs no request)",
        )
