"""Inventory discovery: turn ``inventory.source: nvml | kubernetes`` into nodes.

The policy loader stays free of I/O; it hands a :class:`~jupyter_gpushare.policy.DiscoverySpec`
to :func:`discover`. :func:`load_policy` here is the policy loader with it: what the broker,
the spawner and the commands use to read a policy file whose inventory may be discovered.

* ``nvml``: the GPUs of this machine, read through NVML (``pynvml``) once at load time.
  Options: ``pool`` (required), ``node`` (default: the host name), ``cpu``/``memory``
  (default: what this machine has).
* ``kubernetes``: GPU nodes from the Kubernetes API, read once at load time. Options:
  ``pool_label`` (default ``gpushare.jupyter.org/pool``: the node label naming its pool),
  ``default_pool`` (for GPU nodes without that label; otherwise they are skipped),
  ``label_selector``. GPU model, memory and count come from NVIDIA GPU Feature Discovery's
  labels (``nvidia.com/gpu.product``, ``nvidia.com/gpu.memory`` in MiB,
  ``nvidia.com/gpu.count``), falling back to ``status.allocatable["nvidia.com/gpu"]``.

:func:`nodes_from_kubernetes` is the pure translation (tested against node objects that
pass the published Kubernetes schema); :func:`fetch_kubernetes_nodes` is the thin I/O.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Coroutine, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from .core.model import GPU, Node, Policy
from .policy.inventory import DiscoverySpec
from .policy.loader import load_policy as load_policy_with
from .policy_units import parse_cpu_milli, parse_memory_mib

POOL_LABEL = "gpushare.jupyter.org/pool"
T = TypeVar("T")


class DiscoveryError(RuntimeError):
    """Discovery could not produce an inventory; the message says why and where."""


def discover(spec: DiscoverySpec) -> tuple[Node, ...]:
    """Nodes for ``spec`` (``nvml`` or ``kubernetes``)."""
    if spec.source == "nvml":
        return nvml_nodes(spec)
    if spec.source == "kubernetes":
        return nodes_from_kubernetes(fetch_kubernetes_nodes(spec.options), spec.options)
    raise DiscoveryError(f"{spec.file}:{spec.line}: unknown inventory source {spec.source!r}")


def load_policy(path: str | Path) -> Policy:
    """Load a policy file, discovering its inventory when it says ``source: nvml`` or
    ``kubernetes``; raises :class:`~jupyter_gpushare.policy.PolicyError` listing every error (a
    failed discovery names the file and line of ``inventory.source``)."""
    return load_policy_with(path, discover)


# -- NVML ---------------------------------------------------------------------------------


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def nvml_gpus() -> list[GPU]:
    """The GPUs NVML sees on this machine; raises :class:`DiscoveryError` if NVML cannot start."""
    try:
        import pynvml
    except ImportError as exc:  # pragma: no cover - nvidia-ml-py is a dependency
        raise DiscoveryError("nvidia-ml-py (pynvml) is not installed") from exc
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise DiscoveryError(f"NVML found no GPU driver on this machine: {exc}") from exc
    try:
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle).total // (1024 * 1024)
            gpus.append(
                GPU(
                    uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
                    model=_text(pynvml.nvmlDeviceGetName(handle)),
                    memory_mib=int(memory),
                    index=index,
                    vendor="nvidia",
                )
            )
        return gpus
    finally:
        pynvml.nvmlShutdown()


def _machine_memory_mib() -> int:
    import psutil

    return int(psutil.virtual_memory().total // (1024 * 1024))


def nvml_nodes(spec: DiscoverySpec) -> tuple[Node, ...]:
    """This machine as one node of ``options.pool``, with the GPUs NVML reports."""
    options = spec.options
    pool = options.get("pool")
    if not pool:
        raise DiscoveryError(f"{spec.file}:{spec.line}: inventory.discovery.pool is required")
    gpus = nvml_gpus()
    if not gpus:
        raise DiscoveryError(f"{spec.file}:{spec.line}: NVML reports no GPU on this machine")
    cpu = parse_cpu_milli(options["cpu"]) if "cpu" in options else (os.cpu_count() or 1) * 1000
    memory = parse_memory_mib(options["memory"]) if "memory" in options else _machine_memory_mib()
    name = str(options.get("node") or socket.gethostname())
    return (Node(name, str(pool), tuple(gpus), cpu, memory),)


# -- Kubernetes ---------------------------------------------------------------------------


def _gpu_count(labels: Mapping[str, str], allocatable: Mapping[str, str]) -> int:
    for value in (labels.get("nvidia.com/gpu.count"), allocatable.get("nvidia.com/gpu")):
        if value is not None and str(value).isdigit():
            return int(value)
    return 0


def _kube_memory_mib(quantity: str) -> int:
    """A Kubernetes memory quantity (a plain number is bytes there) in MiB."""
    if quantity.isdigit():
        return int(quantity) // (1024 * 1024)
    return parse_memory_mib(quantity)


def nodes_from_kubernetes(
    items: Iterable[Mapping[str, Any]], options: Mapping[str, Any]
) -> tuple[Node, ...]:
    """Translate Kubernetes ``Node`` objects (as dicts) into inventory nodes.

    A node counts when it has GPUs and a pool (its pool label, or ``default_pool``);
    unschedulable (cordoned) nodes are kept out.
    """
    pool_label = str(options.get("pool_label") or POOL_LABEL)
    default_pool = options.get("default_pool")
    nodes = []
    for item in items:
        meta = item.get("metadata", {})
        labels: Mapping[str, str] = meta.get("labels") or {}
        status = item.get("status", {})
        allocatable: Mapping[str, str] = status.get("allocatable") or {}
        pool = labels.get(pool_label) or default_pool
        count = _gpu_count(labels, allocatable)
        if not pool or not count or item.get("spec", {}).get("unschedulable"):
            continue
        name = meta["name"]
        model = labels.get("nvidia.com/gpu.product", "unknown")
        gpu_memory = int(labels.get("nvidia.com/gpu.memory", "0") or 0)
        gpus = tuple(GPU(f"GPU-{name}-{i}", model, gpu_memory, i) for i in range(count))
        nodes.append(
            Node(
                name=name,
                pool=str(pool),
                gpus=gpus,
                cpu_milli=parse_cpu_milli(str(allocatable.get("cpu", "0"))),
                memory_mib=_kube_memory_mib(str(allocatable.get("memory", "0"))),
                labels=tuple(sorted(labels.items())),
            )
        )
    return tuple(nodes)


def fetch_kubernetes_nodes(options: Mapping[str, Any]) -> list[dict[str, Any]]:  # pragma: no cover
    """Read the cluster's nodes (in-cluster config, else ``KUBECONFIG``). Not run in tests:
    no Kubernetes API server can run on the project's machines."""

    from kubernetes_asyncio import client, config

    async def read() -> list[dict[str, Any]]:
        try:
            config.load_incluster_config()
        except config.ConfigException:
            await config.load_kube_config()
        async with client.ApiClient() as api:
            nodes = await client.CoreV1Api(api).list_node(
                label_selector=options.get("label_selector") or ""
            )
            return [api.sanitize_for_serialization(n) for n in nodes.items]

    try:
        return _run_to_completion(read)
    except Exception as exc:
        raise DiscoveryError(f"could not list Kubernetes nodes: {exc}") from exc


def _run_to_completion(make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run a coroutine to its end from sync code, also when called inside a running loop
    (the spawner runs in the hub's loop): then it gets a thread and a loop of its own."""
    import asyncio

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(make())
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(lambda: asyncio.run(make())).result()
