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
    max_notice_streams_per_user = Integer(
        8,
        config=True,
        help="Open notice streams (SSE) one user (or service) may hold at once; the next one "
        "is answered 429 naming this limit, so one client cannot take every slot of "
        "max_notice_subscribers (0: no limit per user).",
    )
    requests_per_minute_per_user = Float(
        60.0,
        config=True,
        help="Sustained rate of POST /requests per user (a token bucket refilled at this "
        "many per minute); beyond it and the burst, 429 with Retry-After naming this limit. "
        "A retry with an idempotency key already answered costs nothing; the hub's spawner "
        "and admins (act-as tokens) are not counted (0: no limit).",
    )
    request_burst_per_user = Integer(
        20,
        config=True,
        help="POST /requests one user may send at once before requests_per_minute_per_user "
        "applies (the token bucket's size).",
    )
    request_retention_days = Float(
        400.0,
        config=True,
        help="Days a finished request row without a grant (refused, cancelled, CPU-only) is "
        "kept; older ones are deleted (the monthly report counts refusals from these rows, "
        "so keep more than the months you report on). Rows with a grant are the ledger's "
        "and are kept; queued and preempting ones are never deleted (0: forever).",
    )
    max_request_rows_per_user = Integer(
        20000,
        config=True,
        help="Finished request rows without a grant kept per user; the oldest beyond it are "
        "deleted (0: no limit).",
    )
    request_prune_interval_s = Float(
        300.0,
        config=True,
        help="Seconds between two passes of the request-row retention (broker/ops/retention.py).",
    )
    request_prune_batch = Integer(
        500,
        config=True,
        help="Most request rows one retention pass deletes (passes repeat until done, each "
        "short enough not to stall the broker).",
    )
