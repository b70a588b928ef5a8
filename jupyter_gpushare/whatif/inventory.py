"""Cards added to a policy for a what-if (``--add POOL:MODEL:COUNT``). Pure."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..core.model import GPU, Node, Policy, SharingMode


class AddError(ValueError):
    """An ``--add`` that cannot be applied (names the part that is wrong)."""


@dataclass(frozen=True)
class Addition:
    """``count`` cards of ``model`` added to ``pool``."""

    pool: str
    model: str
    count: int

    def __str__(self) -> str:
        return f"{self.pool}:{self.model}:{self.count}"


def parse_add(text: str) -> Addition:
    """``POOL:MODEL:COUNT`` (COUNT a whole number >= 1)."""
    parts = text.split(":")
    if len(parts) != 3 or not parts[0] or not parts[1]:
        raise AddError(f"--add {text!r}: expected POOL:MODEL:COUNT, e.g. train:H100:8")
    try:
        count = int(parts[2])
    except ValueError:
        raise AddError(f"--add {text!r}: COUNT must be a whole number, not {parts[2]!r}") from None
    if count < 1:
        raise AddError(f"--add {text!r}: COUNT must be at least 1")
    return Addition(parts[0], parts[1], count)


def _template(policy: Policy, add: Addition) -> tuple[Node, GPU]:
    """A node of the pool to copy (CPU, RAM, cards per node) and a card of the model."""
    same_pool = policy.nodes_in(add.pool)
    cards = [g for n in policy.nodes for g in n.gpus if g.model == add.model]
    if not cards:
        known = sorted({g.model for n in policy.nodes for g in n.gpus})
        raise AddError(f"--add {add}: model {add.model!r} is in no node of the policy, so its "
                       f"memory is unknown (models: {', '.join(known) or 'none'})")
    with_model = [n for n in same_pool if add.model in n.gpu_models]
    node = (with_model or list(same_pool) or [n for n in policy.nodes
                                              if add.model in n.gpu_models])[0]
    return node, cards[0]


def add_cards(policy: Policy, additions: list[Addition]) -> Policy:
    """``policy`` with the cards added, on new nodes shaped like the pool's (same cards per
    node, CPU and RAM); the last node of an addition may hold fewer cards."""
    nodes = list(policy.nodes)
    names = {n.name for n in nodes}
    for add in additions:
        pool = policy.pool(add.pool)
        if pool is None:
            raise AddError(f"--add {add}: unknown pool {add.pool!r} "
                           f"(pools: {', '.join(p.name for p in policy.pools)})")
        if pool.mode is SharingMode.MIG:
            raise AddError(f"--add {add}: pool {add.pool} is a MIG pool; add its MIG devices "
                           "in the policy instead")
        node, card = _template(policy, add)
        per_node = max(1, len(node.gpus))
        left, i = add.count, 0
        while left > 0:
            name = f"whatif-{add.pool}-{add.model}-{i}".lower()
            i += 1
            if name in names:
                continue
            k = min(per_node, left)
            gpus = tuple(dataclasses.replace(card, uuid=f"GPU-{name}-{j}", index=j,
                                             simulated=True) for j in range(k))
            nodes.append(Node(name, add.pool, gpus, node.cpu_milli, node.memory_mib,
                              node.labels))
            names.add(name)
            left -= k
    return dataclasses.replace(policy, nodes=tuple(nodes), _index={})


def cards_added(additions: list[Addition]) -> int:
    return sum(a.count for a in additions)
