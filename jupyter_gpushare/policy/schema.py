"""The schema of every section of the policy file, as data.

One definition serves two readers: the loader (:mod:`.fields` checks each mapping's keys,
converts each value with the :class:`Value` named here and reports what it expected), and
:func:`json_schema`, which turns the same tree into a JSON Schema for editors
(``jupyter-gpushare policy-schema``). A :class:`Value` pairs a converter (raw YAML value ->
core units, raising :class:`~jupyter_gpushare.policy_units.UnitError`) with the JSON Schema
of what it accepts. Rules that need more than one value (references between sections, fit
on the hardware) are not expressible here; :mod:`.crossref` and the section readers check
them.

The parts live next to this module: :mod:`.schema_value` (the :class:`Value` type and its
converters), :mod:`.schema_scalars` (every kind of scalar value), :mod:`.schema_shapes` (sections,
keys, maps, lists) and :mod:`.schema_json` (the tree as JSON Schema); here are the sections of
the policy file.
"""

from __future__ import annotations

from typing import Any

from .bounds import MAX_GPUS_PER_NODE
from .kube_override import EXPECTED as _OVERRIDE_EXPECTED
from .kube_override import OVERRIDE_SCHEMA, kubespawner_override
from .schema_json import _section_schema
from .schema_scalars import (
    BOOL,
    CPU,
    CPU_PATTERN,
    DESCRIPTION,
    DEVICE_SHARE,
    DISCOVERED_SOURCES,
    DURATION,
    DURATION_PATTERN,
    FRACTION,
    GPU_COUNT,
    GPU_HOURS,
    GPUS_PER_NODE,
    GRACE,
    HEADROOM,
    IMAGE,
    INVENTORY_SOURCES,
    LABELS,
    MEMORY,
    MEMORY_PATTERN,
    MODE,
    NAMES,
    NODE_COUNT,
    NODE_NAME,
    OPTIONS,
    POSITIVE_DURATION,
    POSITIVE_UNITS,
    PRIORITY_VALUE,
    RATIO_PATTERN,
    SHARDS,
    SLUG_VALUE,
    SLURM_NAME,
    SOURCE,
    TEXT,
    UNITS,
    VENDOR,
)
from .schema_shapes import Either, Key, ListOf, MapOf, Section, Shape, _k
from .schema_value import MAX_HEADROOM, Value

__all__ = [
    "CPU_PATTERN",
    "DISCOVERED_SOURCES",
    "DURATION_PATTERN",
    "GPUS",
    "GPU_ASK",
    "INVENTORY_SOURCES",
    "MAX_HEADROOM",
    "MEMORY_PATTERN",
    "NODE",
    "POLICY",
    "PROFILE",
    "RATIO_PATTERN",
    "SIMULATED",
    "SLURM",
    "Either",
    "Key",
    "ListOf",
    "MapOf",
    "Section",
    "Shape",
    "Value",
    "json_schema",
]

SCHEMA_ID = "urn:jupyter-gpushare:policy"


GPUS = Section(
    "GPUs of a node",
    (
        _k("model", TEXT, "GPU model, e.g. H100", required=True),
        _k("memory", MEMORY, "memory of one GPU, e.g. 80GiB", required=True),
        _k("count", GPU_COUNT, "how many such GPUs", default=1),
        _k("units", DEVICE_SHARE, "share of a card each device is (MIG: 1/7)", default=1),
        _k("uuids", NAMES, "the real GPU uuids, one per GPU"),
        _k("vendor", VENDOR, "who makes the card: nvidia, amd, metax, ... (shown with the model)"),
    ),
)
NODE = Section(
    "A node",
    (
        _k("name", NODE_NAME, "node name (its host name)", required=True),
        _k("pool", TEXT, "the pool it belongs to", required=True),
        _k("cpu", CPU, "CPU cores", required=True),
        _k("memory", MEMORY, "RAM", required=True),
        _k("labels", LABELS, "node labels"),
        _k("gpus", ListOf(GPUS), "its GPUs"),
    ),
)
SIMULATED = Section(
    "A group of identical simulated nodes",
    (
        _k("pool", TEXT, "the pool", required=True),
        _k("nodes", NODE_COUNT, "how many nodes", default=1),
        _k("gpus_per_node", GPUS_PER_NODE, "GPUs per node", default=8),
        _k("model", TEXT, "GPU model", default="Simulated GPU"),
        _k("gpu_memory", MEMORY, "memory of one GPU", default="80GiB"),
        _k("cpu", CPU, "CPU cores per node", default=32),
        _k("memory", MEMORY, "RAM per node", default="256GiB"),
        _k("name", NODE_NAME, "node name prefix (default sim-<pool>)"),
        _k("labels", LABELS, "node labels"),
    ),
)
INVENTORY = Section(
    "Which machines and GPUs there are",
    (
        _k("source", SOURCE, "static, simulated, nvml or kubernetes"),
        _k("nodes", ListOf(NODE), "the nodes (static or simulated)"),
        _k("simulated", Either((SIMULATED, ListOf(SIMULATED))), "generated simulated nodes"),
        _k("discovery", OPTIONS, "options for nvml / kubernetes discovery"),
    ),
)
POOL = Section(
    "A pool of nodes with one sharing mode",
    (
        _k("mode", MODE, "exclusive, shared, mig or debug", required=True),
        _k("memory_headroom", HEADROOM, "share of each GPU's memory kept free", default="20%"),
        _k("description", DESCRIPTION, "shown to users"),
    ),
)
PRIORITY_CLASS = Section(
    "A priority class",
    (
        _k("value", PRIORITY_VALUE, "higher wins", required=True),
        _k("preemptible", BOOL, "may be stopped for higher-priority work", default=False),
        _k("grace_period", GRACE, "time between the stop signal and the kill", default="30s"),
        _k(
            "checkpoint_required_after",
            DURATION,
            "longer preemptible jobs must declare checkpointing",
        ),
        _k("description", DESCRIPTION, "shown to users"),
    ),
)
QUOTA = Section(
    "A team's quota in one pool, in GPU units",
    (
        _k("guaranteed", UNITS, "never taken away from the team", required=True),
        _k("borrow_limit", UNITS, "how far above the guarantee it may borrow", default=0),
        _k("gpu_hours_per_month", GPU_HOURS, "budget of GPU-hours per month"),
        _k("per_user_cap", POSITIVE_UNITS, "most GPU units one member may hold"),
        _k(
            "explicit_requests",
            BOOL,
            "members may send explicit GPU asks (no profile) here",
            default=False,
        ),
    ),
)
TEAM = Section(
    "A team: JupyterHub groups that share quotas",
    (
        _k("groups", NAMES, "JupyterHub groups of its members (default: the team's name)"),
        _k("admins", NAMES, "users who see the team's usage"),
        _k("quotas", MapOf(QUOTA), "quota per pool"),
        _k("priorities", NAMES, "priority classes members may use (default: every class)"),
        _k("description", DESCRIPTION, "shown to users"),
    ),
)
GPU_ASK = Section(
    "A GPU request",
    (
        _k("count", GPU_COUNT, "whole GPUs (not with the others)"),
        _k("fraction", FRACTION, "share of one GPU's memory and compute"),
        _k("memory", MEMORY, "peak GPU memory"),
        _k("compute", DEVICE_SHARE, "share of one GPU's compute"),
    ),
)
GPU_SHORTHAND = Value(
    lambda v: v,
    {
        "anyOf": [
            {"type": "integer", "minimum": 0, "maximum": MAX_GPUS_PER_NODE},
            {"enum": ["none"]},
            {"type": "string", "pattern": RATIO_PATTERN},
        ]
    },
    "a number of GPUs, a fraction such as 1/4, or none",
)
PROFILE = Section(
    "A server profile users pick",
    (
        _k("slug", SLUG_VALUE, "identifier, e.g. train-1gpu", required=True),
        _k("display_name", TEXT, "shown in the form (default: the slug)"),
        _k("description", DESCRIPTION, "shown in the form"),
        _k("pool", TEXT, "the pool (required with a GPU)"),
        _k("gpu", Either((GPU_SHORTHAND, GPU_ASK)), "leave out for CPU only"),
        _k("cpu", CPU, "CPU cores", default=1),
        _k("memory", MEMORY, "RAM", default="2GiB"),
        _k("image", IMAGE, "container image (Kubernetes)"),
        _k("priority", TEXT, "its priority class (default: interactive)"),
        _k("priorities", NAMES, "further classes a user may choose for it"),
        _k("max_lifetime", POSITIVE_DURATION, "the server is stopped after this long"),
        _k("teams", NAMES, "teams that may use it (default: every team)"),
        _k("gpu_models", NAMES, "GPU models it may land on (default: any)"),
        _k(
            "kubespawner_override",
            Value(kubespawner_override, OVERRIDE_SCHEMA, _OVERRIDE_EXPECTED),
            "KubeSpawner traits for this profile on Kubernetes (volumes, tolerations, ...; never "
            "GPU: the grant sets that)",
        ),
    ),
)
SLURM = Section(
    "How grants become Slurm requests (batch jobs and servers on Slurm)",
    (
        _k(
            "shards_per_gpu",
            SHARDS,
            "GRES shards per GPU: a fraction f of a GPU is asked "
            "as shard:K with K = f x shards_per_gpu (at least 1); the Slurm export writes the same "
            "count into gres.conf",
            default=8,
        ),
        _k(
            "partition",
            SLURM_NAME,
            "the Slurm partition for jobs and servers (default: the cluster's default partition)",
        ),
    ),
)
POLICY = Section(
    "jupyter-gpushare policy",
    (
        _k("inventory", INVENTORY, required=True),
        _k("pools", MapOf(POOL), "pools by name", required=True),
        _k("priority_classes", MapOf(PRIORITY_CLASS), "priority classes by name", required=True),
        _k("teams", MapOf(TEAM), "teams by name"),
        _k("default_team", TEXT, "team of users in no team's groups"),
        _k("profiles", ListOf(PROFILE), "what users pick when starting a server"),
        _k("slurm", SLURM, "Slurm settings, for the Slurm batch backend, spawner and export"),
    ),
    "Who may use which GPUs, how much, and how. Check with: jupyter-gpushare check-policy FILE",
)


def json_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of the policy file, from the loader's definitions."""
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        **_section_schema(POLICY),
    }
