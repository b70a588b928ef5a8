"""``jupyter-gpushare report``: the monthly report from the broker's database."""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..cli import Command, register
from .render import FORMATS, render

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from ..core.model import Policy

MONTH_RE = re.compile(r"^(\d{4})-(\d{2})$")


def parse_month(text: str) -> tuple[int, int]:
    """``YYYY-MM`` into (year, month); raises ``argparse.ArgumentTypeError``."""
    m = MONTH_RE.match(text or "")
    if not m or not 1 <= int(m.group(2)) <= 12:
        raise argparse.ArgumentTypeError(f"--month: expected YYYY-MM (e.g. 2026-11), got {text!r}")
    return int(m.group(1)), int(m.group(2))


def parse_now(text: str) -> float:
    """``--now``: an ISO 8601 time (UTC unless it says otherwise) into POSIX seconds."""
    from datetime import datetime, timezone

    try:
        moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--now: expected an ISO 8601 time (e.g. 2026-11-15T12:00:00Z), got {text!r}"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.timestamp()


def previous_month(now: float) -> tuple[int, int]:
    t = time.gmtime(now)
    return (t.tm_year, t.tm_mon - 1) if t.tm_mon > 1 else (t.tm_year - 1, 12)


def add_replay_checks(doc: dict[str, Any], engine: Engine, policy: Policy, year: int,
                      month: int) -> None:
    """Put beside each recommendation of ``doc`` what a replay of the month says of it
    (``replay``: supported, text, figures; :func:`..whatif.advice.check_report_advice`)."""
    from ..whatif.advice import check_report_advice

    checks = check_report_advice(engine, policy, year, month, doc["recommendations"])
    for rec, replayed in zip(doc["recommendations"], checks, strict=True):
        rec["replay"] = replayed


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--month", type=parse_month, default=None,
                        help="the month, YYYY-MM (default: the previous month, UTC)")
    parser.add_argument("--format", choices=FORMATS, default="md", help="output format")
    parser.add_argument("--db", default=None,
                        help="the broker's database URL (default $GPUSHARE_DB_URL, "
                        "else sqlite:///gpushare.sqlite)")
    parser.add_argument("--policy", default=None,
                        help="the policy file the broker runs with (default $GPUSHARE_POLICY)")
    parser.add_argument("-o", "--out", default=None, help="write to this file (default: stdout)")
    parser.add_argument("--no-replay-check", dest="replay_check", action="store_false",
                        help="do not replay the month to check the advice (a replay of the "
                        "recorded demand with and without each 'buy' or 'move'; "
                        "docs/whatif.md); it runs only on a month that has ended")
    parser.add_argument("--now", type=parse_now, default=None,
                        help="the report's 'now', ISO 8601 (default: the clock); a month that "
                        "has not ended by then is reported up to it and labelled partial")


def _run(args: argparse.Namespace) -> int:
    from sqlalchemy.exc import SQLAlchemyError

    from ..broker.store.db import make_engine
    from ..core.ledger import month_bounds
    from ..policy import check_policy_file
    from . import make_report
    from .source import load_month

    policy_file = args.policy or os.environ.get("GPUSHARE_POLICY")
    if not policy_file:
        print("report: --policy FILE is needed (guarantees, budgets and capacity come from "
              "the policy)", file=sys.stderr)
        return 2
    check = check_policy_file(policy_file)
    if check.policy is None:
        print(f"report: {policy_file} has errors:", file=sys.stderr)
        for issue in check.errors:
            print(f"  {issue}", file=sys.stderr)
        return 1
    version = hashlib.sha256(Path(policy_file).read_bytes()).hexdigest()[:12]
    now = time.time() if args.now is None else args.now
    year, month = args.month or previous_month(now)
    if month_bounds(year, month)[0] > now:
        print(f"report: --month {year:04d}-{month:02d} has not begun yet", file=sys.stderr)
        return 2
    url = args.db or os.environ.get("GPUSHARE_DB_URL", "sqlite:///gpushare.sqlite")
    if url.startswith("sqlite:///") and not Path(url[len("sqlite:///"):]).exists():
        print(f"report: --db: no database file at {url[len('sqlite:///'):]}", file=sys.stderr)
        return 2
    engine = make_engine(url)
    try:
        rows = load_month(engine, check.policy, year, month, policy_version=version, now=now)
    except SQLAlchemyError as exc:
        print(f"report: cannot read the broker's database {url}: {exc}", file=sys.stderr)
        return 1
    finally:
        engine.dispose()
    _, _, doc = make_report(rows)
    if args.replay_check and not doc.get("partial"):
        from ..whatif.records import RecordsError, read_only_engine

        try:
            reader = read_only_engine(url)
            try:
                add_replay_checks(doc, reader, check.policy, year, month)
            finally:
                reader.dispose()
        except (RecordsError, SQLAlchemyError) as exc:
            print(f"report: the advice was not checked by a replay: {exc}", file=sys.stderr)
    text = render(doc, args.format)
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


register(Command(
    "report",
    "The monthly GPU report (html, csv, md, json) with the buy / redistribute advice",
    _arguments,
    _run,
))
