"""The ``gpushare`` benchmark policy: the product's core placement on a real ClusterState.

The node list becomes a :class:`~jupyter_gpushare.core.model.Policy` with one shared
pool (memory headroom 0). A trace pod becomes a :class:`Request`: ``gpu_milli`` is the
fraction of one GPU (memory and compute both scale with it), ``num_gpu`` whole GPUs when
``gpu_milli`` is 1000, and ``gpu_spec`` the allowed models. Each decision is one call to
:func:`jupyter_gpushare.core.placement.place`; the grant is then applied to the state, so
the state's own capacity checks guard every placement.

Nodes are listed in the seed's fixed random order, which is the order the core uses as
its last tie-break: the same tie rule as the baselines.
"""

from __future__ import annotations

from packing_sim import MILLI, Choice, FragMeasure, PodSpec, Policy, SimCluster

from jupyter_gpushare.core.model import (
    GPU,
    GPUAsk,
    Grant,
    Node,
    Placement,
    PriorityClass,
    Request,
    SharingMode,
    Team,
)
from jupyter_gpushare.core.model import Policy as CorePolicy
from jupyter_gpushare.core.model import Pool as CorePool
from jupyter_gpushare.core.placement import place
from jupyter_gpushare.core.state import ClusterState

POOL = "bench"
GPU_MEMORY_MIB = 16000  # a multiple of 1000, so a fraction's memory is exact


def build_state(cluster: SimCluster, order: list[int]) -> ClusterState:
    """A ClusterState with the cluster's nodes listed in ``order``."""
    nodes = []
    for i in order:
        spec = cluster.specs[i]
        gpus = tuple(
            GPU(f"{spec.name}/gpu{k}", spec.model, GPU_MEMORY_MIB, index=k)
            for k in range(spec.gpus)
        )
        nodes.append(Node(spec.name, POOL, gpus, spec.cpu_milli, spec.memory_mib))
    policy = CorePolicy(
        nodes=tuple(nodes),
        pools=(CorePool(POOL, SharingMode.SHARED, memory_headroom=0.0),),
        priority_classes=(PriorityClass("bench", 1, False),),
        teams=(Team("bench", ("bench",)),),
    )
    return ClusterState(policy)


def request_for(pod: PodSpec) -> Request:
    """The core request for one trace pod."""
    if pod.num_gpu == 0 or pod.gpu_milli == 0:
        ask = GPUAsk()
    elif pod.gpu_milli >= MILLI:
        ask = GPUAsk(whole=pod.num_gpu)
    elif pod.num_gpu == 1:
        ask = GPUAsk(fraction_milli=pod.gpu_milli)
    else:
        raise ValueError(f"pod {pod.name}: fractions of several GPUs are not in the model")
    return Request(
        id=pod.name,
        user="bench",
        team="bench",
        pool=POOL,
        gpu=ask,
        priority="bench",
        cpu_milli=pod.cpu_milli,
        memory_mib=pod.memory_mib,
        gpu_models=tuple(pod.gpu_spec.split("|")) if pod.gpu_spec else (),
    )


class GPUSharePolicy(Policy):
    """Adapter: ``choose`` is exactly one call to the core's ``place``."""

    name = "gpushare"

    def __init__(self, cluster: SimCluster, ranks: list[int], seed: int, frag: FragMeasure):
        super().__init__(cluster, ranks, seed, frag)
        self.state = build_state(cluster, self.order)
        self.node_index = {spec.name: i for i, spec in enumerate(cluster.specs)}
        self._request: Request | None = None
        self._placement: Placement | None = None
        self._serial = 0

    def prepare(self, pod: PodSpec) -> None:
        self._request = request_for(pod)

    def choose(self, pod: PodSpec) -> Choice | None:
        assert self._request is not None
        placement = place(self.state, self._request)
        self._placement = placement
        if placement is None:
            return None
        i = self.node_index[placement.node]
        return i, tuple(int(sl.gpu_uuid.rsplit("gpu", 1)[1]) for sl in placement.slices)

    def commit(self, pod: PodSpec, choice: Choice) -> None:
        assert self._request is not None and self._placement is not None
        self._serial += 1
        grant = Grant(
            id=f"g{self._serial}",
            request=self._request,
            placement=self._placement,
            units_milli=pod.gpu_request,
            borrowed=False,
            priority_value=1,
            preemptible=False,
            granted_at=0.0,
        )
        self.state.apply(grant)  # raises CapacityError on any over-allocation
        super().commit(pod, choice)
