"""Placement: which node and which GPU(s) a request lands on.

``place(state, request)`` returns a :class:`Placement` or ``None`` when nothing fits.
It never changes the state; the caller applies the grant. ``place_on_node`` answers
the same question for one node (preemption uses it to test a node with victims gone);
it and plain best fit live in :mod:`.bestfit`.

Shared and debug pools use *gpushare packing*, a fragmentation-gradient placement
(after FGD, USENIX ATC '23) made cheap, incremental and CPU-aware: one
:class:`~.packindex.PoolIndex` per pool (see :mod:`.packindex`).
Exclusive and MIG pools keep plain best fit (whole devices, nothing to fragment), from an
index of each pool's nodes in best-fit order (:class:`_FitIndex`) that answers exactly
what the scan of every node would. Every index follows the state by version: it
refreshes the nodes the state's change log names since its last look (every node when it
fell too far behind).
"""

from __future__ import annotations

import weakref

from .bestfit import (  # one node, and plain best fit (exclusive and MIG pools)
    _best_fit_scan,  # noqa: F401  (the reference the tests compare _best_fit with)
    _FitIndex,
    _fraction_fits,
    _model_ok,
    _slice,
    node_can_host,
    place_on_node,
)
from .fragmentation import Shape, Workload
from .model import UNIT, GPUAsk, GPUSlice, Placement, Request
from .packindex import Candidate, PoolIndex, shape_of
from .state import ClusterState


def _best_fit(state: ClusterState, request: Request, idx: _Index | None = None) -> Placement | None:
    """Best fit (exclusive/MIG pools, fractions with explicit memory, and a safety net).

    Answers exactly what :func:`_best_fit_scan` would, from a per-pool index of nodes in
    score order (see :class:`_FitIndex`).
    """
    if idx is None:
        idx = _index(state)
    fit = idx.fit_index(state, request.pool)
    if fit is None:
        return None
    return fit.best(request)


class _Index:
    """Placement indices of one :class:`ClusterState`, kept in step with its grants."""

    def __init__(self, state: ClusterState) -> None:
        self.policy = state.policy
        self.workload = Workload()
        self.ahead = False  # whether make_ahead works between requests
        self.pools: dict[str, PoolIndex] = {}
        self.fits: dict[str, _FitIndex] = {}
        self.node_pool: dict[str, str] = {}
        self.version = state.version
        self.target_version = self.workload.version
        for pool, nodes in state.by_pool.items():
            for ns in nodes:
                self.node_pool[ns.node.name] = pool
            if nodes and nodes[0].pool.shares_gpus:
                self.pools[pool] = PoolIndex(list(nodes), self.workload)

    def fit_index(self, state: ClusterState, pool: str) -> _FitIndex | None:
        fit = self.fits.get(pool)
        if fit is None:
            nodes = state.by_pool.get(pool)
            if not nodes:
                return None
            fit = self.fits[pool] = _FitIndex(list(nodes))
        return fit

    def sync(self, state: ClusterState) -> None:
        """Refresh the nodes touched since the last call (all of them if unsure)."""
        if state.version == self.version:
            return
        touched = state.changed_since(self.version)
        # in a defined order (not a set's): the refreshes stamp the nodes and intern signatures
        for name in self.node_pool if touched is None else sorted(touched):
            pool = self.node_pool[name]
            pidx = self.pools.get(pool)
            if pidx is not None:
                pidx.refresh(pidx.views[name])
            fit = self.fits.get(pool)
            if fit is not None:
                fit.refresh(name)
        self.version = state.version

    def observe(self, shape: Shape) -> None:
        """Learn the request's shape; re-target every pool when the workload republishes
        (deferred while :func:`make_ahead` makes the new target's lists between requests)."""
        if self.workload.observe(shape):
            for pool in self.pools.values():
                pool.retarget(defer=self.ahead)


_INDICES: weakref.WeakKeyDictionary[ClusterState, _Index] = weakref.WeakKeyDictionary()


def _index(state: ClusterState) -> _Index:
    idx = _INDICES.get(state)
    if idx is None or idx.policy is not state.policy:
        idx = _Index(state)
        _INDICES[state] = idx
    else:
        idx.sync(state)
    return idx


def make_ahead(state: ClusterState, budget: int) -> int:
    """One slice of work between requests (the broker's ``WhyWarmer``): the short lists of
    each pool's next target, at most ``budget`` node positions read
    (:class:`.packnext.NextTarget`), then the stalest short lists in use brought up to date
    and those running low carried on (:meth:`.packshort.ShortLists.freshen`). From the
    first call on, a pool's new target waits until its lists are made (or the next one is
    published), so that no request after it pays for a full scan with cold memos. Returns
    the positions and rows read (0: nothing to do)."""
    idx = _index(state)  # (in step with the state)
    idx.ahead = True
    read = 0
    for pool in idx.pools.values():
        if read < budget:
            read += pool.make_ahead(budget - read)
    return read


def _materialise(cand: Candidate, request: Request) -> Placement | None:
    """Turn a candidate's free-unit values into concrete GPUs, checking every limit."""
    ns = cand.view.ns
    if not node_can_host(ns, request):
        return None
    ask = request.gpu
    if ask.is_empty:
        return Placement(ns.node.name, ())
    units = cand.view.units
    if ask.whole:
        chosen = [
            g for g, u in zip(ns.gpus, units, strict=True) if g.idle and u and _model_ok(g, request)
        ]
        if len(chosen) < ask.whole:
            return None
        return Placement(
            ns.node.name,
            tuple(GPUSlice(g.gpu.uuid, g.gpu.memory_mib, UNIT) for g in chosen[: ask.whole]),
        )
    want = cand.take[0]
    for g, u in zip(ns.gpus, units, strict=True):
        if u == want and _fraction_fits(g, request):
            return Placement(ns.node.name, (_slice(g, request),))
    return place_on_node(ns, request)


def _overrides(ask: GPUAsk) -> bool:
    """A fraction whose memory or compute does not scale with it (packing models neither)."""
    return ask.is_fraction and (ask.memory_mib is not None or ask.compute_milli is not None)


def place(state: ClusterState, request: Request, *, observe: bool = True) -> Placement | None:
    """Choose a node and GPU(s) for ``request`` in its pool, or ``None`` if nothing fits.

    ``observe=False`` leaves the learned target workload alone: for a request decided
    again (a queued one retried), whose shape was already counted.
    """
    pool = state.policy.pool(request.pool)
    if pool is None:
        return None
    idx = _index(state)
    if not pool.shares_gpus or _overrides(request.gpu):
        return _best_fit(state, request, idx)
    shape = shape_of(request)
    if observe:
        idx.observe(shape)
    pidx = idx.pools.get(request.pool)
    if pidx is None:
        return None
    cand = pidx.best(request, shape)
    if cand is None:
        return None
    placement = _materialise(cand, request)
    if placement is None:  # a limit the index does not model (explicit memory, say)
        return _best_fit(state, request, idx)
    return placement
