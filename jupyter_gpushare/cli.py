"""The ``jupyter-gpushare`` command (also reachable as ``jupyter gpushare``).

Subcommands live in a small registry so that other modules can add theirs:

    from jupyter_gpushare.cli import Command, register

    register(Command("report", "Print the monthly report", add_arguments, run))

where ``add_arguments(parser)`` declares its options and ``run(args) -> int``
returns the exit status. Modules named in :data:`COMMAND_MODULES` are imported
by :func:`main` before parsing, so a new module only needs adding there; a
module that is absent or fails to import is skipped (its subcommand is missing,
the others still work).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from . import __version__

COMMAND_MODULES: list[str] = [
    "jupyter_gpushare.report.command",
    "jupyter_gpushare.planner.command",
    "jupyter_gpushare.jobs_cli",
    "jupyter_gpushare.export.command",
    "jupyter_gpushare.grafana.command",
    "jupyter_gpushare.whatif.command",
    "jupyter_gpushare.broker.store.upgrade_command",
]
"""Modules that register subcommands when imported (e.g. "jupyter_gpushare.report")."""


@dataclass(frozen=True)
class Command:
    """One subcommand: its name, one-line help, argument setup and action."""

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


COMMANDS: dict[str, Command] = {}


def register(command: Command) -> Command:
    """Add (or replace) a subcommand; returns it so it can be used at module level."""
    COMMANDS[command.name] = command
    return command


# ------------------------------------------------------------------ check-policy


def write_output(text: str, path: str | None) -> int:
    """A command's result: written to ``path`` (saying so on stderr) or printed; exit 0."""
    if path:
        with open(path, "w", encoding="utf-8") as out:
            out.write(text)
        print(f"wrote {path}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def _check_policy_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="the policy file (YAML), e.g. hub_config/gpushare.yaml")
    parser.add_argument("-q", "--quiet", action="store_true",
                        help="print only errors and warnings, not the summary")


POLICY_ERRORS = 2
"""Exit status of ``check-policy`` and ``export`` for a policy file with errors (each
printed as ``FILE:LINE: field: what``); 1 is left to Python's own failures."""


def internal_error(file: str, exc: BaseException) -> int:
    """A checker's own failure on ``file``: one line that names it, no traceback."""
    from .policy.issues import one_line
    from .policy.yamlread import shorten

    print(one_line(f"{file}:1: internal error while reading the policy "
                   f"({type(exc).__name__}: {shorten(str(exc), 200)}); please report it"),
          file=sys.stderr)
    return POLICY_ERRORS


def print_issues(file: str, issues: Sequence[object], count: int) -> int:
    """``FILE: N errors`` and one indented line per issue, on stderr."""
    print(f"{file}: {count} error{'s' if count != 1 else ''}", file=sys.stderr)
    for issue in issues:
        print(f"  {issue}", file=sys.stderr)
    return POLICY_ERRORS


def _check_policy(args: argparse.Namespace) -> int:
    from .policy import check_policy_file, summarize

    try:
        check = check_policy_file(args.file)
    except Exception as exc:  # never a traceback for a file, whatever it holds
        return internal_error(args.file, exc)
    if check.policy is None:
        return print_issues(args.file, check.issues, len(check.errors))
    if not args.quiet:
        print(f"Policy {args.file}: OK")
        print()
        print(summarize(check.policy))
    if check.warnings:
        print(file=sys.stderr)
        print(f"{len(check.warnings)} warning(s):", file=sys.stderr)
        for issue in check.warnings:
            print(f"  {issue}", file=sys.stderr)
    return 0


register(Command(
    "check-policy",
    "Check a policy file: print a summary, or every error with file and line",
    _check_policy_arguments,
    _check_policy,
))


# ----------------------------------------------------------------- policy-schema


def _policy_schema_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-o", "--output", metavar="FILE",
                        help="write the schema to FILE instead of printing it")


def _policy_schema(args: argparse.Namespace) -> int:
    import json

    from .policy import json_schema

    text = json.dumps(json_schema(), indent=2, sort_keys=False) + "\n"
    return write_output(text, args.output)


register(Command(
    "policy-schema",
    "Print the JSON Schema of the policy file (for editors: yaml-language-server)",
    _policy_schema_arguments,
    _policy_schema,
))


# --------------------------------------------------------------------------- main


def _load_command_modules() -> None:
    for name in COMMAND_MODULES:
        try:
            importlib.import_module(name)
        except Exception as exc:  # one broken module must not break the other commands
            print(f"jupyter-gpushare: skipping commands of {name}: {exc}", file=sys.stderr)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every registered subcommand."""
    parser = argparse.ArgumentParser(
        prog="jupyter-gpushare",
        description="Share scarce GPUs from JupyterHub and JupyterLab.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in sorted(COMMANDS.values(), key=lambda c: c.name):
        child = sub.add_parser(command.name, help=command.help, description=command.help)
        command.add_arguments(child)
        child.set_defaults(_run=command.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``jupyter-gpushare``; returns the exit status."""
    _load_command_modules()
    parser = build_parser()
    args = parser.parse_args(argv)
    run = getattr(args, "_run", None)
    if run is None:
        parser.print_help()
        return 2
    return int(run(args))


if __name__ == "__main__":
    # ``python -m jupyter_gpushare.cli``: this module runs as ``__main__``, but command modules
    # register into the imported ``jupyter_gpushare.cli``, so its main (and registry) is used
    from jupyter_gpushare.cli import main as _main

    sys.exit(_main())
