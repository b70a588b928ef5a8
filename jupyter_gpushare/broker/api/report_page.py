"""The monthly report as a page of the broker, for admins: ``<prefix>admin/report``.

``?month=YYYY-MM`` (default: the previous month, UTC) and ``&format=html|md|csv|json``
(default html; the others download as a file). The report is the one
``jupyter-gpushare report`` writes, read from the broker's own database with the policy in
force: a month in progress is reported up to now and labelled partial; for a month that has
ended, each "buy" or "move" carries what a replay of the recorded month says of it
(:mod:`jupyter_gpushare.whatif.advice`). The database is read and the replay run in a worker
thread, never on the event loop; the document of an ended month is kept (a few months, per
policy version), since its rows no longer change.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from typing import Any

from sqlalchemy import Engine
from tornado.log import app_log

from ...core.ledger import month_bounds
from ...core.model import Policy
from ...disposition import attachment
from ...report import make_report
from ...report.command import add_replay_checks, previous_month
from ...report.render import FORMATS, render
from ...report.source import load_month
from ..service.fields import BadField
from .handler_base import Context
from .pages import PageHandler, admin_page

CONTENT_TYPES = {
    "html": "text/html; charset=utf-8",
    "md": "text/markdown; charset=utf-8",
    "csv": "text/csv; charset=utf-8",
    "json": "application/json",
}
KEPT_MONTHS = 12
"""Documents of ended months kept in memory (per month and policy version)."""


def month_document(engine: Engine, policy: Policy, version: str, year: int, month: int,
                   now: float) -> dict[str, Any]:
    """The report's document of one month (blocking: database reads and, for an ended
    month, the replay of its advice)."""
    rows = load_month(engine, policy, year, month, policy_version=version, now=now)
    _, _, doc = make_report(rows)
    if not doc.get("partial"):
        add_replay_checks(doc, engine, policy, year, month)
    return doc


def parse_month_arg(raw: str | None, now: float) -> tuple[int, int]:
    if raw is None:
        return previous_month(now)
    text = raw.strip()
    if len(text) != 7 or text[4] != "-" or not (text[:4] + text[5:]).isdigit():
        raise BadField("month", "month must be YYYY-MM, e.g. 2026-11")
    year, month = int(text[:4]), int(text[5:])
    if not 2000 <= year <= 9999 or not 1 <= month <= 12:
        raise BadField("month", "month must be YYYY-MM with a year from 2000 and a month 01-12")
    if month_bounds(year, month)[0] > now:
        raise BadField("month", f"{text} has not begun yet")
    return year, month


class ReportPage(PageHandler):
    """``<prefix>admin/report``: the monthly report (admins only)."""

    def initialize(  # type: ignore[override]
        self, ctx: Context, kept: OrderedDict[tuple[int, int, str], dict[str, Any]]
    ) -> None:
        super().initialize(ctx)
        self.kept = kept  # this broker's documents of ended months

    @admin_page
    async def get(self) -> None:
        broker = self.ctx.broker
        now = broker.clock()
        year, month = parse_month_arg(self.get_query_argument("month", None), now)
        fmt = self.get_query_argument("format", "html")
        if fmt not in FORMATS:
            raise BadField("format", f"format must be one of {', '.join(FORMATS)}")
        doc = await self._document(year, month, now)
        self.set_header("Content-Type", CONTENT_TYPES.get(fmt, "text/plain; charset=utf-8"))
        if fmt != "html":
            self.set_header("Content-Disposition",
                            attachment(f"gpushare-report-{year:04d}-{month:02d}.{fmt}"))
        self.finish(render(doc, fmt))

    async def _document(self, year: int, month: int, now: float) -> dict[str, Any]:
        broker = self.ctx.broker
        version = getattr(broker, "policy_version", "") or ""
        ended = month_bounds(year, month)[1] <= now
        key = (year, month, version)
        if ended and key in self.kept:
            self.kept.move_to_end(key)
            return self.kept[key]
        loop = asyncio.get_running_loop()
        started = time.monotonic()
        doc = await loop.run_in_executor(None, month_document, broker.engine, broker.policy,
                                         version, year, month, now)
        app_log.info("gpushare: report %04d-%02d made in %.1f s", year, month,
                      time.monotonic() - started)
        if ended:
            self.kept[key] = doc
            while len(self.kept) > KEPT_MONTHS:
                self.kept.popitem(last=False)
        return doc


__all__ = ["ReportPage", "month_document", "parse_month_arg"]
