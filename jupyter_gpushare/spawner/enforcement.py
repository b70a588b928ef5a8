"""How a grant becomes real: pure functions from a grant to environment or pod fragments.

Nothing here does I/O; the spawners call these and tests check them directly.

Local servers (one machine):

* ``CUDA_VISIBLE_DEVICES`` lists the granted GPU UUIDs (never simulated ones: with a
  simulated grant it is set to ``""`` where no real GPU exists, and left alone otherwise);
* where an MPS control daemon runs, ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` (per device
  ordinal, in the order of ``CUDA_VISIBLE_DEVICES``) and ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``
  make the memory limit hard (an allocation beyond it fails) and cap compute;
* framework caps: ``XLA_PYTHON_CLIENT_MEM_FRACTION`` / ``XLA_PYTHON_CLIENT_PREALLOCATE=false``
  (JAX), ``TF_FORCE_GPU_ALLOW_GROWTH=true`` (TensorFlow) and, through the ``pyhook``
  ``sitecustomize`` put on ``PYTHONPATH``, ``torch.cuda.set_per_process_memory_fraction``
  (``GPUSHARE_TORCH_MEMORY_FRACTION``) in every Python process of the server;
* the ``GPUSHARE_*`` variables tell the server extension and telemetry what was granted.

Slurm: :func:`slurm_env` is the environment of a server run as a Slurm job (Slurm sets
``CUDA_VISIBLE_DEVICES`` for the GRES; :mod:`.slurm_options` turns the grant into GRES).

Kubernetes: :func:`pod_fragment` turns a grant into resource limits, scheduler, labels,
annotations and node selector for one of the backends in :data:`KUBE_BACKENDS`, and
:func:`kube_overrides` maps that fragment onto KubeSpawner traits.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from jupyter_gpushare.broker.client import GrantInfo

__all__ = [
    "KUBE_BACKENDS",
    "PYHOOK_DIR",
    "PodFragment",
    "grant_env",
    "kube_overrides",
    "local_env",
    "mig_resource_name",
    "mps_daemon_running",
    "no_gpu_env",
    "pod_fragment",
    "slurm_env",
]

KUBE_BACKENDS = ("whole", "mig", "hami", "hami-metax", "kai", "timeslice")
"""Kubernetes enforcement backends, chosen by ``KubeGPUShareSpawner.gpu_backend``."""

PYHOOK_DIR = str(Path(__file__).with_name("pyhook"))
"""Folder with the ``sitecustomize`` that applies PyTorch's per-process memory fraction."""

HOSTNAME_LABEL = "kubernetes.io/hostname"
LABEL_PREFIX = "gpushare.jupyter.org"

TIMESLICE_WARNING = (
    "time-slicing (nvidia.com/gpu.shared) gives no memory isolation: one server can take all "
    "of a GPU's memory and make its neighbours fail; the grant's memory limit is only applied "
    "by the framework caps inside the server"
)
KAI_WARNING = (
    "KAI scheduler GPU fractions do not isolate memory: the grant's memory limit is only "
    "applied by the framework caps inside the server"
)


# --------------------------------------------------------------------------- shared


def _per_gpu_memory(grant: GrantInfo) -> int:
    return min((g.memory_mib for g in grant.gpus), default=0)


def _per_gpu_compute(grant: GrantInfo) -> float:
    return min((g.compute_pct for g in grant.gpus), default=0.0)


def _pct_text(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _is_fraction(grant: GrantInfo) -> bool:
    return len(grant.gpus) == 1 and grant.units < 1.0


def memory_fraction(
    grant: GrantInfo, gpu_total_mib: Mapping[str, int] | None = None
) -> float | None:
    """Share of each granted GPU's memory the grant may use (None when unknown or whole)."""
    fractions = []
    for g in grant.gpus:
        total = g.total_memory_mib or (gpu_total_mib or {}).get(g.uuid)
        if not total:
            return None
        fractions.append(g.memory_mib / total)
    if not fractions:
        return None
    frac = min(fractions)
    if frac >= 0.999:
        return None
    # round down to 3 decimals so the cap never exceeds the grant
    return max(math.floor(frac * 1000) / 1000, 0.001)


def _card_memory(grant: GrantInfo, gpu_total_mib: Mapping[str, int] | None) -> int | None:
    """Memory (MiB) of the smallest granted card, where the broker or policy says."""
    totals = [g.total_memory_mib or (gpu_total_mib or {}).get(g.uuid) for g in grant.gpus]
    return min(totals) if totals and all(totals) else None  # type: ignore[type-var]


def grant_env(grant: GrantInfo, *, enforcement: str, broker_url: str = "") -> dict[str, str]:
    """The ``GPUSHARE_*`` environment that tells the single-user server its grant."""
    return {
        "GPUSHARE_GRANT_ID": grant.id,
        "GPUSHARE_GPU_UUIDS": ",".join(g.uuid for g in grant.gpus),
        "GPUSHARE_MEMORY_LIMIT_MIB": str(_per_gpu_memory(grant)),
        "GPUSHARE_COMPUTE_PCT": _pct_text(_per_gpu_compute(grant)),
        "GPUSHARE_UNITS": f"{grant.units:g}",
        "GPUSHARE_PROFILE": grant.profile,
        "GPUSHARE_TEAM": grant.team,
        "GPUSHARE_POOL": grant.pool,
        "GPUSHARE_BORROWED": "true" if grant.borrowed else "false",
        "GPUSHARE_PREEMPTIBLE": "true" if grant.preemptible else "false",
        "GPUSHARE_ENFORCEMENT": enforcement,
        "GPUSHARE_SIMULATED": "1" if grant.simulated else "0",
        "GPUSHARE_BROKER_URL": broker_url,
    }


def no_gpu_env(profile_slug: str) -> dict[str, str]:
    """Environment of a server whose profile asks for no GPU: it sees none and holds no grant.

    ``NVIDIA_VISIBLE_DEVICES=void`` keeps the NVIDIA container runtime from exposing every
    GPU to an image that asks for ``all`` (the CUDA images do)."""
    return {
        "CUDA_VISIBLE_DEVICES": "",
        "NVIDIA_VISIBLE_DEVICES": "void",
        "GPUSHARE_PROFILE": profile_slug,
        "GPUSHARE_GPU": "none",
    }


def framework_env(
    grant: GrantInfo, gpu_total_mib: Mapping[str, int] | None = None
) -> dict[str, str]:
    """Memory caps that JAX, TensorFlow and PyTorch honour (no hard isolation)."""
    if not grant.gpus:
        return {}
    env = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false", "TF_FORCE_GPU_ALLOW_GROWTH": "true"}
    frac = memory_fraction(grant, gpu_total_mib)
    if frac is not None:
        env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = f"{frac:g}"
        env["GPUSHARE_TORCH_MEMORY_FRACTION"] = f"{frac:g}"
    return env


# --------------------------------------------------------------------------- local


def mps_daemon_running(pipe_dir: str | None = None) -> bool:
    """Whether an MPS control daemon listens (its ``control`` pipe exists)."""
    pipe_dir = pipe_dir or os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or "/tmp/nvidia-mps"
    return os.path.exists(os.path.join(pipe_dir, "control"))


def local_env(
    grant: GrantInfo,
    *,
    mps: bool,
    real_gpus_present: bool,
    broker_url: str = "",
    gpu_total_mib: Mapping[str, int] | None = None,
    mps_pipe_dir: str | None = None,
    inherited_pythonpath: str = "",
) -> dict[str, str]:
    """Environment for a local single-user server holding ``grant``.

    ``mps``: an MPS control daemon runs (then memory and thread limits are hard);
    ``real_gpus_present``: NVML found real GPUs on this machine.
    """
    simulated = grant.simulated
    use_mps = mps and not simulated and bool(grant.gpus)
    env = grant_env(grant, enforcement="mps" if use_mps else "env", broker_url=broker_url)
    if not grant.gpus:
        env["CUDA_VISIBLE_DEVICES"] = ""  # a CPU-only grant sees no GPU
    elif simulated:
        if not real_gpus_present:
            env["CUDA_VISIBLE_DEVICES"] = ""
        # with real GPUs present and a simulated grant, leave CUDA_VISIBLE_DEVICES alone
    else:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(g.uuid for g in grant.gpus)
    if use_mps:
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = ",".join(
            f"{i}={g.memory_mib}M" for i, g in enumerate(grant.gpus)
        )
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = _pct_text(
            max(1.0, min(100.0, _per_gpu_compute(grant)))
        )
        if mps_pipe_dir:
            env["CUDA_MPS_PIPE_DIRECTORY"] = mps_pipe_dir
    fw = framework_env(grant, gpu_total_mib)
    env.update(fw)
    card = _card_memory(grant, gpu_total_mib)
    if card:
        env["GPUSHARE_GPU_MEMORY_MIB"] = str(card)  # the whole card: the sampler's scale
    if "GPUSHARE_TORCH_MEMORY_FRACTION" in fw:
        parts = [PYHOOK_DIR] + [p for p in inherited_pythonpath.split(os.pathsep) if p]
        env["PYTHONPATH"] = os.pathsep.join(parts)
    return env


# --------------------------------------------------------------------------- slurm


def slurm_env(
    grant: GrantInfo,
    *,
    gres: str,
    broker_url: str = "",
    gpu_total_mib: Mapping[str, int] | None = None,
    inherited_pythonpath: str = "",
) -> dict[str, str]:
    """Environment for a single-user server run as a Slurm job holding ``grant``.

    Slurm itself sets ``CUDA_VISIBLE_DEVICES`` for the job's GRES (the device it
    allocated, as an index in the job's view), so it is not set here; ``gres`` (e.g.
    ``shard:2``) is what was asked for. Shards only count: memory is capped by the
    framework caps, as with the ``env`` enforcement of local servers.
    """
    kind = "slurm-shard" if gres.startswith("shard:") else "slurm-gpu"
    env = grant_env(grant, enforcement=kind, broker_url=broker_url)
    env["GPUSHARE_SLURM_GRES"] = gres
    fw = framework_env(grant, gpu_total_mib) if _is_fraction(grant) else {}
    env.update(fw)
    card = _card_memory(grant, gpu_total_mib)
    if card:
        env["GPUSHARE_GPU_MEMORY_MIB"] = str(card)
    if "GPUSHARE_TORCH_MEMORY_FRACTION" in fw:
        parts = [PYHOOK_DIR] + [p for p in inherited_pythonpath.split(os.pathsep) if p]
        env["PYTHONPATH"] = os.pathsep.join(parts)
    return env


# --------------------------------------------------------------------------- kubernetes


@dataclass
class PodFragment:
    """What a grant adds to a single-user pod."""

    limits: dict[str, str] = field(default_factory=dict)
    scheduler_name: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    node_selector: dict[str, str] = field(default_factory=dict)
    priority_class_name: str = ""
    env: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


_MIG_RE = re.compile(r"(\d+g\.\d+gb)", re.IGNORECASE)
_LABEL_BAD = re.compile(r"[^A-Za-z0-9_.-]")


def label_value(text: str) -> str:
    """A valid Kubernetes label value made from ``text``."""
    value = _LABEL_BAD.sub("-", text)[:63]
    return value.strip("-_.")


def mig_resource_name(grant: GrantInfo, mig_profile: str | None = None) -> str:
    """``nvidia.com/mig-<profile>`` (mixed strategy) for a grant of MIG devices."""
    profile = mig_profile
    if not profile:
        for g in grant.gpus:
            m = _MIG_RE.search(g.model)
            if m:
                profile = m.group(1).lower()
                break
    if not profile:
        raise ValueError(
            f"grant {grant.id}: cannot tell the MIG profile from GPU model "
            f"{[g.model for g in grant.gpus]!r}; name the models like 'H100 1g.10gb' "
            "or set KubeGPUShareSpawner.mig_profile"
        )
    return f"nvidia.com/mig-{profile}"


def pod_fragment(
    grant: GrantInfo,
    backend: str,
    *,
    broker_url: str = "",
    pin: bool = True,
    kai_queue: str | None = None,
    kai_priority_class: str = "build",
    mig_profile: str | None = None,
    gpu_total_mib: Mapping[str, int] | None = None,
) -> PodFragment:
    """The pod fragment that enforces ``grant`` with ``backend`` (see :data:`KUBE_BACKENDS`).

    ``pin``: put the pod on the grant's node (and, with HAMi, on its GPUs); simulated
    grants are never pinned, since their node and GPUs do not exist.
    """
    if backend not in KUBE_BACKENDS:
        raise ValueError(f"unknown GPU backend {backend!r}; expected one of {KUBE_BACKENDS}")
    frag = PodFragment()
    frag.env = grant_env(grant, enforcement=backend, broker_url=broker_url)
    frag.labels = {
        f"{LABEL_PREFIX}/team": label_value(grant.team),
        f"{LABEL_PREFIX}/pool": label_value(grant.pool),
        f"{LABEL_PREFIX}/borrowed": "true" if grant.borrowed else "false",
    }
    frag.annotations = {
        f"{LABEL_PREFIX}/grant-id": grant.id,
        f"{LABEL_PREFIX}/profile": grant.profile,
        f"{LABEL_PREFIX}/units": f"{grant.units:g}",
    }
    count = len(grant.gpus)
    if count == 0:
        # a CPU-only grant: no GPU resource, no GPU visible
        frag.env["NVIDIA_VISIBLE_DEVICES"] = "void"
        return frag
    pin_here = pin and not grant.simulated
    if pin_here and grant.node:
        frag.node_selector[HOSTNAME_LABEL] = grant.node
    fraction = _is_fraction(grant)
    if fraction:
        frag.env.update(framework_env(grant, gpu_total_mib))

    if backend == "whole":
        if fraction:
            frag.warnings.append(
                f"grant {grant.id} is a fraction ({grant.units:g} GPU) but the 'whole' backend "
                "can only give whole GPUs: the pod gets one whole GPU"
            )
        frag.limits["nvidia.com/gpu"] = str(count)
    elif backend == "mig":
        frag.limits[mig_resource_name(grant, mig_profile)] = str(count)
    elif backend == "hami":
        frag.scheduler_name = "hami-scheduler"
        frag.limits["nvidia.com/gpu"] = str(count)
        frag.limits["nvidia.com/gpumem"] = str(_per_gpu_memory(grant))
        frag.limits["nvidia.com/gpucores"] = str(
            max(1, min(100, int(round(_per_gpu_compute(grant)))))
        )
        if pin_here:
            frag.annotations["nvidia.com/use-gpuuuid"] = ",".join(g.uuid for g in grant.gpus)
    elif backend == "hami-metax":
        _hami_metax(frag, grant, count, fraction, pin_here)
    elif backend == "kai":
        frag.scheduler_name = "kai-scheduler"
        frag.labels["kai.scheduler/queue"] = label_value(kai_queue or grant.team)
        # notebooks must not be preempted by KAI: its default class (train) is preemptible
        frag.labels["priorityClassName"] = kai_priority_class
        frag.priority_class_name = kai_priority_class
        if fraction:
            explicit_memory = _explicit_memory(grant, gpu_total_mib)
            if explicit_memory:
                frag.annotations["gpu-memory"] = str(_per_gpu_memory(grant))
            else:
                frag.annotations["gpu-fraction"] = f"{max(round(grant.units, 3), 0.01):g}"
            frag.warnings.append(KAI_WARNING)
        else:
            frag.limits["nvidia.com/gpu"] = str(count)
    elif backend == "timeslice":
        frag.limits["nvidia.com/gpu.shared"] = str(count)
        frag.warnings.append(TIMESLICE_WARNING)
    return frag


METAX_COUNT = "metax-tech.com/sgpu"
METAX_CORES = "metax-tech.com/vcore"
METAX_MEMORY = "metax-tech.com/vmemory"
METAX_PIN = "metax-tech.com/use-gpuuuid"


def _hami_metax(frag: PodFragment, grant: GrantInfo, count: int, fraction: bool,
                pin: bool) -> None:
    """MetaX sGPUs through HAMi (its docs/metax-support.md and pkg/device/metax).

    ``vcore`` is a percentage of the card, 100 asking for the card exclusively; ``vmemory``
    is written with its unit (``Mi``), since HAMi reads a bare number as GiB; a whole card
    leaves ``vmemory`` out, which HAMi reads as all of the card's memory.
    """
    frag.scheduler_name = "hami-scheduler"
    frag.limits[METAX_COUNT] = str(count)
    if fraction:
        # 100 would ask HAMi for the whole card; a fraction never does
        frag.limits[METAX_CORES] = str(max(1, min(99, int(round(_per_gpu_compute(grant))))))
        frag.limits[METAX_MEMORY] = f"{_per_gpu_memory(grant)}Mi"
    else:
        frag.limits[METAX_CORES] = "100"
    if pin:
        frag.annotations[METAX_PIN] = ",".join(g.uuid for g in grant.gpus)


def _explicit_memory(grant: GrantInfo, gpu_total_mib: Mapping[str, int] | None) -> bool:
    """Whether the grant's memory share differs from its compute share (a memory ask)."""
    g = grant.gpus[0]
    total = g.total_memory_mib or (gpu_total_mib or {}).get(g.uuid)
    if not total:
        return False
    return abs(g.memory_mib / total - g.compute_pct / 100) > 0.005


def kube_overrides(frag: PodFragment, current: Mapping[str, object]) -> dict[str, object]:
    """KubeSpawner trait values that apply ``frag``, merged into the ``current`` values.

    ``current`` maps trait names (``extra_resource_limits``, ``extra_labels``,
    ``extra_annotations``, ``node_selector``, ``environment``, ``scheduler_name``,
    ``priority_class_name``) to the spawner's configured values.
    """

    def merged(name: str, extra: Mapping[str, str]) -> dict[str, object]:
        base = dict(current.get(name) or {})  # type: ignore[call-overload]
        base.update(extra)
        return base

    out: dict[str, object] = {
        "extra_resource_limits": merged("extra_resource_limits", frag.limits),
        "extra_labels": merged("extra_labels", frag.labels),
        "extra_annotations": merged("extra_annotations", frag.annotations),
        "node_selector": merged("node_selector", frag.node_selector),
        "environment": merged("environment", frag.env),
    }
    if frag.scheduler_name:
        out["scheduler_name"] = frag.scheduler_name
    if frag.priority_class_name:
        out["priority_class_name"] = frag.priority_class_name
    return out
