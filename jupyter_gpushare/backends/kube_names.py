"""Names shared by the Kubernetes Job builder and the Kueue export (pure, standard library).

Both sides must agree on them: a Job joins the LocalQueue the export wrote for its team
(label ``kueue.x-k8s.io/queue-name``) and names the WorkloadPriorityClass the export wrote
for its priority class (label ``kueue.x-k8s.io/priority-class``).
"""

from __future__ import annotations

import hashlib
import re

__all__ = [
    "KUEUE_PRIORITY_LABEL",
    "KUEUE_QUEUE_LABEL",
    "POOL_LABEL",
    "cluster_queue_name",
    "dns_label",
    "flavor_name",
    "local_queue_name",
    "priority_class_name",
]

KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
POOL_LABEL = "gpushare.jupyter.org/pool"
"""The node label naming a node's pool (as ``inventory.discovery.pool_label`` reads it)."""

_BAD = re.compile(r"[^a-z0-9-]+")


def dns_label(text: str, max_length: int = 63, prefix: str = "") -> str:
    """A DNS-1123 label (lower-case letters, digits, '-', alphanumeric at both ends) made
    from ``prefix`` + ``text``. Where the text had to change, a short hash of the original is
    appended, so two different inputs never map to one name (lower-casing alone adds none:
    ``H200`` is ``h200``)."""
    raw = prefix + text
    clean = _BAD.sub("-", raw.lower()).strip("-")
    if clean == raw.lower() and len(clean) <= max_length and clean:
        return clean
    digest = hashlib.sha256(raw.encode()).hexdigest()[:8]
    head = clean[: max_length - len(digest) - 1].strip("-")
    return f"{head}-{digest}" if head else f"x-{digest}"


def local_queue_name(team: str) -> str:
    """The team's LocalQueue (one per team in the jobs' namespace)."""
    return dns_label(team, prefix="gpushare-")


def cluster_queue_name(team: str) -> str:
    """The team's ClusterQueue (nominal quota = the team's guarantees)."""
    return dns_label(team, prefix="gpushare-")


def priority_class_name(priority: str) -> str:
    """The WorkloadPriorityClass of a policy priority class."""
    return dns_label(priority, prefix="gpushare-")


def flavor_name(pool: str, model: str = "") -> str:
    """The ResourceFlavor of one pool's GPUs of one model (or MIG profile)."""
    return dns_label(f"{pool}-{model}" if model else pool, prefix="gpushare-")
