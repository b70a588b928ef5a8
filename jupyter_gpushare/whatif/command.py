"""``jupyter-gpushare whatif``: replay a recorded month under a proposed policy or more cards.

Checks everything before it reads anything: the ``--add`` cards, then the proposed (and
current) policy files (errors as ``FILE:LINE: field: what``, exit 2); then reads the
month read-only (:mod:`.records`; a database of another schema version or an empty month
is one sentence, exit 1), replays it twice (:mod:`.study`) and prints the side by side.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ..cli import POLICY_ERRORS, Command, internal_error, print_issues, register
from ..core.model import Policy
from .demand import Demand
from .render import FORMATS, render


def _arguments(parser: argparse.ArgumentParser) -> None:
    from ..report.command import parse_month

    parser.add_argument("--month", type=parse_month, required=True,
                        help="the recorded month to replay, YYYY-MM (UTC)")
    parser.add_argument("--policy", required=True,
                        help="the proposed policy file (YAML): guarantees, borrow limits, "
                        "profiles, priorities, inventory")
    parser.add_argument("--current", default=None,
                        help="the policy in force that month (default $GPUSHARE_POLICY, else "
                        "the proposed one: then only --add differs)")
    parser.add_argument("--db", default=None,
                        help="the broker's database URL (default $GPUSHARE_DB_URL, else "
                        "sqlite:///gpushare.sqlite); opened read-only")
    parser.add_argument("--source", default=None, metavar="alibaba:PATH|plan:PATH",
                        help="replay demand from elsewhere instead of the database: "
                        "alibaba:PATH, an openb_pod_list_*.csv of the Alibaba GPU trace, "
                        "mapped onto the policy's teams; plan:PATH, a month synthesised from "
                        "a `jupyter-gpushare plan` input file (docs/whatif.md)")
    parser.add_argument("--add", action="append", default=[], metavar="POOL:MODEL:COUNT",
                        help="cards added for the proposal (repeatable), e.g. train:H100:8")
    parser.add_argument("--format", choices=FORMATS, default="md", help="output format")
    parser.add_argument("-o", "--out", default=None, help="write to this file (default: stdout)")


def _policy(path: str) -> Policy | int:
    """The checked policy, or the exit status after printing its errors."""
    from ..policy import check_policy_file

    try:
        check = check_policy_file(path)
    except Exception as exc:  # never a traceback for a file, whatever it holds
        return internal_error(path, exc)
    if check.policy is None:
        return print_issues(path, check.errors, len(check.errors))
    return check.policy


def _from_source(source: str, policy: Policy, year: int, month: int
                 ) -> tuple[list[Demand], float, float] | int:
    """Demands of ``--source`` for the month, or the exit status after saying why not."""
    from ..core.ledger import month_bounds
    from .alibaba import TraceError, pods_to_demands, read_pods

    kind, _, path = source.partition(":")
    start, end = month_bounds(year, month)
    if kind == "plan" and path:
        return _from_plan(source, path, policy, start, end)
    if kind != "alibaba" or not path:
        print(f"whatif: --source {source!r}: expected alibaba:PATH or plan:PATH",
              file=sys.stderr)
        return 2
    try:
        demands = pods_to_demands(read_pods(path), policy, start, end - start)
    except (OSError, TraceError, ValueError, KeyError) as exc:
        print(f"whatif: --source {source}: {exc}", file=sys.stderr)
        return 1
    if not demands:
        print(f"whatif: --source {source}: no pod of the trace asks for a GPU: there is "
              "nothing to replay.", file=sys.stderr)
        return 1
    return demands, start, end


def _from_plan(source: str, path: str, policy: Policy, start: float, end: float
               ) -> tuple[list[Demand], float, float] | int:
    """A month synthesised from the planner's input file (:mod:`.plannerinput`)."""
    from ..planner import PlanError, make_plan, read_plan_file
    from .plannerinput import PlanSourceError, plan_month

    try:
        plan = make_plan(read_plan_file(path))
    except PlanError as exc:
        print(f"{path}: {len(exc.errors)} error(s)", file=sys.stderr)
        for issue in exc.errors:
            print(f"  {issue}", file=sys.stderr)
        return 2
    try:
        demands = plan_month(plan, policy, start, end)
    except PlanSourceError as exc:
        print(f"whatif: --source {source}: {exc}", file=sys.stderr)
        return 1
    if not demands:
        print(f"whatif: --source {source}: the plan has no work that takes a GPU: there is "
              "nothing to replay.", file=sys.stderr)
        return 1
    return demands, start, end


def _run(args: argparse.Namespace) -> int:
    from .inventory import AddError, add_cards, parse_add
    from .records import RecordsError, read_month, read_only_engine
    from .study import study

    try:
        additions = [parse_add(text) for text in args.add]
    except AddError as exc:
        print(f"whatif: {exc}", file=sys.stderr)
        return 2
    proposed = _policy(args.policy)
    if not isinstance(proposed, Policy):
        return int(proposed)
    current_file = args.current or os.environ.get("GPUSHARE_POLICY") or args.policy
    current = proposed if current_file == args.policy else _policy(current_file)
    if not isinstance(current, Policy):
        return int(current)
    try:
        add_cards(proposed, additions)
    except AddError as exc:
        print(f"whatif: {exc}", file=sys.stderr)
        return 2
    year, month = args.month
    label = f"{year:04d}-{month:02d}"
    title = (f"{label} under {Path(args.policy).name}"
             + (f" + {', '.join(args.add)}" if args.add else ""))
    meta = {"month": label, "title": title, "policy": args.policy, "current": current_file}
    if args.source:
        got = _from_source(args.source, current, year, month)
        if isinstance(got, int):
            return got
        demands, start, end = got
        meta.update(requests=len(demands), source=args.source)
        doc = study(demands, current, proposed, start, end, additions=additions, meta=meta)
    else:
        url = args.db or os.environ.get("GPUSHARE_DB_URL", "sqlite:///gpushare.sqlite")
        try:
            engine = read_only_engine(url)
            try:
                recorded = read_month(engine, year, month)
            finally:
                engine.dispose()
        except RecordsError as exc:
            print(f"whatif: {exc}", file=sys.stderr)
            return 1
        except Exception as exc:  # the database cannot be read: one sentence, no traceback
            print(f"whatif: cannot read the broker's database {url}: {type(exc).__name__}: "
                  f"{str(exc).splitlines()[0] if str(exc) else ''}", file=sys.stderr)
            return 1
        meta["requests"] = recorded.requests
        doc = study(recorded.demands, current, proposed, recorded.start, recorded.end,
                    additions=additions, recorded=recorded.grants, warm=recorded.warm,
                    meta=meta)
    text = render(doc, args.format)
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


register(Command(
    "whatif",
    "Replay a recorded month under a proposed policy or more cards, side by side",
    _arguments,
    _run,
))

__all__ = ["POLICY_ERRORS"]
