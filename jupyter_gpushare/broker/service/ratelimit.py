"""Per-user token buckets: how many requests a user may send, sustained and at once.

A bucket holds at most ``burst`` tokens and gains ``per_minute / 60`` a second; a request
takes one, or is refused with the seconds until one is back (the ``Retry-After`` of the
429). Buckets of users that have been quiet long enough to be full again are dropped, so
the table never holds more than the users active in the last ``burst / rate`` seconds.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class Bucket:
    tokens: float
    at: float


class TokenBuckets:
    """Token buckets by key (a user name), with an injectable clock."""

    def __init__(
        self, per_minute: Callable[[], float], burst: Callable[[], int],
        clock: Callable[[], float],
    ) -> None:
        self.per_minute = per_minute  # read at each call: a config change applies at once
        self.burst = burst
        self.clock = clock
        self.buckets: dict[str, Bucket] = {}
        self._next_sweep = 0.0

    def take(self, key: str) -> float | None:
        """Take a token for ``key``: ``None`` if allowed, else seconds until one is back."""
        rate = self.per_minute() / 60.0
        if rate <= 0:
            return None
        size = max(1, int(self.burst()))
        now = self.clock()
        self._sweep(now, rate, size)
        bucket = self.buckets.get(key)
        if bucket is None:
            bucket = self.buckets[key] = Bucket(float(size), now)
        bucket.tokens = min(float(size), bucket.tokens + max(0.0, now - bucket.at) * rate)
        bucket.at = now
        if bucket.tokens >= 1.0:
            bucket.tokens -= 1.0
            return None
        return (1.0 - bucket.tokens) / rate

    def _sweep(self, now: float, rate: float, size: int) -> None:
        """Drop the buckets that are full again (now as good as absent)."""
        full_after = size / rate
        if now < self._next_sweep:
            return
        self._next_sweep = now + full_after
        for key in [k for k, b in self.buckets.items() if now - b.at >= full_after]:
            del self.buckets[key]


def retry_after(seconds: float) -> str:
    """The ``Retry-After`` header value: whole seconds, at least 1."""
    return str(max(1, math.ceil(seconds)))


_REQUEST_BUCKETS: weakref.WeakKeyDictionary[Any, TokenBuckets] = weakref.WeakKeyDictionary()


def register_request_buckets(broker: Any, buckets: TokenBuckets) -> None:
    """Make ``buckets`` the per-user request buckets of ``broker`` (the handlers' context
    does, at start): ``POST /requests`` and ``POST /jobs`` then share them."""
    _REQUEST_BUCKETS[broker] = buckets


def request_buckets(broker: Any) -> TokenBuckets | None:
    """The per-user request buckets of ``broker`` (``None``: none registered)."""
    return _REQUEST_BUCKETS.get(broker)
