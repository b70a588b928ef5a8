"""Translation between core objects, database rows and the JSON of the REST API."""

from __future__ import annotations

from datetime import datetime, timezone
from functools import lru_cache
from typing import Any

from ..core.model import GPUAsk, GPUSlice, Grant, Kind, Placement, Policy, Request


def iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return _iso(ts)


@lru_cache(maxsize=4096)
def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=timezone.utc).isoformat().replace("+00:00", "Z")


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


def spec_to_request(spec: dict[str, Any]) -> Request:
    gpu = spec["gpu"]
    return Request(
        id=spec["id"],
        user=spec["user"],
        team=spec["team"],
        pool=spec["pool"],
        gpu=GPUAsk(
            whole=int(gpu.get("whole", 0)),
            fraction_milli=int(gpu.get("fraction_milli", 0)),
            memory_mib=gpu.get("memory_mib"),
            compute_milli=gpu.get("compute_milli"),
        ),
        priority=spec["priority"],
        kind=Kind(spec.get("kind", "interactive")),
        holder=spec.get("holder", ""),
        profile=spec.get("profile", ""),
        cpu_milli=int(spec.get("cpu_milli", 0)),
        memory_mib=int(spec.get("memory_mib", 0)),
        gpu_models=tuple(spec.get("gpu_models", ())),
        checkpointing=bool(spec.get("checkpointing", False)),
        max_runtime_s=spec.get("max_runtime_s"),
        created_at=float(spec.get("created_at", 0.0)),
    )


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
        "priority_value": grant.priority_value,
        "grace_period_s": grant.grace_period_s,
        "spec": request_to_spec(req),
        "granted_at": grant.granted_at,
    }


def row_to_grant(row: Any) -> Grant:
    req = spec_to_request(row.spec)
    placement = Placement(
        row.node,
        tuple(
            GPUSlice(s["uuid"], int(s["memory_mib"]), int(s["compute_milli"])) for s in row.slices
        ),
    )
    return Grant(
        id=row.id,
        request=req,
        placement=placement,
        units_milli=int(row.units_milli),
        borrowed=bool(row.borrowed),
        priority_value=int(row.priority_value),
        preemptible=bool(row.preemptible),
        granted_at=float(row.granted_at),
        grace_period_s=int(row.grace_period_s),
    )


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

