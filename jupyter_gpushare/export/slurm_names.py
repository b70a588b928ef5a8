"""The Slurm names of the policy's pools, teams and priority classes (partitions, accounts,
QOS), and the quoting that keeps any name one value in slurm.conf / gres.conf or one word in
the ``sacctmgr`` script. Pure (no I/O)."""

from __future__ import annotations

import re
import shlex

from ..policy.yamlread import show

COHORT_ACCOUNT = "gpushare"
"""The parent account of every team's account (the cohort that borrows from itself)."""


def slurm_name(name: str) -> str:
    """A policy name as a Slurm account/QOS/partition name (lower case: slurmdbd stores
    names in lower case; characters other than letters, digits, ``-`` and ``_`` become
    ``_``)."""
    return re.sub(r"[^a-z0-9_-]", "_", name.lower())


_CONF_VALUE = re.compile(r"^[A-Za-z0-9._,:/@%+\[\]-]+$")


def conf_value(value: str, what: str) -> str:
    """``value`` as a slurm.conf / gres.conf value: one word of safe characters, or
    ValueError (a name the policy check let through is refused here, never written)."""
    if not _CONF_VALUE.match(value):
        raise ValueError(
            f"{what} {show(value)} cannot be written into slurm.conf (expected "
            "letters, digits and . _ , : / @ % + [ ] -)"
        )
    return value


def sh(*words: str) -> str:
    """One shell command line: every word quoted (``shlex.quote``), so that no name can add
    a word, a command or a line to the script."""
    return " ".join(shlex.quote(w) for w in words)


def partition_name(pool: str) -> str:
    """The Slurm partition of a pool."""
    return slurm_name(pool)


def team_account(team: str) -> str:
    """The Slurm account of a team (parent of its per-pool accounts)."""
    return slurm_name(team)


def account_name(team: str, pool: str) -> str:
    """The Slurm account that a job of ``team`` in ``pool`` is charged to."""
    return f"{slurm_name(team)}_{slurm_name(pool)}"


def qos_name(priority_class: str) -> str:
    """The Slurm QOS of a priority class."""
    return slurm_name(priority_class)


def _ranges(names: list[str]) -> str:
    return ",".join(names)
