"""Replay of the FGD paper's (USENIX ATC '23) packing evaluation on Alibaba's GPU trace.

This module is the harness behind ``benchmarks/packing.py``: trace loading, workload
inflation, the paper's fragmentation measure, the baseline policies (Random, BestFit,
FGD) and the per-pod recording and binning. The procedure follows
``shared/data/alibaba-gpu-v2023/README.md`` ("Evaluation procedure" and "Details that
decide the numbers").

Units follow the trace: CPU in milli-cores, memory in MiB, GPU in milli-GPU (1000 = one
whole GPU). ``gpu_milli`` of a pod is its per-GPU demand.
"""

from __future__ import annotations

import bisect
import csv
import math
import random
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from jupyter_gpushare.core.fragmentation import target_shapes

MILLI = 1000
TUNE = 1.3
POPULARITY = 0.95
TIE_RULE = (
    "fixed random node order per seed: nodes are ranked by random.Random(seed) shuffling "
    "their name-sorted list once; among equal top scores the lowest rank wins "
    "(the authors' simulator renames nodes per seed and breaks ties by smallest name)"
)


@dataclass(frozen=True)
class NodeSpec:
    """One node of the node list."""

    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    model: str


@dataclass(frozen=True)
class PodSpec:
    """One pod of a pod list (only the columns the evaluation uses)."""

    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int
    gpu_spec: str

    @property
    def gpu_request(self) -> int:
        """Total GPU demand in milli-GPU (``num_gpu * gpu_milli``)."""
        return self.num_gpu * self.gpu_milli

    @property
    def shape(self) -> Shape:
        """The pod's shape for the fragmentation measure (memory ignored)."""
        return (self.cpu_milli, self.gpu_milli, self.num_gpu, self.gpu_spec)


Shape = tuple[int, int, int, str]
"""(cpu_milli, per-GPU milli, number of GPUs, gpu_spec)."""


def load_nodes(path: str) -> list[NodeSpec]:
    """Read a node list CSV; nodes without GPUs are kept (they can run CPU-only pods)."""
    with open(path, newline="") as fh:
        return [
            NodeSpec(r["sn"], int(r["cpu_milli"]), int(r["memory_mib"]), int(r["gpu"]), r["model"])
            for r in csv.DictReader(fh)
        ]


def load_pods(path: str) -> list[PodSpec]:
    """Read a pod list CSV (5-column multigpu files have no ``gpu_spec``)."""
    with open(path, newline="") as fh:
        return [
            PodSpec(
                r["name"],
                int(r["cpu_milli"]),
                int(r.get("memory_mib") or 0),
                int(r["num_gpu"]),
                int(r["gpu_milli"]),
                r.get("gpu_spec") or "",
            )
            for r in csv.DictReader(fh)
        ]


def replicate(
    nodes: Sequence[NodeSpec], pods: Sequence[PodSpec], k: int
) -> tuple[list[NodeSpec], list[PodSpec]]:
    """The node and pod lists ``k`` times over, names suffixed ``#copy`` (``k`` = 1: unchanged).

    A cluster ``k`` times larger with a trace ``k`` times longer: the same mix of nodes and
    shapes, so packing quality should hold while the cost of a decision may grow.
    """
    if k <= 1:
        return list(nodes), list(pods)
    out_nodes = [replace(n, name=f"{n.name}#{c}") for c in range(k) for n in nodes]
    out_pods = [replace(p, name=f"{p.name}#{c}") for c in range(k) for p in pods]
    return out_nodes, out_pods


def gpu_capacity_milli(nodes: Sequence[NodeSpec]) -> int:
    """Total GPU capacity of the cluster in milli-GPU."""
    return sum(n.gpus for n in nodes) * MILLI


def inflate(
    pods: Sequence[PodSpec], seed: int, capacity_milli: int, tune: float = TUNE
) -> list[PodSpec]:
    """The paper's workload inflation ("tune"), controlled by ``seed``.

    Shuffle all pods with the seed. Below ``tune * capacity``, append pods drawn uniformly
    with replacement from the name-sorted trace until the running total plus the next
    pod's per-GPU milli would pass the target. Above it, remove random pods while the
    total exceeds the target.
    """
    rng = random.Random(seed)
    out = list(pods)
    rng.shuffle(out)
    target = tune * capacity_milli
    total = sum(p.gpu_request for p in out)
    if total < target:
        pool = sorted(pods, key=lambda p: p.name)
        while True:
            nxt = pool[rng.randrange(len(pool))]
            if total + nxt.gpu_milli > target:
                break
            out.append(nxt)
            total += nxt.gpu_request
    else:
        while total > target and out:
            victim = out.pop(rng.randrange(len(out)))
            total -= victim.gpu_request
    return out


def typical_shapes(
    pods: Sequence[PodSpec], threshold: float = POPULARITY
) -> list[tuple[Shape, float]]:
    """The target workload: most common shapes covering ``threshold`` of pods, renormalised.

    Shapes are sorted by count (descending), ties by the larger shape first, as the
    simulator's ``sort.Reverse`` does; CPU-only shapes are included.
    """
    return target_shapes(Counter(p.shape for p in pods), threshold)


def model_allowed(spec: str, model: str) -> bool:
    """Whether a GPU model is allowed by a ``gpu_spec`` (empty spec: any model)."""
    if not spec:
        return True
    if not model:
        return False
    return model in spec.split("|")


class FragMeasure:
    """The paper's node fragmentation for a target workload, memoised.

    For shape m with popularity p: if m is CPU-only, or the node cannot run it (wrong
    model, not enough CPU, fewer than ``num`` GPUs with ``milli`` free), all free GPU
    milli counts; otherwise only the free milli on GPUs with less than m's per-GPU
    demand. CPU enters only through which shape CPU thresholds the free CPU reaches, so
    the memo key uses that level instead of the exact free CPU.
    """

    def __init__(self, shapes: Sequence[tuple[Shape, float]]) -> None:
        self.shapes = list(shapes)
        self.cpu_levels = sorted({s[0] for s, _ in self.shapes})
        self._memo: dict[tuple[str, int, tuple[int, ...]], float] = {}

    def level(self, cpu_free: int) -> int:
        """How many distinct shape CPU demands ``cpu_free`` covers."""
        return bisect.bisect_right(self.cpu_levels, cpu_free)

    def node(self, model: str, cpu_free: int, gpus: Sequence[int]) -> float:
        """Fragmentation (milli-GPU) of a node with ``cpu_free`` and free milli ``gpus``."""
        if not gpus:
            return 0.0
        key = (model, self.level(cpu_free), tuple(sorted(gpus)))
        val = self._memo.get(key)
        if val is None:
            val = self._compute(model, cpu_free, key[2])
            self._memo[key] = val
        return val

    def _compute(self, model: str, cpu_free: int, gpus: tuple[int, ...]) -> float:
        total = sum(gpus)
        if total == 0:
            return 0.0
        frag = 0.0
        for (cpu, milli, num, spec), p in self.shapes:
            if milli == 0 or cpu > cpu_free or not model_allowed(spec, model):
                frag += p * total
                continue
            if sum(1 for g in gpus if g >= milli) < num:
                frag += p * total
                continue
            frag += p * sum(g for g in gpus if g < milli)
        return frag


@dataclass
class SimCluster:
    """Free capacity per node as plain lists (fast to read in the policies)."""

    specs: list[NodeSpec]
    cpu: list[int] = field(default_factory=list)
    mem: list[int] = field(default_factory=list)
    gpus: list[list[int]] = field(default_factory=list)
    models: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.cpu = [n.cpu_milli for n in self.specs]
        self.mem = [n.memory_mib for n in self.specs]
        self.gpus = [[MILLI] * n.gpus for n in self.specs]
        self.models = [n.model for n in self.specs]

    def fits(self, i: int, pod: PodSpec) -> bool:
        """The default filters plus the GPU filter for node ``i``."""
        if self.cpu[i] < pod.cpu_milli or self.mem[i] < pod.memory_mib:
            return False
        if pod.num_gpu == 0:
            return True
        if not model_allowed(pod.gpu_spec, self.models[i]):
            return False
        milli = pod.gpu_milli
        return sum(1 for g in self.gpus[i] if g >= milli) >= pod.num_gpu

    def allocate(self, i: int, pod: PodSpec, gpu_ids: Sequence[int]) -> None:
        """Take ``pod``'s resources on node ``i`` and GPUs ``gpu_ids``; checks capacity."""
        if self.cpu[i] < pod.cpu_milli or self.mem[i] < pod.memory_mib:
            raise ValueError(f"over-allocation of CPU/RAM on node {i}")
        if len(gpu_ids) != pod.num_gpu or len(set(gpu_ids)) != len(gpu_ids):
            raise ValueError(f"pod {pod.name} needs {pod.num_gpu} distinct GPUs, got {gpu_ids}")
        for g in gpu_ids:
            if self.gpus[i][g] < pod.gpu_milli:
                raise ValueError(f"over-allocation of GPU {g} on node {i}")
        self.cpu[i] -= pod.cpu_milli
        self.mem[i] -= pod.memory_mib
        for g in gpu_ids:
            self.gpus[i][g] -= pod.gpu_milli


Choice = tuple[int, tuple[int, ...]]
"""(node index, GPU indices) of a placement."""


class Policy:
    """A placement policy over a :class:`SimCluster` (baselines) or the product core."""

    name = "policy"

    def __init__(self, cluster: SimCluster, ranks: list[int], seed: int, frag: FragMeasure):
        self.cluster = cluster
        self.ranks = ranks  # rank[i]: node i's place in the seed's fixed random order
        self.order = sorted(range(len(ranks)), key=ranks.__getitem__)
        self.rng = random.Random(seed * 7919 + 1)
        self.frag = frag

    def prepare(self, pod: PodSpec) -> None:
        """Untimed per-pod preparation (the product policy builds its request here)."""

    def choose(self, pod: PodSpec) -> Choice | None:
        """The timed placement decision; ``None`` when the pod fits nowhere."""
        raise NotImplementedError

    def commit(self, pod: PodSpec, choice: Choice) -> None:
        """Record a placement chosen by :meth:`choose` (the harness calls this)."""
        self.cluster.allocate(choice[0], pod, choice[1])


def baseline_gpus(gpus: Sequence[int], pod: PodSpec) -> tuple[int, ...]:
    """The baselines' GPU choice: tightest GPU for a fraction, first free GPUs otherwise."""
    if pod.num_gpu == 0:
        return ()
    if pod.num_gpu == 1 and pod.gpu_milli < MILLI:
        best = min((g for g in range(len(gpus)) if gpus[g] >= pod.gpu_milli), key=lambda g: gpus[g])
        return (best,)
    free = [g for g in range(len(gpus)) if gpus[g] == MILLI]
    return tuple(free[: pod.num_gpu])


class RandomPolicy(Policy):
    """01-Random: a uniformly random feasible node."""

    name = "random"

    def choose(self, pod: PodSpec) -> Choice | None:
        c = self.cluster
        feasible = [i for i in self.order if c.fits(i, pod)]
        if not feasible:
            return None
        i = feasible[self.rng.randrange(len(feasible))]
        return i, baseline_gpus(c.gpus[i], pod)


class BestFitPolicy(Policy):
    """05-BestFit: integer score, min-max normalised with integer division."""

    name = "bestfit"

    def choose(self, pod: PodSpec) -> Choice | None:
        c = self.cluster
        scored: list[tuple[int, int]] = []
        req = pod.gpu_request
        for i in self.order:
            if not c.fits(i, pod):
                continue
            left = 0.5 * (c.cpu[i] - pod.cpu_milli) / 128000 + 0.5 * (sum(c.gpus[i]) - req) / 8000
            scored.append((int((1.0 - left) * 100), i))
        if not scored:
            return None
        hi = max(s for s, _ in scored)
        lo = min(s for s, _ in scored)
        if hi == lo:
            lo -= 1
        best_i, best_s = -1, -1
        for s, i in scored:  # in rank order: the first of the top scores wins
            norm = (s - lo) * 100 // (hi - lo)
            if norm > best_s:
                best_i, best_s = i, norm
        return best_i, baseline_gpus(c.gpus[best_i], pod)


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


class FGDPolicy(Policy):
    """06-FGD: fragmentation gradient descent with the plugin's truncated integer score."""

    name = "fgd"

    def __init__(self, cluster: SimCluster, ranks: list[int], seed: int, frag: FragMeasure):
        super().__init__(cluster, ranks, seed, frag)
        self._memo: dict[tuple, tuple[int, tuple[int, ...]]] = {}

    def node_score(self, i: int, pod: PodSpec) -> tuple[int, tuple[int, ...]]:
        """FGD's (score, GPU ids) for ``pod`` on node ``i`` (assumed feasible)."""
        c = self.cluster
        fm = self.frag
        cpu = c.cpu[i]
        gpus = tuple(c.gpus[i])
        key = (c.models[i], fm.level(cpu), fm.level(cpu - pod.cpu_milli), gpus, pod.shape)
        hit = self._memo.get(key)
        if hit is not None:
            return hit
        before = fm.node(c.models[i], cpu, gpus)
        after_cpu = cpu - pod.cpu_milli
        result: tuple[int, tuple[int, ...]]
        if pod.num_gpu == 1 and pod.gpu_milli < MILLI:
            score, gid = 0, -1
            for g, free in enumerate(gpus):
                if free < pod.gpu_milli:
                    continue
                new = list(gpus)
                new[g] -= pod.gpu_milli
                s = int(_sigmoid((before - fm.node(c.models[i], after_cpu, new)) / 1000) * 100)
                if gid < 0 or s > score:
                    score, gid = s, g
            result = (score, (gid,))
        else:
            ids = baseline_gpus(gpus, pod)
            new = list(gpus)
            for g in ids:
                new[g] -= pod.gpu_milli
            s = int(_sigmoid((before - fm.node(c.models[i], after_cpu, new)) / 1000) * 100)
            result = (s, ids)
        self._memo[key] = result
        return result

    def choose(self, pod: PodSpec) -> Choice | None:
        c = self.cluster
        best: Choice | None = None
        best_s = -1
        for i in self.order:
            if not c.fits(i, pod):
                continue
            s, ids = self.node_score(i, pod)
            if s > best_s:
                best, best_s = (i, ids), s
        return best


BASELINES: dict[str, type[Policy]] = {
    "random": RandomPolicy,
    "bestfit": BestFitPolicy,
    "fgd": FGDPolicy,
}


@dataclass
class RunResult:
    """Binned curves and decision times of one (policy, trace, seed) run."""

    policy: str
    seed: int
    alloc_pct: dict[int, float]  # arrived % bin -> mean allocation %
    frag_amount_pct: dict[int, float]  # % of all GPUs
    frag_ratio_pct: dict[int, float]  # % of idle GPU capacity
    decision_ms: list[float]  # CPU time of the deciding thread per decision
    failed: int
    pods: int
    decision_wall_ms: list[float] = field(default_factory=list)


def node_ranks(nodes: Sequence[NodeSpec], seed: int) -> list[int]:
    """The seed's fixed random node order: ``rank[i]`` for node ``i``."""
    names = sorted(range(len(nodes)), key=lambda i: nodes[i].name)
    random.Random(seed).shuffle(names)
    ranks = [0] * len(nodes)
    for r, i in enumerate(names):
        ranks[i] = r
    return ranks


def bin_of(arrived_pct: float) -> int:
    """Integer arrived-% bin: the nearest integer (half rounds up)."""
    return int(math.floor(arrived_pct + 0.5))


class Binner:
    """Averages per-pod samples within integer arrived-% bins."""

    def __init__(self) -> None:
        self.sums: dict[int, list[float]] = {}

    def add(self, arrived_pct: float, *values: float) -> None:
        b = bin_of(arrived_pct)
        acc = self.sums.get(b)
        if acc is None:
            self.sums[b] = [1.0, *values]
        else:
            acc[0] += 1
            for k, v in enumerate(values, start=1):
                acc[k] += v

    def mean(self, k: int) -> dict[int, float]:
        """Mean of the ``k``-th value (0-based) per bin."""
        return {b: acc[k + 1] / acc[0] for b, acc in sorted(self.sums.items())}


PolicyFactory = Callable[[SimCluster, list[int], int, FragMeasure], Policy]


def simulate(
    nodes: Sequence[NodeSpec],
    trace: Sequence[PodSpec],
    factory: PolicyFactory,
    seed: int,
    name: str,
    tune: float = TUNE,
) -> RunResult:
    """One run: inflate with ``seed``, submit pods one at a time, record after every pod."""
    capacity = gpu_capacity_milli(nodes)
    pods = inflate(trace, seed, capacity, tune)
    frag = FragMeasure(typical_shapes(trace))
    cluster = SimCluster(list(nodes))
    policy = factory(cluster, node_ranks(nodes, seed), seed, frag)
    node_frag = [frag.node(n.model, n.cpu_milli, cluster.gpus[i]) for i, n in enumerate(nodes)]
    frag_total = sum(node_frag)
    arrived = allocated = failed = 0
    binner = Binner()
    times: list[float] = []
    walls: list[float] = []
    for pod in pods:
        arrived += pod.gpu_request
        policy.prepare(pod)
        w0 = time.perf_counter()
        t0 = time.thread_time()
        choice = policy.choose(pod)
        times.append((time.thread_time() - t0) * 1000.0)
        walls.append((time.perf_counter() - w0) * 1000.0)
        if choice is None:
            failed += 1
        else:
            policy.commit(pod, choice)
            i = choice[0]
            allocated += pod.gpu_request
            new = frag.node(cluster.models[i], cluster.cpu[i], cluster.gpus[i])
            frag_total += new - node_frag[i]
            node_frag[i] = new
        idle = capacity - allocated
        binner.add(
            100.0 * arrived / capacity,
            100.0 * allocated / capacity,
            100.0 * frag_total / capacity,
            100.0 * frag_total / idle if idle > 0 else 0.0,
        )
    return RunResult(
        name, seed, binner.mean(0), binner.mean(1), binner.mean(2), times, failed, len(pods), walls
    )
