"""What the policy loader reports: one :class:`PolicyIssue` per problem, where it is."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..core.model import Policy

_UNSAFE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def one_line(text: str) -> str:
    """``text`` with line breaks and other control characters escaped (``\\n``): an issue
    is one line of output whatever the file held."""
    return _UNSAFE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


@dataclass(frozen=True)
class PolicyIssue:
    """One problem in a policy file: where it is and what was expected."""

    file: str
    line: int
    path: str
    message: str
    severity: str = "error"  # "error" or "warning"

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        prefix = "warning: " if self.severity == "warning" else ""
        path = f"{self.path}: " if self.path else ""
        return one_line(f"{where}: {prefix}{path}{self.message}")


class PolicyError(Exception):
    """The policy file has errors; ``errors`` lists every one of them."""

    def __init__(self, errors: list[PolicyIssue]):
        self.errors = list(errors)
        super().__init__(str(self))

    def __str__(self) -> str:
        count = len(self.errors)
        head = f"{count} error{'s' if count != 1 else ''} in the policy file:"
        return "\n".join([head, *(f"  {issue}" for issue in self.errors)])


@dataclass
class PolicyCheck:
    """What :func:`check_policy` found: the policy (``None`` on errors) and all issues."""

    policy: Policy | None
    issues: list[PolicyIssue]

    @property
    def errors(self) -> list[PolicyIssue]:
        return [i for i in self.issues if i.severity == "error"]

    @property
    def warnings(self) -> list[PolicyIssue]:
        return [i for i in self.issues if i.severity == "warning"]


class Collector:
    """Collects the issues of one file."""

    def __init__(self, filename: str):
        self.filename = filename
        self.issues: list[PolicyIssue] = []

    def error(self, line: int, path: str, message: str) -> None:
        self.issues.append(PolicyIssue(self.filename, line, path, message))

    def warn(self, line: int, path: str, message: str) -> None:
        self.issues.append(PolicyIssue(self.filename, line, path, message, "warning"))

    @property
    def failed(self) -> bool:
        return any(i.severity == "error" for i in self.issues)

    def failed_under(self, prefix: str) -> bool:
        """Whether any error was reported at ``prefix`` or below it."""
        return any(i.severity == "error" and (i.path == prefix or i.path.startswith(prefix + "."))
                   for i in self.issues)
