"""Bounds on everything a client can make the broker store or compute (configurable).

``c.BrokerLimits.<name> = value`` in the broker's config file (or
``--BrokerLimits.<name>=value`` on its command line) changes a limit; the defaults suit a
hub of a few hundred users.
"""

from __future__ import annotations

from traitlets import Float, Integer
from traitlets.config import Configurable


class BrokerLimits(Configurable):
    """Limits of the broker's REST API and of the state clients can make it keep."""

    max_body_bytes = Integer(
        256 * 1024, config=True, help="Largest request body accepted (bytes); larger: 413."
    )
    max_name_length = Integer(
        255,
        config=True,
        help="Longest name accepted (user, server, team, pool, profile, idempotency key, ...); "
        "a longer one is refused with 400 and is never echoed whole.",
    )
    max_integer = Integer(
        2**53,
        config=True,
        help="Largest magnitude of any number in a request body (larger: 400 naming the field).",
    )
    max_queued_per_user = Integer(
        50, config=True, help="Queued (waiting) requests one user may have at once (0: no limit)."
    )
    max_queued_per_team = Integer(
        500, config=True, help="Queued (waiting) requests one team may have at once (0: no limit)."
    )
    heartbeat_min_interval_s = Float(
        5.0,
        config=True,
        help="Fewest seconds between two heartbeats of one grant; a faster one is answered "
        "429 with Retry-After and not stored.",
    )
    heartbeat_max_skew_s = Float(
        300.0,
        config=True,
        help="How far a heartbeat's ts may lie in the future, or before its grant, in seconds.",
    )
    heartbeat_retention_s = Float(
        7 * 86400.0,
        config=True,
        help="How long heartbeat detail rows are kept (seconds); the per-team monthly "
        "aggregates of measured use are kept for good.",
    )
    heartbeat_prune_every = Integer(
        500,
        config=True,
        help="Delete heartbeat detail older than heartbeat_retention_s after this many heartbeats.",
    )
    max_notice_subscribers = Integer(
        1000, config=True, help="Open notice streams (SSE) at once; more: 503."
    )
