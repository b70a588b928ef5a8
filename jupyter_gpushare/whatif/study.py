"""One what-if: the month replayed under today's policy and under the proposal (pure)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..core.model import Policy, Request
from .compare import side_by_side
from .demand import Demand
from .fidelity import compare_grants
from .inventory import Addition, add_cards, cards_added
from .replay import GrantRecord, QueueLimits, replay


def study(demands: Sequence[Demand], current: Policy, proposed: Policy, start: float,
          end: float, *, additions: Sequence[Addition] = (),
          recorded: Sequence[GrantRecord] | None = None, limits: QueueLimits | None = None,
          warm: Sequence[Request] = (), meta: dict[str, Any] | None = None) -> dict[str, Any]:
    """The side-by-side document; with ``recorded`` (the broker's grants), how closely the
    current policy's replay reproduces them (``fidelity``); ``warm``: requests before the
    window whose shapes the shared pools' packing learns first (:class:`~.replay.Replay`)."""
    proposal = add_cards(proposed, list(additions)) if additions else proposed
    base = replay(current, demands, limits=limits, warm=warm)
    other = replay(proposal, demands, limits=limits, warm=warm)
    info: dict[str, Any] = dict(meta or {})
    info["added"] = [str(a) for a in additions]
    info["demands"] = len(demands)
    info["estimated_demands"] = sum(1 for d in demands if d.estimated)
    if recorded is not None:
        fid = compare_grants(recorded, base.grants, start, end)
        info["fidelity"] = {
            "recorded": fid.recorded,
            "exact_share": round(fid.exact_share, 4),
            "max_hours_error": round(max((fid.hours_error(t) for t in fid.hours_recorded),
                                         default=0.0), 5),
        }
    return side_by_side(base, other, start, end, cards_added=cards_added(list(additions)),
                        meta=info)
