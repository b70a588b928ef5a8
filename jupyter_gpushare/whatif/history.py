"""From the broker's recorded rows to demands (pure: the rows are read by :mod:`.records`).

The rules (also in ``docs/whatif.md``):

* every request the broker recorded in the month is an attempt; requests that asked for no
  GPU are left out (the core never decided on them);
* a **batch** request of a job (same user and holder) that arrives after the job's previous
  grant ended ``preempted`` is that job's next attempt (a requeue): one demand;
* an **interactive** request of the same user, server and pool that arrives within
  ``retry_window_s`` of a refusal of the previous one is a retry: one demand, with the
  recorded offsets;
* the demand's work is the hold of its last grant (``released_at - granted_at``; a grant
  still live at the end of the month: up to the end); a job that checkpoints holds the sum
  of its attempts' holds, since each resumes where the last stopped;
* a demand never granted in the record (refused, or cancelled while it waited) gets an
  estimated work (:func:`~.demand.estimate_work`); a cancelled one gives up after the wait
  it had in the record;
* a request made before the month whose grant was live when the month began starts the
  replay on the GPUs it held (``placed``); one still waiting then enters at the start of
  the month, keeping its age (``enter_at``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..core.grant_end import EndKind
from ..core.model import Grant, Kind, Request
from .demand import Demand, estimate_work
from .replay import GrantRecord

RETRY_WINDOW_S = 900.0


@dataclass(frozen=True)
class RequestRow:
    """One recorded request (``gpushare_requests``)."""

    request: Request
    status: str
    created_at: float
    updated_at: float


@dataclass(frozen=True)
class GrantRow:
    """One recorded grant (``gpushare_grants``) with its end kind (``core.grant_end``)."""

    request_id: str
    node: str
    gpus: tuple[str, ...]
    units_milli: int
    granted_at: float
    released_at: float | None
    end_kind: EndKind | None
    borrowed: bool = False
    grant: Grant | None = None  # the core grant, for one live when the month starts


@dataclass
class _Chain:
    rows: list[RequestRow]
    grants: list[GrantRow | None]


def _hold(grant: GrantRow, end: float) -> float:
    released = grant.released_at if grant.released_at is not None else end
    return max(0.0, released - grant.granted_at)


def _joins(chain: _Chain, row: RequestRow, retry_window_s: float) -> bool:
    last, grant = chain.rows[-1], chain.grants[-1]
    if row.request.kind is Kind.BATCH:
        return (grant is not None and grant.end_kind is EndKind.PREEMPTED
                and grant.released_at is not None and row.created_at >= grant.released_at)
    return (last.status == "refused" and grant is None
            and row.created_at - last.created_at <= retry_window_s)


def _chain_key(req: Request) -> tuple[str, ...] | None:
    if not req.holder:
        return None
    if req.kind is Kind.BATCH:
        return ("batch", req.user, req.holder)
    return ("interactive", req.user, req.holder, req.pool)


def _demand(chain: _Chain, end: float, start: float | None) -> Demand:
    rows, grants = chain.rows, chain.grants
    first = rows[0]
    reqs = tuple(r.request for r in rows)
    final = grants[-1]
    held = [_hold(g, end) for g in grants if g is not None]
    known = 0.0
    if final is None:
        work, estimated = 0.0, True
        if held:  # preempted before: it had at least this much work
            checkpoints = first.request.kind is Kind.BATCH and first.request.checkpointing
            known = sum(held) if checkpoints else max(held)
    elif first.request.kind is Kind.BATCH and first.request.checkpointing:
        work, estimated = sum(held), False
    else:
        work, estimated = _hold(final, end), False
    offsets: tuple[float, ...] = ()
    delays: tuple[float, ...] = ()
    if first.request.kind is Kind.INTERACTIVE and len(rows) > 1:
        offsets = tuple(r.created_at - first.created_at for r in rows)
    if first.request.kind is Kind.BATCH:
        delays = tuple(
            nxt.created_at - g.released_at
            for g, nxt in zip(grants, rows[1:], strict=False)
            if g is not None and g.released_at is not None
        )
    last = rows[-1]
    patience = last.updated_at - last.created_at if last.status == "cancelled" else None
    placed = grants[0].grant if grants[0] is not None else None
    enter_at = None
    if start is not None and first.created_at < start and placed is None:
        enter_at = start  # it was waiting when the month began
    return Demand(id=first.request.id, requests=reqs, work_s=work, offsets=offsets,
                  patience_s=patience, requeue_delays=delays, estimated=estimated,
                  known_work_s=known, placed=placed, enter_at=enter_at)


def demands_from(requests: Sequence[RequestRow], grants: Sequence[GrantRow], end: float,
                 retry_window_s: float = RETRY_WINDOW_S, start: float | None = None
                 ) -> list[Demand]:
    """The month's demands from its recorded requests and their grants (see the module).
    With ``start``: a demand whose first grant was made before it starts the replay on its
    recorded GPUs; one created before it and not granted enters the replay at ``start``."""
    by_request = {g.request_id: g for g in grants}
    open_chains: dict[tuple[str, ...], _Chain] = {}
    chains: list[_Chain] = []
    for row in sorted(requests, key=lambda r: (r.created_at, r.request.id)):
        if row.request.gpu.is_empty:
            continue
        grant = by_request.get(row.request.id)
        key = _chain_key(row.request)
        chain = open_chains.get(key) if key is not None else None
        if chain is not None and _joins(chain, row, retry_window_s):
            chain.rows.append(row)
            chain.grants.append(grant)
            continue
        chain = _Chain([row], [grant])
        chains.append(chain)
        if key is not None:
            open_chains[key] = chain
    return estimate_work([_demand(c, end, start) for c in chains])


def recorded_grants(requests: Sequence[RequestRow], grants: Sequence[GrantRow],
                    demands: Sequence[Demand]) -> list[GrantRecord]:
    """The recorded grants as :class:`GrantRecord` (for the side by side and the fidelity)."""
    demand_of = {r.id: d.id for d in demands for r in d.requests}
    req_of = {r.request.id: r.request for r in requests}
    out = []
    for g in grants:
        req = req_of.get(g.request_id)
        if req is None or g.request_id not in demand_of:
            continue
        out.append(GrantRecord(
            g.request_id, demand_of[g.request_id], req.team, req.pool, req.kind.value,
            g.units_milli, g.node, g.gpus, g.granted_at, g.released_at,
            g.end_kind.value if g.end_kind else None, g.borrowed))
    return out
