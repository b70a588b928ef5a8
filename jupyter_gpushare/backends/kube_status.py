"""What the Kubernetes API's status objects say (pure: the dicts of Jobs, pods, Workloads)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from .kube_objects import CONTAINER

DISRUPTIONS = {"PreemptionByScheduler", "PreemptionByKubeScheduler", "EvictionByEvictionAPI",
               "TerminationByKubelet", "DeletionByTaintManager"}
"""Reasons of a pod's ``DisruptionTarget`` condition that mean 'preempted, not failed'."""


def condition(obj: Mapping[str, Any], kind: str) -> dict[str, Any] | None:
    """The object's condition of type ``kind`` where it is ``True`` (None: it is not)."""
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind and cond.get("status") == "True":
            return dict(cond)
    return None


def terminated_state(pod: Mapping[str, Any]) -> dict[str, Any] | None:
    """The job container's ``state.terminated`` (exit code, reason, termination message)."""
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        if cs.get("name") == CONTAINER:
            state = (cs.get("state") or {}).get("terminated")
            return dict(state) if state else None
    return None


def disrupted(pod: Mapping[str, Any]) -> str | None:
    """Why the cluster took the pod away (evicted, preempted), or None."""
    status = pod.get("status") or {}
    if status.get("reason") in ("Evicted", "Preempting"):
        return str(status.get("message") or status["reason"])
    cond = condition(pod, "DisruptionTarget")
    if cond and cond.get("reason") in DISRUPTIONS:
        return str(cond.get("message") or cond["reason"])
    return None


def timestamp(text: Any) -> float | None:
    """Seconds since the epoch of an RFC 3339 time (``2026-12-01T10:00:00Z``)."""
    if not text:
        return None
    try:
        return datetime.fromisoformat(str(text).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
