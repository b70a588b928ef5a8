"""Live cluster state: what is free on every node and GPU, and who holds what.

``ClusterState`` is the core's only mutable object. It is rebuilt from the policy's
inventory plus the live grants (the broker does this on start from its database),
and updated with :meth:`ClusterState.apply` and :meth:`ClusterState.release`.
It refuses any change that would over-allocate a GPU, a node or a quota counter,
so an invariant violation is an exception, never silent corruption.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from .model import GPU, UNIT, Grant, Kind, Node, Placement, Policy, Pool, SharingMode


class CapacityError(ValueError):
    """A grant does not fit the state it was applied to."""


@dataclass
class GPUState:
    """Free capacity of one GPU."""

    gpu: GPU
    node: str
    capacity_mib: int  # memory that fractions may use (total minus the pool's headroom)
    used_mib: int = 0
    used_compute: int = 0  # milli of the GPU's compute
    holders: int = 0
    whole: bool = False  # held whole by one grant

    @property
    def free_mib(self) -> int:
        return 0 if self.whole else max(0, self.capacity_mib - self.used_mib)

    @property
    def free_compute(self) -> int:
        return 0 if self.whole else UNIT - self.used_compute

    @property
    def idle(self) -> bool:
        return self.holders == 0


@dataclass
class NodeState:
    """Free capacity of one node."""

    node: Node
    pool: Pool
    gpus: list[GPUState]
    free_cpu: int
    free_mem: int
    cordoned: bool = False
    by_uuid: dict[str, GPUState] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.by_uuid = {g.gpu.uuid: g for g in self.gpus}

    @property
    def idle_gpus(self) -> int:
        return sum(1 for g in self.gpus if g.idle)


def _capacity(gpu: GPU, pool: Pool, shares: bool) -> int:
    if shares:
        return int(gpu.memory_mib * (1.0 - pool.memory_headroom))
    return gpu.memory_mib


def could_be_victim(grant: Grant) -> bool:
    """Whether any request could ever preempt ``grant`` (its flags never change): a borrowed
    grant, or a preemptible one that is not an interactive server inside its guarantee. The
    grants :func:`.preemption.is_candidate` accepts are among these, whatever the request."""
    return grant.borrowed or (grant.preemptible and grant.request.kind is not Kind.INTERACTIVE)


class ClusterState:
    """Free capacity per node and GPU, live grants, and usage per team, user and pool."""

    def __init__(self, policy: Policy, grants: list[Grant] | tuple[Grant, ...] = ()) -> None:
        self.policy = policy
        self.nodes: dict[str, NodeState] = {}
        self.by_pool: dict[str, list[NodeState]] = defaultdict(list)
        # pool -> GPU model -> positions in by_pool of the nodes with a card of it (a
        # node's cards do not change within a state; read by the refusal tables)
        self.by_model: dict[str, dict[str, list[int]]] = defaultdict(dict)
        pools: dict[str, Pool | None] = {}  # looked up once per pool, not per node
        for node in policy.nodes:
            if node.pool not in pools:
                pools[node.pool] = policy.pool(node.pool)
            pool = pools[node.pool]
            if pool is None:
                raise ValueError(f"node {node.name} names unknown pool {node.pool!r}")
            shares = pool.shares_gpus
            gpus = [GPUState(g, node.name, _capacity(g, pool, shares)) for g in node.gpus]
            ns = NodeState(node, pool, gpus, node.cpu_milli, node.memory_mib)
            self.nodes[node.name] = ns
            at = self.by_model[node.pool]
            for model in {g.model for g in node.gpus}:
                at.setdefault(model, []).append(len(self.by_pool[node.pool]))
            self.by_pool[node.pool].append(ns)
        self.grants: dict[str, Grant] = {}
        # per pool, the grants some request could ever preempt (see could_be_victim), in the
        # order they were applied: the preemption planner reads these, not every grant
        self.victims_by_pool: dict[str, dict[str, Grant]] = defaultdict(dict)
        self.usage: dict[tuple[str, str], int] = defaultdict(int)  # (team, pool) -> milli
        self.borrowed: dict[tuple[str, str], int] = defaultdict(int)
        self.user_usage: dict[tuple[str, str], int] = defaultdict(int)  # (user, pool) -> milli
        self.preempting: dict[str, str] = {}  # victim grant id -> request id it makes room for
        self.version = 0  # bumped on every change; placement indices key on it
        self._log: list[str] = []  # node changed by each version step, oldest first
        self._log_base = 0  # the version before self._log[0]
        self._cordoned_in: dict[str, int] = defaultdict(int)  # pool -> cordoned nodes
        # per pool: (GPU units, CPU milli, RAM MiB) of all its nodes, and the CPU and RAM held
        self._pool_size: dict[str, tuple[int, int, int]] = {
            pool: (
                sum(g.gpu.units_milli for ns in nodes for g in ns.gpus),
                sum(ns.node.cpu_milli for ns in nodes),
                sum(ns.node.memory_mib for ns in nodes),
            )
            for pool, nodes in self.by_pool.items()
        }
        self._pool_cpu: dict[str, int] = defaultdict(int)
        self._pool_mem: dict[str, int] = defaultdict(int)
        for grant in grants:
            self.apply(grant)

    # -- capacity -----------------------------------------------------------------------

    def pool_capacity_milli(self, pool: str) -> int:
        """Total GPU units of a pool (ignoring cordoned nodes)."""
        return sum(
            g.gpu.units_milli
            for ns in self.by_pool.get(pool, ())
            if not ns.cordoned
            for g in ns.gpus
        )

    def open_nodes(self, pool: str) -> int:
        """How many nodes of ``pool`` are not cordoned."""
        return len(self.by_pool.get(pool, ())) - self._cordoned_in.get(pool, 0)

    def pool_used_milli(self, pool: str) -> int:
        return sum(v for (_, p), v in self.usage.items() if p == pool)

    def pool_load(self, pool: str) -> float:
        """The largest share held of the pool's GPU units, CPU and RAM (0 to 1; cordoned
        nodes count as the others): how near the pool is to refusing requests."""
        gpu, cpu, mem = self._pool_size.get(pool, (0, 0, 0))
        shares = [
            used / size
            for used, size in (
                (self.pool_used_milli(pool), gpu),
                (self._pool_cpu[pool], cpu),
                (self._pool_mem[pool], mem),
            )
            if size > 0
        ]
        return max(shares, default=0.0)

    def check(self, grant: Grant) -> None:
        """Raise :class:`CapacityError` unless ``grant`` fits the current state."""
        if grant.id in self.grants:
            raise CapacityError(f"grant {grant.id} is already applied")
        _check_placement(self, grant)

    # -- changes ------------------------------------------------------------------------

    def apply(self, grant: Grant) -> None:
        """Record ``grant``; raises :class:`CapacityError` (changing nothing) if it does not fit."""
        self.check(grant)
        ns = self.nodes[grant.placement.node]
        req = grant.request
        ns.free_cpu -= req.cpu_milli
        ns.free_mem -= req.memory_mib
        self._pool_cpu[ns.node.pool] += req.cpu_milli
        self._pool_mem[ns.node.pool] += req.memory_mib
        for sl in grant.placement.slices:
            gs = ns.by_uuid[sl.gpu_uuid]
            gs.holders += 1
            gs.used_mib += sl.memory_mib
            gs.used_compute += sl.compute_milli
            if req.gpu.whole:
                gs.whole = True
        key = (grant.team, grant.pool)
        self.usage[key] += grant.units_milli
        if grant.borrowed:
            self.borrowed[key] += grant.units_milli
        self.user_usage[(grant.user, grant.pool)] += grant.units_milli
        self.grants[grant.id] = grant
        if could_be_victim(grant):
            self.victims_by_pool[grant.request.pool][grant.id] = grant
        self._changed(grant.placement.node)

    def release(self, grant_id: str) -> Grant:
        """Forget a grant and return it; raises ``KeyError`` if unknown."""
        grant = self.grants.pop(grant_id)
        self.victims_by_pool[grant.request.pool].pop(grant_id, None)
        ns = self.nodes[grant.placement.node]
        req = grant.request
        ns.free_cpu += req.cpu_milli
        ns.free_mem += req.memory_mib
        self._pool_cpu[ns.node.pool] -= req.cpu_milli
        self._pool_mem[ns.node.pool] -= req.memory_mib
        for sl in grant.placement.slices:
            gs = ns.by_uuid[sl.gpu_uuid]
            gs.holders -= 1
            gs.used_mib -= sl.memory_mib
            gs.used_compute -= sl.compute_milli
            if req.gpu.whole:
                gs.whole = False
        key = (grant.team, grant.pool)
        self.usage[key] -= grant.units_milli
        if grant.borrowed:
            self.borrowed[key] -= grant.units_milli
        self.user_usage[(grant.user, grant.pool)] -= grant.units_milli
        self.preempting.pop(grant_id, None)
        self._changed(grant.placement.node)
        return grant

    def cordon(self, node: str, cordoned: bool = True) -> None:
        """Stop (or resume) placing new grants on ``node``; live grants stay."""
        ns = self.nodes[node]
        if ns.cordoned != cordoned:
            self._cordoned_in[ns.node.pool] += 1 if cordoned else -1
        ns.cordoned = cordoned
        self._changed(node)

    LOG_LIMIT = 8192

    def _changed(self, node: str) -> None:
        self.version += 1
        self._log.append(node)
        if len(self._log) > self.LOG_LIMIT:  # keep the newest half
            drop = len(self._log) // 2
            del self._log[:drop]
            self._log_base += drop

    def changed_since(self, version: int) -> set[str] | None:
        """Names of the nodes changed after ``version``, or ``None`` if that is too long ago."""
        if version < self._log_base or version > self.version:
            return None
        return set(self._log[version - self._log_base :])

    # -- views --------------------------------------------------------------------------

    def grants_in(self, pool: str) -> list[Grant]:
        return [g for g in self.grants.values() if g.pool == pool]

    def possible_victims(self, pool: str) -> list[Grant]:
        """The grants of ``pool`` that some request could preempt (:func:`could_be_victim`),
        in the order they were applied (a subsequence of :meth:`grants_in`)."""
        return list(self.victims_by_pool.get(pool, {}).values())

    def team_used(self, team: str, pool: str) -> int:
        return self.usage.get((team, pool), 0)

    def team_borrowed(self, team: str, pool: str) -> int:
        return self.borrowed.get((team, pool), 0)

    def user_used(self, user: str, pool: str) -> int:
        return self.user_usage.get((user, pool), 0)


def _check_placement(state: ClusterState, grant: Grant) -> None:
    placement: Placement = grant.placement
    ns = state.nodes.get(placement.node)
    if ns is None:
        raise CapacityError(f"unknown node {placement.node!r}")
    req = grant.request
    if ns.pool.name != req.pool:
        raise CapacityError(f"node {ns.node.name} is in pool {ns.pool.name}, not {req.pool}")
    if req.cpu_milli > ns.free_cpu or req.memory_mib > ns.free_mem:
        raise CapacityError(f"node {ns.node.name} lacks CPU or RAM for {grant.id}")
    expected = req.gpu.whole if req.gpu.whole else (1 if req.gpu.is_fraction else 0)
    uuids = [sl.gpu_uuid for sl in placement.slices]
    if len(uuids) != expected or len(set(uuids)) != len(uuids):
        raise CapacityError(f"grant {grant.id} needs {expected} distinct GPU slice(s)")
    for sl in placement.slices:
        gs = ns.by_uuid.get(sl.gpu_uuid)
        if gs is None:
            raise CapacityError(f"GPU {sl.gpu_uuid} is not on node {ns.node.name}")
        if req.gpu_models and gs.gpu.model not in req.gpu_models:
            raise CapacityError(
                f"GPU {sl.gpu_uuid} is a {gs.gpu.model}, not one of {req.gpu_models}"
            )
        if req.gpu.whole or ns.pool.mode in (SharingMode.EXCLUSIVE, SharingMode.MIG):
            if not gs.idle:
                raise CapacityError(f"GPU {sl.gpu_uuid} is not idle")
            if sl.memory_mib > gs.gpu.memory_mib:
                raise CapacityError(f"GPU {sl.gpu_uuid} has only {gs.gpu.memory_mib} MiB")
            continue
        if sl.memory_mib > gs.free_mib or sl.compute_milli > gs.free_compute:
            raise CapacityError(
                f"GPU {sl.gpu_uuid} has {gs.free_mib} MiB and {gs.free_compute / 10:g}% compute "
                f"free; {grant.id} needs {sl.memory_mib} MiB and {sl.compute_milli / 10:g}%"
            )
