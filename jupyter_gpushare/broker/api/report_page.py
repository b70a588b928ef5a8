"""The monthly report as a page of the broker: ``<prefix>admin/report``.

For gpushare admins (every team), and for a team's admins with ``?team=<name>`` (that team
only: :func:`jupyter_gpushare.report.page.for_team`). ``?month=YYYY-MM`` (default: the
previous month, UTC). Without ``format`` it is the page (:mod:`jupyter_gpushare.report.page`:
the recommendation on top, plots, figures rounded for reading, links to every download);
``&format=html|md|csv|json`` downloads the report as a file. The report is the one
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
from urllib.parse import urlencode

from sqlalchemy import Engine
from tornado.log import app_log

from ...core.ledger import month_bounds
from ...core.model import Policy
from ...disposition import attachment
from ...report import make_report
from ...report import page as report_page
from ...report.command import add_replay_checks, previous_month
from ...report.render import FORMATS, render
from ...report.source import load_month
from ..errors import BrokerError
from ..service.fields import BadField
from .handler_base import Context
from .pages import PageHandler, logged_in_page
from .team_page import require_team

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
    """``<prefix>admin/report``: the monthly report (admins; a team's admins with
    ``?team=``)."""

    def initialize(  # type: ignore[override]
        self, ctx: Context, kept: OrderedDict[tuple[int, int, str], dict[str, Any]]
    ) -> None:
        super().initialize(ctx)
        self.kept = kept  # this broker's documents of ended months

    @logged_in_page
    async def get(self) -> None:
        broker = self.ctx.broker
        team = self.get_query_argument("team", None)
        if team is not None:
            require_team(broker.policy, self.identity, team)
        elif not self.identity.admin:
            raise BrokerError(403, f"{self.identity.name} is not a gpushare admin (a team's "
                              "admins open their team's report with ?team=<name>)")
        now = broker.clock()
        year, month = parse_month_arg(self.get_query_argument("month", None), now)
        fmt = self.get_query_argument("format", None)
        if fmt is not None and fmt not in FORMATS:
            raise BadField("format", f"format must be one of {', '.join(FORMATS)}")
        doc = await self._document(year, month, now)
        if team is not None:
            doc = report_page.for_team(doc, team)
        if fmt is None:
            self.page(report_page.title(doc), report_page.body(doc, self._links(doc)))
            return
        self.set_header("Content-Type", CONTENT_TYPES.get(fmt, "text/plain; charset=utf-8"))
        stem = f"gpushare-report-{year:04d}-{month:02d}" + (f"-{team}" if team else "")
        self.set_header("Content-Disposition", attachment(f"{stem}.{fmt}"))
        text = report_page.standalone(doc) if team and fmt == "html" else render(doc, fmt)
        self.finish(text)

    def _links(self, doc: dict[str, Any]) -> dict[str, str]:
        """The page's downloads: the same month (and team) in every format."""
        query = {"month": doc["month"]}
        if doc.get("team"):
            query["team"] = doc["team"]
        base = self.prefix + "admin/report?"
        return {fmt: base + urlencode({**query, "format": fmt}) for fmt in FORMATS}

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
