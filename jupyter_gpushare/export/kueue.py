"""``jupyter-gpushare export kueue POLICY``: the policy as Kueue objects (pure).

From one policy it writes, as a multi-document YAML stream for ``kubectl apply -f -``
(``kueue.x-k8s.io/v1beta2``, what Kueue 0.19 serves and stores):

* one **Cohort** (``gpushare``) holding the capacity no team is guaranteed (a pool's GPUs
  minus the sum of its guarantees), so teams may borrow it as the broker lets them;
* one **ResourceFlavor** per pool and GPU model (or MIG profile), selecting the pool's nodes
  by ``gpushare.jupyter.org/pool`` (and ``nvidia.com/gpu.product`` where the models are
  the GPU Feature Discovery's, i.e. a ``kubernetes`` inventory, or ``--product-label``);
* one **ClusterQueue** per team in the cohort: ``nominalQuota`` = the team's guarantee and
  ``borrowingLimit`` = its borrow limit, per pool, in the resource(s) of the enforcement
  backend (:func:`per_unit`); CPU and memory in proportion to the pool's GPUs, since Kueue
  admits no workload that asks for a resource its queue does not cover;
* one **LocalQueue** per team in the jobs' namespace (the Jobs' ``kueue.x-k8s.io/queue-name``);
* one **WorkloadPriorityClass** per priority class.

Preemption (the policy's rules, as far as Kueue can say them; see docs/engines/kubernetes.md):
``reclaimWithinCohort: Any`` (borrowed capacity is preemptible whatever its priority: a team
gets its guarantee back from the teams above theirs), ``withinClusterQueue: LowerPriority``
(inside a team, higher priority preempts lower), ``borrowWithinCohort: Never`` (a borrower
never preempts). A non-preemptible class gets the top value, shared by every non-preemptible
class, so that Kueue never chooses one as a victim of another team member's work (it only
preempts strictly lower values). Interactive servers are not Kueue workloads at all (their
pods carry no queue label), so Kueue never preempts one.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import yaml

from ..backends.kube_names import (
    POOL_LABEL,
    cluster_queue_name,
    dns_label,
    flavor_name,
    local_queue_name,
    priority_class_name,
)
from ..core.model import UNIT, Node, Policy, SharingMode
from ..policy.issues import one_line
from .command import Exporter, exporter

API = "kueue.x-k8s.io/v1beta2"
ENFORCEMENTS = ("whole", "mig", "hami", "hami-metax", "kai", "timeslice")
PRODUCT_LABEL = "nvidia.com/gpu.product"


@dataclass(frozen=True)
class KueueOptions:
    """How the policy maps onto the cluster (the command's options)."""

    namespace: str = "jupyterhub"
    cohort: str = "gpushare"
    enforcement: str = "whole"
    pool_enforcement: Mapping[str, str] = field(default_factory=dict)
    gpu_resource: str = "nvidia.com/gpu"  # whole GPUs (whole, kai)
    hami_split_count: int = 10  # HAMi's deviceSplitCount: vGPUs per card
    timeslice_replicas: int = 4  # the device plugin's time-slicing replicas per GPU
    pool_label: str = POOL_LABEL
    product_label: str | None = None  # None: only with a kubernetes inventory
    cover_cpu_memory: bool = True


@dataclass(frozen=True)
class Flavor:
    """The GPUs of one model (or MIG profile) in one pool."""

    pool: str
    model: str
    units_milli: int  # GPU units of this flavor in the pool
    memory_mib: int  # memory of one card (a MIG device: of the device)
    device_milli: int  # units of one device (1000 = a whole card)
    cpu_milli: int  # the CPUs of the pool's nodes, in proportion to this flavor's GPUs
    node_memory_mib: int

    @property
    def name(self) -> str:
        return flavor_name(self.pool, self.model)


def enforcement_of(pool: str, mode: SharingMode, opts: KueueOptions) -> str:
    """A pool's enforcement: the per-pool option, ``mig`` for a MIG pool, else the default."""
    found = opts.pool_enforcement.get(pool)
    if found is None:
        found = "mig" if mode is SharingMode.MIG else opts.enforcement
    if found not in ENFORCEMENTS:
        raise ValueError(f"pool {pool}: unknown enforcement {found!r}; expected one of "
                         f"{', '.join(ENFORCEMENTS)}")
    return found


def mig_profile(model: str) -> str:
    from ..spawner.enforcement import _MIG_RE

    m = _MIG_RE.search(model)
    if not m:
        raise ValueError(f"GPU model {model!r} names no MIG profile (e.g. 'H100 1g.10gb')")
    return m.group(1).lower()


def per_unit(flavor: Flavor, enforcement: str, opts: KueueOptions) -> dict[str, Fraction]:
    """How much of each Kubernetes resource one GPU unit of ``flavor`` is."""
    if enforcement in ("whole", "kai"):  # KAI's fractions are annotations: not counted
        return {opts.gpu_resource: Fraction(1)}
    if enforcement == "timeslice":
        return {"nvidia.com/gpu.shared": Fraction(opts.timeslice_replicas)}
    if enforcement == "hami":
        return {"nvidia.com/gpu": Fraction(opts.hami_split_count),
                "nvidia.com/gpumem": Fraction(flavor.memory_mib),
                "nvidia.com/gpucores": Fraction(100)}
    if enforcement == "hami-metax":
        return {"metax-tech.com/sgpu": Fraction(opts.hami_split_count),
                "metax-tech.com/vcore": Fraction(100),
                "metax-tech.com/vmemory": Fraction(flavor.memory_mib)}
    # mig: devices of this profile
    return {f"nvidia.com/mig-{mig_profile(flavor.model)}": Fraction(UNIT, flavor.device_milli)}


def flavors(policy: Policy) -> list[Flavor]:
    """Every (pool, model) with GPUs, in policy order."""
    out: dict[tuple[str, str], dict[str, int]] = {}
    for pool in policy.pools:
        nodes: list[Node] = list(policy.nodes_in(pool.name))
        pool_units = sum(g.units_milli for n in nodes for g in n.gpus)
        for node in nodes:
            node_units = sum(g.units_milli for g in node.gpus) or 1
            for gpu in node.gpus:
                acc = out.setdefault((pool.name, gpu.model), {
                    "units": 0, "memory": gpu.memory_mib, "device": gpu.units_milli,
                    "cpu": 0, "ram": 0, "pool_units": pool_units})
                acc["units"] += gpu.units_milli
                acc["memory"] = min(acc["memory"], gpu.memory_mib)
                acc["device"] = min(acc["device"], gpu.units_milli)
                acc["cpu"] += node.cpu_milli * gpu.units_milli // node_units
                acc["ram"] += node.memory_mib * gpu.units_milli // node_units
    return [Flavor(pool, model, a["units"], a["memory"], a["device"], a["cpu"], a["ram"])
            for (pool, model), a in out.items()]


def _quantity(resource: str, value: Fraction) -> int | str:
    """A Kubernetes quantity, rounded down (a quota never above what the policy gives)."""
    if resource in ("memory", "metax-tech.com/vmemory"):
        return f"{math.floor(value)}Mi"
    if value.denominator == 1:
        return int(value)
    return f"{math.floor(value * 1000)}m"


@dataclass
class _Plan:
    covered: list[str]
    rates: dict[str, dict[str, Fraction]]  # flavor name -> resource -> per GPU unit

    def amounts(self, flavor: Flavor, units_milli: int) -> list[tuple[str, Fraction]]:
        rate = self.rates[flavor.name]
        share = Fraction(units_milli, UNIT)
        out = []
        for res in self.covered:
            if res == "cpu":
                value = Fraction(flavor.cpu_milli, 1000) * Fraction(units_milli, flavor.units_milli)
            elif res == "memory":
                value = Fraction(flavor.node_memory_mib) * Fraction(units_milli,
                                                                    flavor.units_milli)
            else:
                value = rate.get(res, Fraction(0)) * share
            out.append((res, value))
        return out


def _plan(policy: Policy, fls: list[Flavor], opts: KueueOptions) -> _Plan:
    covered: list[str] = ["cpu", "memory"] if opts.cover_cpu_memory else []
    rates: dict[str, dict[str, Fraction]] = {}
    for fl in fls:
        pool = policy.pool(fl.pool)
        assert pool is not None
        mode = enforcement_of(fl.pool, pool.mode, opts)
        try:
            rates[fl.name] = per_unit(fl, mode, opts)
        except ValueError as exc:
            raise ValueError(f"pool {fl.pool} ({mode}): {exc}; give the pool another "
                             "enforcement with --pool-enforcement POOL=MODE") from exc
        covered += [r for r in rates[fl.name] if r not in covered]
    return _Plan(covered, rates)


def _flavor_share(fls: list[Flavor], fl: Flavor, milli: int) -> int:
    """A pool quota's part on one flavor: in proportion to the flavor's GPUs in the pool."""
    pool_units = sum(f.units_milli for f in fls if f.pool == fl.pool)
    return milli * fl.units_milli // pool_units if pool_units else 0


def _resources(plan: _Plan, fl: Flavor, nominal: int, borrow: int | None) -> list[dict]:
    out = []
    borrowed = plan.amounts(fl, borrow) if borrow is not None else None
    for i, (res, value) in enumerate(plan.amounts(fl, nominal)):
        item: dict[str, Any] = {"name": res, "nominalQuota": _quantity(res, value)}
        if borrowed is not None:
            item["borrowingLimit"] = _quantity(res, borrowed[i][1])
        out.append(item)
    return out


def priority_values(policy: Policy) -> dict[str, int]:
    """The Kueue value of each class: its own where preemptible; the top value, shared by
    every non-preemptible class, otherwise (see the module docstring)."""
    values = {c.name: c.value for c in policy.priority_classes}
    if not values:
        return {}
    top = max(values.values())
    if any(c.preemptible and c.value == top for c in policy.priority_classes):
        top += 1
    return {c.name: (c.value if c.preemptible else top) for c in policy.priority_classes}


def kueue_objects(policy: Policy, opts: KueueOptions | None = None) -> list[dict[str, Any]]:
    """Every Kueue object of ``policy`` (see the module docstring), in apply order."""
    opts = opts or KueueOptions()
    fls = flavors(policy)
    plan = _plan(policy, fls, opts)
    product = opts.product_label
    if product is None and policy.inventory_source == "kubernetes":
        product = PRODUCT_LABEL
    objs: list[dict[str, Any]] = []
    for fl in fls:
        labels = {opts.pool_label: fl.pool}
        pool = policy.pool(fl.pool)
        if product and pool is not None and pool.mode is not SharingMode.MIG:
            labels[product] = fl.model
        objs.append({"apiVersion": API, "kind": "ResourceFlavor",
                     "metadata": {"name": fl.name}, "spec": {"nodeLabels": labels}})
    for pc in policy.priority_classes:
        value = priority_values(policy)[pc.name]
        text = (f"{pc.description + ' ' if pc.description else ''}(policy value {pc.value}, "
                f"{'preemptible' if pc.preemptible else 'not preemptible'})")
        objs.append({"apiVersion": API, "kind": "WorkloadPriorityClass",
                     "metadata": {"name": priority_class_name(pc.name)},
                     "value": value, "description": text[:2048]})
    cohort = dns_label(opts.cohort)
    unowned = []
    for fl in fls:
        owned = sum(_flavor_share(fls, fl, q.guaranteed_milli) for t in policy.teams
                    for p, q in t.quotas if p == fl.pool)
        unowned.append({"name": fl.name,
                        "resources": _resources(plan, fl, max(0, fl.units_milli - owned), None)})
    cohort_spec: dict[str, Any] = {}
    if fls:
        cohort_spec["resourceGroups"] = [{"coveredResources": plan.covered, "flavors": unowned}]
    objs.append({"apiVersion": API, "kind": "Cohort", "metadata": {"name": cohort},
                 "spec": cohort_spec})
    for team in policy.teams:
        quotas = dict(team.quotas)
        team_flavors = []
        for fl in fls:
            q = quotas.get(fl.pool)
            nominal = _flavor_share(fls, fl, q.guaranteed_milli) if q else 0
            borrow = _flavor_share(fls, fl, q.borrow_limit_milli) if q else 0
            team_flavors.append({"name": fl.name, "resources": _resources(plan, fl, nominal,
                                                                         borrow)})
        spec: dict[str, Any] = {
            "cohortName": cohort,
            "namespaceSelector": {"matchLabels": {
                "kubernetes.io/metadata.name": opts.namespace}},
            "queueingStrategy": "BestEffortFIFO",
            "preemption": {
                "reclaimWithinCohort": "Any",
                "withinClusterQueue": "LowerPriority",
                "borrowWithinCohort": {"policy": "Never"},
            },
        }
        if team_flavors:
            spec["resourceGroups"] = [{"coveredResources": plan.covered,
                                       "flavors": team_flavors}]
        objs.append({"apiVersion": API, "kind": "ClusterQueue",
                     "metadata": {"name": cluster_queue_name(team.name),
                                  "labels": {"gpushare.jupyter.org/team":
                                             dns_label(team.name)}},
                     "spec": spec})
    for team in policy.teams:
        objs.append({"apiVersion": API, "kind": "LocalQueue",
                     "metadata": {"name": local_queue_name(team.name),
                                  "namespace": opts.namespace},
                     "spec": {"clusterQueue": cluster_queue_name(team.name)}})
    return objs


def warnings(policy: Policy) -> list[str]:
    """Things an admin should know before applying the export."""
    out = []
    for fl_pool in policy.pools:
        cap = sum(g.units_milli for n in policy.nodes_in(fl_pool.name) for g in n.gpus)
        owned = sum(q.guaranteed_milli for t in policy.teams for p, q in t.quotas
                    if p == fl_pool.name)
        if owned > cap:
            out.append(f"pool {fl_pool.name}: guarantees add up to {owned / UNIT:g} GPUs but "
                       f"the pool has {cap / UNIT:g}; Kueue cannot honour all of them at once")
    return out


def render(policy: Policy, opts: KueueOptions | None = None, source: str = "") -> str:
    """The export as a multi-document YAML stream, with a comment header."""
    opts = opts or KueueOptions()
    head = [
        "# Kueue objects for jupyter-gpushare, written by `jupyter-gpushare export kueue`"
        + (f" from {source}" if source else ""),
        f"# enforcement: {opts.enforcement}; namespace: {opts.namespace}; apply with "
        "kubectl apply -f -",
        *[f"# WARNING: {w}" for w in warnings(policy)],
    ]
    docs = [yaml.safe_dump(o, sort_keys=False, default_flow_style=False)
            for o in kueue_objects(policy, opts)]  # names and texts quoted by the serializer
    # the comments stay comments whatever a name or the file's path holds
    return "\n".join(one_line(line) for line in head) + "\n---\n" + "---\n".join(docs)


def _pairs(items: list[str] | None) -> dict[str, str]:
    out = {}
    for item in items or []:
        pool, sep, mode = item.partition("=")
        if not sep:
            raise SystemExit(f"--pool-enforcement {item!r}: expected POOL=MODE")
        out[pool] = mode
    return out


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--namespace", default="jupyterhub",
                        help="namespace of the LocalQueues: where the hub creates the Jobs")
    parser.add_argument("--cohort", default="gpushare", help="name of the Cohort")
    parser.add_argument("--enforcement", choices=ENFORCEMENTS, default="whole",
                        help="GPU enforcement of the Jobs (c.KubeJobsBackend.gpu_backend); "
                        "MIG pools use 'mig'")
    parser.add_argument("--pool-enforcement", action="append", metavar="POOL=MODE",
                        help="enforcement of one pool (repeatable)")
    parser.add_argument("--gpu-resource", default="nvidia.com/gpu",
                        help="resource of a whole GPU (e.g. amd.com/gpu)")
    parser.add_argument("--hami-split-count", type=int, default=10,
                        help="HAMi deviceSplitCount (vGPUs per card)")
    parser.add_argument("--timeslice-replicas", type=int, default=4,
                        help="time-slicing replicas per GPU in the device plugin's config")
    parser.add_argument("--pool-label", default=POOL_LABEL, help="node label naming the pool")
    parser.add_argument("--product-label", default=None,
                        help="node label of the GPU model in the ResourceFlavors (default: "
                        f"{PRODUCT_LABEL} with a kubernetes inventory, else none)")
    parser.add_argument("--no-cpu-memory", action="store_true",
                        help="do not cover cpu and memory in the ClusterQueues")


def _render(policy: Any, args: argparse.Namespace) -> str:
    opts = KueueOptions(
        namespace=args.namespace, cohort=args.cohort, enforcement=args.enforcement,
        pool_enforcement=_pairs(args.pool_enforcement), gpu_resource=args.gpu_resource,
        hami_split_count=args.hami_split_count, timeslice_replicas=args.timeslice_replicas,
        pool_label=args.pool_label, product_label=args.product_label,
        cover_cpu_memory=not args.no_cpu_memory,
    )
    try:
        return render(policy, opts, source=args.policy)
    except ValueError as exc:  # a policy this export cannot express: say why, no traceback
        raise SystemExit(f"jupyter-gpushare export kueue: {exc}") from exc


KUEUE = exporter(Exporter(
    "kueue",
    "the policy as Kueue objects: Cohort, ClusterQueues, LocalQueues, ResourceFlavors, "
    "WorkloadPriorityClasses (kueue.x-k8s.io/v1beta2)",
    _arguments,
    _render,
))
