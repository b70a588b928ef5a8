"""``jupyter-gpushare dashboard``: print (or write) the Grafana dashboard JSON."""

from __future__ import annotations

import argparse
import sys

from ..cli import Command, register

MISSING_SDK = (
    "jupyter-gpushare dashboard: the dashboard is built with Grafana's grafana-foundation-sdk, "
    "which is not installed ({error}); install it with\n"
    "    pip install 'jupyter-gpushare[grafana]'\n"
    "(it needs Python 3.11 or newer). The generated dashboard is also in the source "
    "repository: hub_config/grafana/gpushare-dashboard.json"
)
"""What the command says, on stderr with exit status 1, where the SDK is missing."""


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-o", "--output", metavar="FILE",
                        help="write the dashboard JSON to FILE instead of printing it")


def _run(args: argparse.Namespace) -> int:
    try:
        from .dashboard import render
    except ImportError as exc:  # the optional extra is not installed
        print(MISSING_SDK.format(error=exc), file=sys.stderr)
        return 1
    text = render()
    if args.output:
        with open(args.output, "w", encoding="utf-8") as out:
            out.write(text)
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


register(Command(
    "dashboard",
    "Print the Grafana dashboard (JSON) of the broker's Prometheus metrics",
    _arguments,
    _run,
))
