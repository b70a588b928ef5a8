"""The whole file: text -> :class:`~jupyter_gpushare.core.model.Policy`, with every issue."""

from __future__ import annotations

import logging
from pathlib import Path

from ..core.model import Node, Policy
from .crossref import check_default_team, check_pools_and_guarantees, pool_table
from .fields import Fields
from .inventory import Discover, DiscoverySpec, check_nodes, parse_inventory
from .issues import Collector, PolicyCheck, PolicyError, PolicyIssue
from .profiles import Pools, parse_profiles
from .schema import POLICY
from .sections import declared, parse_pools, parse_priorities, parse_slurm, parse_teams
from .yamlread import MAX_CHARS, read_root

log = logging.getLogger("jupyter_gpushare.policy")


def check_policy(text: str, filename: str = "<string>", discover: Discover | None = None
                 ) -> PolicyCheck:
    """Read a policy and report every problem; the policy is ``None`` if there are errors.

    Every section is read even when another has errors, and references are checked
    against the names each section declares (valid or not), so one pass reports every
    independent error: a typo in one place and an unknown team in another both show.
    """
    ctx = Collector(filename)
    data = read_root(ctx, text)
    if data is None:
        return PolicyCheck(None, ctx.issues)
    root = Fields(ctx, data, "", POLICY)
    names = declared(root)
    pools = parse_pools(ctx, root)
    priorities = parse_priorities(ctx, root)
    source, node_ats, known = parse_inventory(ctx, root, discover)
    check_nodes(ctx, node_ats, names.pools)
    teams = parse_teams(ctx, root, names)
    by_pool: dict[str, list[Node]] = {}
    for at in node_ats:
        by_pool.setdefault(at.node.pool, []).append(at.node)
    table, pool_lines = pool_table(pools)
    hw = Pools(table, by_pool, known)
    profiles = parse_profiles(ctx, root, hw, names, teams)
    default_team = check_default_team(ctx, root, names)
    if not teams and not root.has("teams"):
        ctx.warn(data.line, "teams", "no teams: nobody has a quota, so no GPU can be granted")
    check_pools_and_guarantees(ctx, hw, pool_lines, teams)
    slurm = parse_slurm(ctx, root)
    ctx.issues.sort(key=lambda i: (i.line, i.severity != "error"))
    if ctx.failed:
        return PolicyCheck(None, ctx.issues)
    policy = Policy(
        nodes=tuple(at.node for at in node_ats),
        pools=tuple(table.values()),
        priority_classes=tuple(p for p, _ in priorities.values()),
        teams=tuple(t.team for t in teams.values()),
        profiles=tuple(profiles),
        default_team=default_team,
        inventory_source=source,
        slurm=slurm,
    )
    return PolicyCheck(policy, ctx.issues)


def _finish(check: PolicyCheck) -> Policy:
    if check.policy is None:
        raise PolicyError(check.errors)
    for issue in check.warnings:
        log.warning("%s", issue)
    return check.policy


def parse_policy(text: str, filename: str = "<string>", discover: Discover | None = None
                 ) -> Policy:
    """Parse policy text; raises :class:`PolicyError` listing every error."""
    return _finish(check_policy(text, filename, discover))


def read_policy_text(path: str | Path) -> str:
    """The file's text; an unreadable file raises :class:`PolicyError` naming it (and the
    line, for a file that is not UTF-8); at most :data:`~.yamlread.MAX_CHARS` bytes are
    read, a longer file is an error."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_CHARS + 1)
    except OSError as exc:
        raise PolicyError([PolicyIssue(str(path), 0, "", f"cannot read the file: {exc}")]
                          ) from exc
    if len(data) > MAX_CHARS:
        raise PolicyError([PolicyIssue(str(path), 1, "", f"the file is longer than "
                                       f"{MAX_CHARS:,} bytes (at most that is read)")])
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise PolicyError([PolicyIssue(str(path), line, "", "cannot read the file: it is not "
                                       f"UTF-8 text (byte {exc.start + 1}: {exc.reason})")]
                          ) from None


def check_policy_file(path: str | Path, discover: Discover | None = None) -> PolicyCheck:
    """:func:`check_policy` on a file; an unreadable file is one error."""
    try:
        text = read_policy_text(path)
    except PolicyError as exc:
        return PolicyCheck(None, exc.errors)
    return check_policy(text, str(path), discover)


def load_policy(path: str | Path, discover: Discover | None = None) -> Policy:
    """Load a policy file; raises :class:`PolicyError` listing every error.

    A discovered inventory (``source: nvml`` or ``kubernetes``) is read with ``discover``:
    the runtime's is :func:`jupyter_gpushare.discovery.discover`, and
    :func:`jupyter_gpushare.discovery.load_policy` is this function with it. Without
    ``discover`` such a file is an error naming the file and line of ``inventory.source``
    (the policy package does no I/O beyond reading the file, and imports no discovery).
    """
    return _finish(check_policy_file(path, discover or _no_discovery))


def _no_discovery(spec: DiscoverySpec) -> tuple[Node, ...]:
    raise LookupError(
        "no discovery was given: load this file with jupyter_gpushare.discovery.load_policy "
        "(or pass discover=)"
    )
