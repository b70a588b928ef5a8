"""Run specs, grant views and Kueue CRD schemas for the Kubernetes batch backend tests.

The Kueue CRDs under ``tests/data/kueue`` are Kueue's own (see its README); an object is
checked against the ``openAPIV3Schema`` of the version it names, made strict the way an
API server with strict field validation (kubectl's default) treats unknown fields.
"""

from __future__ import annotations

import copy
import functools
import re
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from jupyter_gpushare.backends.base import RunSpec

KUEUE_DATA = Path(__file__).parent / "data" / "kueue"
KUEUE_KINDS = {
    "ClusterQueue": "clusterqueues",
    "LocalQueue": "localqueues",
    "ResourceFlavor": "resourceflavors",
    "WorkloadPriorityClass": "workloadpriorityclasses",
    "Cohort": "cohorts",
}
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")

NOTEBOOK = {
    "cells": [
        {"cell_type": "code", "metadata": {"tags": ["parameters"]}, "outputs": [],
         "execution_count": None, "source": "n = 1"},
        {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
         "source": "print('answer', n * 6)"},
    ],
    "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                "language": "python"}},
    "nbformat": 4,
    "nbformat_minor": 5,
}


def gpu(uuid: str, memory_mib: int, compute_pct: float, model: str = "H200") -> dict[str, Any]:
    return {"uuid": uuid, "memory_mib": memory_mib, "compute_pct": compute_pct, "model": model,
            "simulated": False}


def grant_view(kind: str = "whole", **over: Any) -> dict[str, Any]:
    """A grant's JSON view (as ``Broker.grant_view`` writes it) of one of these kinds:
    whole (2 GPUs), fraction (1/4 of an H200), memory (16 GiB at 10 %), mig (one 1g.18gb),
    cpu (no GPU)."""
    gpus = {
        "whole": [gpu("GPU-a", 144384, 100), gpu("GPU-b", 144384, 100)],
        "fraction": [gpu("GPU-c", 36096, 25)],
        "memory": [gpu("GPU-c", 16384, 10)],
        "mig": [gpu("MIG-1", 18432, 100, model="H200 1g.18gb")],
        "cpu": [],
    }[kind]
    units = {"whole": 2, "fraction": 0.25, "memory": 0.114, "mig": 0.142, "cpu": 0}[kind]
    view = {
        "id": "g-1", "request_id": "r-1", "user": "Ada.Lovelace@example.org",
        "server": "job-0123456789abcdef0123", "team": "vision", "pool": "train",
        "profile": "train-1gpu", "kind": "batch", "node": "gpu-node-1", "gpus": gpus,
        "units": units, "borrowed": False, "preemptible": True, "priority": "research",
        "priority_value": 100, "cpu_milli": 4000, "memory_mib": 16384,
        "grace_period_s": 120,
    }
    view.update(over)
    return view


def run_spec(kind: str = "whole", attempt: int = 1, **over: Any) -> RunSpec:
    grant = grant_view(kind, **over.pop("grant", {}))
    fields: dict[str, Any] = {
        "job_id": "job-0123456789abcdef0123", "attempt": attempt,
        "user": "Ada.Lovelace@example.org", "notebook": NOTEBOOK,
        "parameters": {"n": 7}, "output_path": "/home/ada/runs/out.ipynb",
        "cwd": "/home/ada/runs", "env": {"PATH": "/usr/bin"}, "max_runtime_s": 3600,
        "kernel_name": "python3", "name": "train.ipynb", "grant": grant,
    }
    fields.update(over)
    return RunSpec(**fields)


def _strict(schema: Any) -> Any:
    """Unknown fields are errors (as with ``kubectl apply``'s strict field validation)."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if ("properties" in out and "additionalProperties" not in out
                and not out.get("x-kubernetes-preserve-unknown-fields")):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


@functools.cache
def crd_schema(kind: str, version: str) -> dict[str, Any]:
    crd = yaml.safe_load((KUEUE_DATA / f"kueue.x-k8s.io_{KUEUE_KINDS[kind]}.yaml").read_text())
    assert crd["spec"]["names"]["kind"] == kind
    for v in crd["spec"]["versions"]:
        if v["name"] == version:
            assert v["served"], f"{kind} {version} is not served"
            return _strict(copy.deepcopy(v["schema"]["openAPIV3Schema"]))
    raise AssertionError(f"the {kind} CRD has no version {version}")


def _cel_rules(obj: dict[str, Any]) -> list[str]:
    """The CRDs' ``x-kubernetes-validations`` (CEL) that matter for what we write,
    checked by hand (jsonschema does not run CEL)."""
    errors = []
    spec = obj.get("spec") or {}
    groups = spec.get("resourceGroups") or []
    for group in groups:  # ClusterQueue and Cohort
        for flavor in group["flavors"]:
            if len(flavor["resources"]) != len(group["coveredResources"]):
                errors.append(f"flavor {flavor['name']}: flavors must have the same number of "
                              "resources as the coveredResources")
            if [r["name"] for r in flavor["resources"]] != group["coveredResources"]:
                errors.append(f"flavor {flavor['name']}: resources not in the order of "
                              "coveredResources")
    if obj["kind"] == "ClusterQueue":
        if not spec.get("cohortName") and any(
            "borrowingLimit" in r for g in groups for f in g["flavors"] for r in f["resources"]
        ):
            errors.append("borrowingLimit must be nil when cohort is empty")
        pre = spec.get("preemption") or {}
        if (pre.get("reclaimWithinCohort", "Never") == "Never"
                and (pre.get("borrowWithinCohort") or {}).get("policy", "Never") != "Never"):
            errors.append("reclaimWithinCohort=Never and borrowWithinCohort.Policy!=Never")
    return errors


def validate_kueue(obj: dict[str, Any]) -> None:
    """Raise if ``obj`` does not fit the Kueue CRD schema of its kind and version."""
    group, _, version = obj["apiVersion"].partition("/")
    assert group == "kueue.x-k8s.io", obj["apiVersion"]
    jsonschema.validate(obj, crd_schema(obj["kind"], version))
    name = obj["metadata"]["name"]
    assert DNS_SUBDOMAIN.match(name) and len(name) <= 253, f"bad object name {name!r}"
    errors = _cel_rules(obj)
    assert not errors, errors
