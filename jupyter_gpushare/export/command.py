"""``jupyter-gpushare export kueue|slurm|ytsaurus POLICY``: the same policy for a batch engine.

Each target is an :class:`Exporter` (a module of this package registers one with
:func:`exporter`); the command loads and checks the policy once (errors with file and
line, as ``check-policy`` gives them), then writes the target's text to stdout or ``-o``.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..cli import Command, internal_error, print_issues, register, write_output

TARGET_MODULES = {
    "kueue": "jupyter_gpushare.export.kueue",
    "slurm": "jupyter_gpushare.export.slurm",
    "ytsaurus": "jupyter_gpushare.export.ytsaurus",
}
"""The export targets and the module that registers each (imported when used)."""


@dataclass(frozen=True)
class Exporter:
    """One export target: its options and the function from a policy to text."""

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    render: Callable[[Any, argparse.Namespace], str]  # (Policy, args) -> text


EXPORTERS: dict[str, Exporter] = {}


def exporter(target: Exporter) -> Exporter:
    """Register an export target (module level, in the target's module)."""
    EXPORTERS[target.name] = target
    return target


def _load_targets() -> None:
    for name, module in TARGET_MODULES.items():
        if name not in EXPORTERS:
            try:
                importlib.import_module(module)
            except ImportError as exc:  # a target not built yet: the others still work
                print(f"jupyter-gpushare export: no {name} target ({exc})", file=sys.stderr)


def _arguments(parser: argparse.ArgumentParser) -> None:
    _load_targets()
    sub = parser.add_subparsers(dest="target", metavar="TARGET")
    for target in sorted(EXPORTERS.values(), key=lambda t: t.name):
        child = sub.add_parser(target.name, help=target.help, description=target.help)
        child.add_argument("policy", help="the policy file (YAML), e.g. hub_config/gpushare.yaml")
        child.add_argument("-o", "--output", help="write here instead of stdout")
        target.add_arguments(child)


def _run(args: argparse.Namespace) -> int:
    from ..discovery import discover
    from ..policy import PolicyError, load_policy

    target = EXPORTERS.get(getattr(args, "target", None) or "")
    if target is None:
        print("jupyter-gpushare export: name a target: " + ", ".join(sorted(EXPORTERS)),
              file=sys.stderr)
        return 2
    try:
        policy = load_policy(args.policy, discover)
    except PolicyError as exc:
        return print_issues(args.policy, exc.errors, len(exc.errors))
    except Exception as exc:  # never a traceback for a file, whatever it holds
        return internal_error(args.policy, exc)
    text = target.render(policy, args)
    return write_output(text, args.output)


register(Command(
    "export",
    "Write the policy as a batch engine's configuration (Kueue objects, Slurm config)",
    _arguments,
    _run,
))
