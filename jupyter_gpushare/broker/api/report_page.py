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
import contextlib
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
FRESH_S = 60.0
"""A month in progress's document is shown for this long, then made again."""
PAGE_WAIT_S = 0.5
"""How long the page waits for a document being made before it shows that it is being made
(and reloads itself until it is ready), so it paints at once even for a large month."""
PROGRESS_RELOAD_MS = 1000


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
        self,
        ctx: Context,
        kept: OrderedDict[tuple[int, int, str], dict[str, Any]],
        making: dict[tuple[int, int, str], asyncio.Task[dict[str, Any]]] | None = None,
    ) -> None:
        super().initialize(ctx)
        self.kept = kept  # this broker's documents of ended months
        self.making = making if making is not None else {}  # documents being made

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
        task = self._making(year, month, now)
        if fmt is None and not task.done():  # the page paints at once, whatever the month
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(task), PAGE_WAIT_S)
            if not task.done():
                self._progress(year, month, now, team)
                return
        doc = await task
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

    def _making(self, year: int, month: int, now: float) -> asyncio.Task[dict[str, Any]]:
        """The document of the month: kept (an ended month), being made (one task per
        month and policy version, shared by every load that wants it), or made now."""
        broker = self.ctx.broker
        version = getattr(broker, "policy_version", "") or ""
        key = (year, month, version)
        loop = asyncio.get_running_loop()
        if key in self.kept:  # an ended month's, made before
            self.kept.move_to_end(key)
            done: asyncio.Future[dict[str, Any]] = loop.create_future()
            done.set_result(self.kept[key])
            return done  # type: ignore[return-value]
        task = self.making.get(key)
        if task is not None and not (task.done() and self._stale(task, now)):
            return task
        task = asyncio.ensure_future(self._make(key, now))
        task.made_at = now  # type: ignore[attr-defined]
        self.making[key] = task
        return task

    @staticmethod
    def _stale(task: asyncio.Task[dict[str, Any]], now: float) -> bool:
        """A month in progress is made again after ``FRESH_S`` (or if making it failed)."""
        failed = task.cancelled() or task.exception() is not None
        return failed or now - getattr(task, "made_at", 0.0) > FRESH_S

    async def _make(self, key: tuple[int, int, str], now: float) -> dict[str, Any]:
        broker = self.ctx.broker
        year, month, version = key
        loop = asyncio.get_running_loop()
        started = time.monotonic()
        try:
            doc = await loop.run_in_executor(None, month_document, broker.engine,
                                             broker.policy, version, year, month, now)
        except BaseException:
            app_log.exception("gpushare: report %04d-%02d failed", year, month)
            raise
        app_log.info("gpushare: report %04d-%02d made in %.1f s", year, month,
                     time.monotonic() - started)
        if month_bounds(year, month)[1] <= now:  # ended: its rows no longer change
            self.kept[key] = doc
            self.making.pop(key, None)
            while len(self.kept) > KEPT_MONTHS:
                self.kept.popitem(last=False)
        return doc

    def _progress(self, year: int, month: int, now: float, team: str | None) -> None:
        """The page while its document is made: painted at once, reloaded until ready."""
        partial = month_bounds(year, month)[1] > now
        title = f"GPU report {year:04d}-{month:02d}" + (f", team {team}" if team else "")
        title += " (partial: month in progress)" if partial else ""
        self.page(title, f"""<p id="report-making" class="period"
data-partial="{"yes" if partial else "no"}">Making the report of {year:04d}-{month:02d}:
reading the month's grants, requests and heartbeats{"" if partial else
" and replaying its advice"}. This page shows it as soon as it is ready.</p>
<script>setTimeout(() => location.reload(), {PROGRESS_RELOAD_MS});</script>""")

__all__ = ["ReportPage", "month_document", "parse_month_arg"]
