"""Which committer a broker uses (``BrokerApp.commit_mode``) for its database."""

from __future__ import annotations

import logging

from sqlalchemy import Engine

log = logging.getLogger("gpushare.broker")


def commit_mode_for(asked: str, engine: Engine, raw_sql: bool) -> str:
    """``asked`` (``BrokerApp.commit_mode``) for this database: inline, thread, async or
    loop. ``auto``: async on PostgreSQL, loop elsewhere; a committer needs the raw writer
    (``raw_sql``), else inline; async on anything but PostgreSQL is an error."""
    dialect = engine.dialect.name
    mode = asked
    if mode == "auto":
        mode = "async" if dialect == "postgresql" else "loop"
    if mode == "async" and dialect != "postgresql":
        raise ValueError(
            f"BrokerApp.commit_mode = 'async' needs PostgreSQL; db_url is {dialect} "
            "(use 'loop', 'thread' or 'inline')"
        )
    if mode != "inline" and not raw_sql:
        log.warning("commit_mode %s needs raw_sql: committing inline", mode)
        return "inline"
    return mode
