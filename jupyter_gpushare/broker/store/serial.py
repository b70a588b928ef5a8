"""Translation between core objects, database rows and the JSON of the REST API."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from functools import lru_cache
from typing import Any

from ...core.model import GPUAsk, GPUSlice, Grant, Kind, Placement, Policy, Request

ISO_MIN = datetime(1, 1, 1, tzinfo=timezone.utc).timestamp()
ISO_MAX = datetime(9999, 12, 31, 23, 59, 59, tzinfo=timezone.utc).timestamp()


def iso(ts: float | None) -> str | None:
    """``ts`` (epoch seconds) as ISO 8601 UTC; clamped to the years 1..9999 a ``datetime``
    holds, so that no stored time (a grant's start plus a profile's huge max lifetime) can
    make an answer fail after its change was committed; NaN: ``None``."""
    if ts is None or ts != ts:
        return None
    return _iso(min(max(float(ts), ISO_MIN), ISO_MAX))


@lru_cache(maxsize=4096)
def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=timezone.utc).isoformat().replace("+00:00", "Z")


INT_COLUMN_MAX = 2**31 - 1  # an INTEGER column of PostgreSQL (SQLite's hold 2**63 - 1)


def column_int(value: int) -> int:
    """``value`` clamped to what an INTEGER column holds on every database: a policy read
    without ranges (a grace period of 10**30 s) must not make the commit of a grant fail;
    2**31 - 1 seconds is 68 years, as good as forever."""
    return max(-INT_COLUMN_MAX, min(int(value), INT_COLUMN_MAX))


def request_to_spec(req: Request) -> dict[str, Any]:
    return {
        "id": req.id,
        "user": req.user,
        "team": req.team,
        "pool": req.pool,
        "gpu": {
            "whole": req.gpu.whole,
            "fraction_milli": req.gpu.fraction_milli,
            "memory_mib": req.gpu.memory_mib,
            "compute_milli": req.gpu.compute_milli,
        },
        "priority": req.priority,
        "kind": req.kind.value,
        "holder": req.holder,
        "profile": req.profile,
        "cpu_milli": req.cpu_milli,
        "memory_mib": req.memory_mib,
        "gpu_models": list(req.gpu_models),
        "checkpointing": req.checkpointing,
        "max_runtime_s": req.max_runtime_s,
        "created_at": req.created_at,
    }


_KINDS = {k.value: k for k in Kind}


@lru_cache(maxsize=4096, typed=True)
def _cached_ask(
    whole: int, fraction_milli: int, memory_mib: Any, compute_milli: Any
) -> GPUAsk:
    return GPUAsk(whole, fraction_milli, memory_mib, compute_milli)


def _gpu_ask(gpu: dict[str, Any]) -> GPUAsk:
    """The (immutable, so shared) ``GPUAsk`` of a spec: start-up builds 100,000 of them."""
    whole = int(gpu.get("whole", 0))
    fraction_milli = int(gpu.get("fraction_milli", 0))
    memory_mib = gpu.get("memory_mib")
    compute_milli = gpu.get("compute_milli")
    try:
        return _cached_ask(whole, fraction_milli, memory_mib, compute_milli)
    except TypeError:  # an unhashable value: build it as it is
        return GPUAsk(whole, fraction_milli, memory_mib, compute_milli)


def spec_to_request(spec: dict[str, Any]) -> Request:
    get = spec.get
    kind = get("kind", "interactive")
    return Request(
        spec["id"],
        spec["user"],
        spec["team"],
        spec["pool"],
        _gpu_ask(spec["gpu"]),
        spec["priority"],
        (_KINDS.get(kind) or Kind(kind)) if isinstance(kind, str) else Kind(kind),
        get("holder", ""),
        get("profile", ""),
        int(get("cpu_milli", 0)),
        int(get("memory_mib", 0)),
        tuple(get("gpu_models", ())),
        bool(get("checkpointing", False)),
        get("max_runtime_s"),
        float(get("created_at", 0.0)),
    )


@lru_cache(maxsize=65536, typed=True)
def _cached_slice(uuid: Any, memory_mib: int, compute_milli: int) -> GPUSlice:
    return GPUSlice(uuid, memory_mib, compute_milli)


def _gpu_slice(s: dict[str, Any]) -> GPUSlice:
    uuid = s["uuid"]
    memory_mib = int(s["memory_mib"])
    compute_milli = int(s["compute_milli"])
    try:
        return _cached_slice(uuid, memory_mib, compute_milli)
    except TypeError:
        return GPUSlice(uuid, memory_mib, compute_milli)


def slices_to_json(placement: Placement) -> list[dict[str, Any]]:
    return [
        {"uuid": s.gpu_uuid, "memory_mib": s.memory_mib, "compute_milli": s.compute_milli}
        for s in placement.slices
    ]


def grant_row(grant: Grant) -> dict[str, Any]:
    req = grant.request
    return {
        "id": grant.id,
        "request_id": req.id,
        "username": req.user,
        "server": req.holder,
        "team": req.team,
        "pool": req.pool,
        "profile": req.profile,
        "kind": req.kind.value,
        "node": grant.placement.node,
        "slices": slices_to_json(grant.placement),
        "units_milli": grant.units_milli,
        "borrowed": grant.borrowed,
        "preemptible": grant.preemptible,
        "priority": req.priority,
        "priority_value": column_int(grant.priority_value),
        "grace_period_s": column_int(grant.grace_period_s),
        "spec": request_to_spec(req),
        "granted_at": grant.granted_at,
    }


def row_to_grant(row: Any) -> Grant:
    """The grant of one row of ``grants``; for many rows, :func:`grant_reader` is faster."""
    return grant_reader(row._fields)(row)


_GRANT_COLUMNS = (
    "id", "spec", "node", "slices", "units_milli", "borrowed", "priority_value", "preemptible",
    "granted_at", "grace_period_s",
)


def grant_reader(fields: Sequence[str]) -> Callable[[Any], Grant]:
    """:func:`row_to_grant` for the rows of one query with these column names.

    The columns are found once by position: reading a row's attributes by name costs about
    as much as building its grant, and start-up reads 100,000 rows.
    """
    at = {name: i for i, name in enumerate(fields)}
    (i_id, i_spec, i_node, i_slices, i_units, i_borrowed, i_value, i_preemptible, i_at,
     i_grace) = (at[name] for name in _GRANT_COLUMNS)

    def read(row: Any) -> Grant:
        return Grant(
            row[i_id],
            spec_to_request(row[i_spec]),
            Placement(row[i_node], tuple([_gpu_slice(s) for s in row[i_slices]])),
            int(row[i_units]),
            bool(row[i_borrowed]),
            int(row[i_value]),
            bool(row[i_preemptible]),
            float(row[i_at]),
            int(row[i_grace]),
        )

    return read


def gpus_json(policy_gpus: dict[str, Any], slices: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for s in slices:
        gpu = policy_gpus.get(s["uuid"])
        out.append(
            {
                "uuid": s["uuid"],
                "memory_mib": s["memory_mib"],
                "compute_pct": s["compute_milli"] / 10,
                "model": gpu.model if gpu else None,
                "simulated": bool(gpu.simulated) if gpu else False,
            }
        )
    return out


def gpu_index(policy: Policy) -> dict[str, Any]:
    return {g.uuid: g for n in policy.nodes for g in n.gpus}


def request_row(
    req: Request, status: str, reason: str, code: str, grant_id: str | None,
    idempotency_key: str | None, now: float,
) -> dict[str, Any]:
    """The ``requests`` table row for ``req`` answered with ``status``."""
    return dict(
        id=req.id,
        username=req.user,
        server=req.holder,
        team=req.team,
        pool=req.pool,
        kind=req.kind.value,
        profile=req.profile,
        status=status,
        reason=reason,
        code=code,
        spec=request_to_spec(req),
        grant_id=grant_id,
        idempotency_key=idempotency_key,
        created_at=now,
        updated_at=now,
    )


def make_request(
    policy: Policy, *, request_id: str, user: str, team: str, body: dict[str, Any], now: float
) -> Request:
    """Build a core ``Request`` from the API body (validated by the handler)."""
    kind = Kind(body.get("kind", "interactive"))
    return Request(
        id=request_id,
        user=user,
        team=team,
        pool=body["pool"],
        gpu=body["gpu_ask"],
        priority=body["priority"],
        kind=kind,
        holder=body.get("server", "") or "",
        profile=body.get("profile_slug", "") or "",
        cpu_milli=int(body.get("cpu_milli", 0) or 0),
        memory_mib=int(body.get("memory_mib", 0) or 0),
        gpu_models=tuple(body.get("gpu_models", ()) or ()),
        checkpointing=bool(body.get("checkpointing", False)),
        max_runtime_s=body.get("max_runtime_s"),
        created_at=now,
    )

