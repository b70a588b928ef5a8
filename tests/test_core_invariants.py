"""Property-based (stateful) tests of the core's invariants.

A random sequence of requests, preemptions and releases runs against one
``ClusterState``. After every step:

* no GPU holds more memory or compute than it has (fractions stay under the headroom);
* no node gives out more CPU or RAM than it has;
* no team is above guarantee + borrow limit in any pool;
* the usage counters equal what the live grants add up to;
* all of the above is recounted from the grants themselves (:func:`recount`), never read
  from the state's own counters, and grants made by hand that over-commit a GPU or a node
  are refused by ``apply`` without changing anything;
* victims of a preemption are only borrowed grants of other teams or preemptible
  lower-priority grants, never an interactive server inside its own guarantee;
* a request inside its team's guarantee that is not admitted could not have been
  placed even with every allowed victim gone;
and at the end releasing everything returns the cluster to empty.
"""

from __future__ import annotations

from collections import defaultdict

import hypothesis.strategies as st
from corefactory import PRIORITIES, policy, request
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from jupyter_gpushare.core.admission import AdmissionFacts, Outcome, decide
from jupyter_gpushare.core.model import (
    UNIT,
    GPUSlice,
    Grant,
    Kind,
    Placement,
    PriorityClass,
    SharingMode,
)
from jupyter_gpushare.core.placement import place_on_node
from jupyter_gpushare.core.preemption import _fits_without, is_candidate
from jupyter_gpushare.core.state import CapacityError, ClusterState

TEAMS = ("a", "b", "c")
POOLS = {"train": SharingMode.EXCLUSIVE, "shared": SharingMode.SHARED, "debug": SharingMode.DEBUG}
QUOTAS = {
    "a": {"train": (3, 2), "shared": (2, 1), "debug": (1, 0)},
    "b": {"train": (3, 0), "shared": (1, 2), "debug": (1, 0.5)},
    "c": {"train": (2, 4), "shared": (1, 1), "debug": (0.5, 0.5)},
    # grants made by hand (see CoreMachine.force): a quota that never limits them
    "z": {"train": (100, 0), "shared": (100, 0), "debug": (100, 0)},
}
PRIORITY_VALUES = {"training": 1000, "interactive": 500, "research": 100, "spot": 50}
# "spot" is preemptible and interactive servers may run at it: only the rule "never an
# interactive server inside its guarantee" keeps those servers from being victims
PRIORITY_CLASSES = PRIORITIES + (PriorityClass("spot", 50, preemptible=True, grace_period_s=5),)


def recount(state: ClusterState, quotas: bool = True) -> None:
    """The capacity invariants, recounted from the live grants alone.

    Nothing here reads the state's own counters (``used_mib``, ``holders``, ``free_cpu``,
    ``usage``...): each GPU's and node's load is summed again from the grants' slices and
    compared with what the policy says the hardware has, so a bookkeeping or capacity-check
    bug in ``ClusterState`` cannot hide itself. ``quotas=False`` skips the team and user
    limits (for placement tests whose policy has no quotas).
    """
    policy = state.policy
    gpus = {g.uuid: (n, g) for n in policy.nodes for g in n.gpus}
    nodes = {n.name: n for n in policy.nodes}
    mib: dict[str, int] = defaultdict(int)
    compute: dict[str, int] = defaultdict(int)
    holders: dict[str, int] = defaultdict(int)
    whole_on: dict[str, int] = defaultdict(int)
    cpu: dict[str, int] = defaultdict(int)
    ram: dict[str, int] = defaultdict(int)
    team_units: dict[tuple[str, str], int] = defaultdict(int)
    user_units: dict[tuple[str, str], int] = defaultdict(int)
    for grant in state.grants.values():
        node = nodes[grant.placement.node]
        assert node.pool == grant.pool, f"{grant.id} sits in pool {node.pool}, not {grant.pool}"
        cpu[node.name] += grant.request.cpu_milli
        ram[node.name] += grant.request.memory_mib
        team_units[(grant.team, grant.pool)] += grant.units_milli
        user_units[(grant.user, grant.pool)] += grant.units_milli
        for sl in grant.placement.slices:
            owner, _ = gpus[sl.gpu_uuid]
            assert owner.name == node.name, f"{grant.id}: GPU {sl.gpu_uuid} is not on {node.name}"
            mib[sl.gpu_uuid] += sl.memory_mib
            compute[sl.gpu_uuid] += sl.compute_milli
            holders[sl.gpu_uuid] += 1
            if grant.request.gpu.whole:
                whole_on[sl.gpu_uuid] += 1
    for name, node in nodes.items():
        assert cpu[name] <= node.cpu_milli, f"node {name}: {cpu[name]} of {node.cpu_milli} CPU"
        assert ram[name] <= node.memory_mib, f"node {name}: {ram[name]} of {node.memory_mib} RAM"
    for uuid, (node, gpu) in gpus.items():
        pool = policy.pool(node.pool)
        assert pool is not None
        if whole_on[uuid] or not pool.shares_gpus:
            assert holders[uuid] <= 1, f"GPU {uuid} held whole but has {holders[uuid]} holders"
            assert mib[uuid] <= gpu.memory_mib
            continue
        shareable = int(gpu.memory_mib * (1.0 - pool.memory_headroom))
        assert mib[uuid] <= shareable, f"GPU {uuid}: {mib[uuid]} of {shareable} MiB granted"
        assert compute[uuid] <= UNIT, f"GPU {uuid}: {compute[uuid]} of {UNIT} milli compute"
    if not quotas:
        return
    for (team, pool_name), used in team_units.items():
        quota = policy.team(team).quota(pool_name)  # type: ignore[union-attr]
        assert quota is not None, f"team {team} holds {used} milli in {pool_name} without quota"
        limit = quota.guaranteed_milli + quota.borrow_limit_milli
        assert used <= limit, f"team {team} holds {used} of {limit} milli in {pool_name}"
    caps = {
        (t.name, p): q.per_user_cap_milli for t in policy.teams for p, q in t.quotas
    }
    for (user, pool_name), used in user_units.items():
        # admission checks a user's total in the pool against the cap of the asking team
        teams = {g.team for g in state.grants.values() if g.user == user and g.pool == pool_name}
        found = [caps.get((team, pool_name)) for team in teams]
        if found and None not in found:
            cap = max(c for c in found if c is not None)
            assert used <= cap, f"user {user}: {used} of {cap} milli in {pool_name}"


def check_state(state: ClusterState) -> None:
    """Every capacity and quota invariant of a state: recounted from the grants, and the
    state's own counters agreeing with that recount."""
    recount(state)
    for ns in state.nodes.values():
        assert 0 <= ns.free_cpu <= ns.node.cpu_milli
        assert 0 <= ns.free_mem <= ns.node.memory_mib
        on = [g for g in state.grants.values() if g.placement.node == ns.node.name]
        assert ns.free_cpu == ns.node.cpu_milli - sum(g.request.cpu_milli for g in on)
        assert ns.free_mem == ns.node.memory_mib - sum(g.request.memory_mib for g in on)
        for gs in ns.gpus:
            slices = [sl for g in on for sl in g.placement.slices if sl.gpu_uuid == gs.gpu.uuid]
            assert gs.holders == len(slices)
            assert gs.used_mib == sum(sl.memory_mib for sl in slices)
            assert gs.used_compute == sum(sl.compute_milli for sl in slices)
    usage: dict[tuple[str, str], int] = defaultdict(int)
    for grant in state.grants.values():
        usage[(grant.team, grant.pool)] += grant.units_milli
    for (team, pool), used in usage.items():
        assert state.team_used(team, pool) == used
    assert {k: v for k, v in state.usage.items() if v} == {k: v for k, v in usage.items() if v}


def _snapshot(state: ClusterState) -> tuple:
    gpus = tuple(
        (g.gpu.uuid, g.used_mib, g.used_compute, g.holders, g.whole)
        for ns in state.nodes.values() for g in ns.gpus
    )
    nodes = tuple((ns.node.name, ns.free_cpu, ns.free_mem) for ns in state.nodes.values())
    usage = {k: v for k, v in state.usage.items() if v}
    return gpus, nodes, sorted(state.grants), usage, state.version


class CoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.state = ClusterState(policy(QUOTAS, POOLS, node_count=2, gpus=4,
                                         priorities=PRIORITY_CLASSES))
        self.now = 0.0
        self.serial = 0

    def _id(self) -> str:
        self.serial += 1
        return f"g{self.serial}"

    @rule(
        team=st.sampled_from(TEAMS),
        pool=st.sampled_from(sorted(POOLS)),
        whole=st.integers(0, 3),
        fraction=st.sampled_from([0.125, 0.25, 0.3, 0.5, 0.8, 1.0]),
        priority=st.sampled_from(sorted(PRIORITY_VALUES)),
        batch=st.booleans(),
    )
    def ask(self, team: str, pool: str, whole: int, fraction: float, priority: str,
            batch: bool) -> None:
        self.now += 60
        if POOLS[pool] is not SharingMode.SHARED and whole == 0:
            whole = 1
        kind = Kind.BATCH if batch else Kind.INTERACTIVE
        req = request(team, pool, whole=whole, fraction=0.0 if whole else fraction,
                      priority=priority, kind=kind, checkpointing=True)
        before = dict(self.state.grants)
        decision = decide(self.state, req, self._id(), AdmissionFacts(now=self.now))
        assert dict(self.state.grants) == before, "decide must not change the state"
        if decision.outcome is Outcome.GRANTED:
            assert decision.grant is not None
            self.state.apply(decision.grant)
        elif decision.outcome is Outcome.PREEMPTING:
            self._carry_out(req, decision)
        else:
            self._check_not_admissible(req, decision)

    def _carry_out(self, req, decision) -> None:  # type: ignore[no-untyped-def]
        value = PRIORITY_VALUES[req.priority]
        assert decision.victims
        for victim_id in decision.victims:
            victim = self.state.grants[victim_id]
            assert is_candidate(victim, req, value)
            assert victim.borrowed or victim.request.kind is not Kind.INTERACTIVE
            assert victim.borrowed or victim.priority_value < value
        for victim_id in decision.victims:
            self.state.release(victim_id)
        again = decide(self.state, req, self._id(), AdmissionFacts(now=self.now))
        assert again.outcome is Outcome.GRANTED, again.reason
        assert again.grant is not None
        self.state.apply(again.grant)

    def _check_not_admissible(self, req, decision) -> None:  # type: ignore[no-untyped-def]
        assert decision.reason
        quota = self.state.policy.team(req.team).quota(req.pool)
        used = self.state.team_used(req.team, req.pool)
        inside = used + req.gpu.units_milli <= quota.guaranteed_milli
        if not inside or decision.code != "no_capacity" or POOLS[req.pool] is SharingMode.DEBUG:
            return
        value = PRIORITY_VALUES[req.priority]
        for ns in self.state.by_pool[req.pool]:
            gone = [g for g in self.state.grants_in(req.pool)
                    if g.placement.node == ns.node.name and is_candidate(g, req, value)]
            assert _fits_without(ns, gone, req) is None, (
                f"refused {req} although preempting {len(gone)} grants on {ns.node.name} fits it"
            )

    @precondition(lambda self: bool(self.state.grants))
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        grant_id = data.draw(st.sampled_from(sorted(self.state.grants)))
        self.state.release(grant_id)

    @rule(data=st.data())
    def force(self, data: st.DataObject) -> None:
        """A grant made by hand, not by placement (a database row, a bug elsewhere), that
        may over-commit its GPU: ``apply`` must refuse it and change nothing, or accept it
        only if the recount of every GPU still holds (the invariant checks that)."""
        name = data.draw(st.sampled_from(sorted(self.state.nodes)))
        ns = self.state.nodes[name]
        gpus = [g.gpu for g in ns.gpus]
        if ns.pool.shares_gpus and data.draw(st.booleans()):
            gpu = data.draw(st.sampled_from(gpus))
            shareable = ns.gpus[0].capacity_mib
            mib = data.draw(st.one_of(
                st.sampled_from([shareable // 8, shareable // 4, shareable // 2, shareable]),
                st.integers(1, gpu.memory_mib)))
            compute = data.draw(st.one_of(st.sampled_from([125, 250, 500, 600, UNIT]),
                                          st.integers(1, UNIT)))
            req = request("z", ns.pool.name, fraction=data.draw(st.sampled_from([0.125, 0.5])))
            slices: tuple[GPUSlice, ...] = (GPUSlice(gpu.uuid, mib, compute),)
        else:
            chosen = data.draw(st.permutations(gpus))[: data.draw(st.integers(1, len(gpus)))]
            req = request("z", ns.pool.name, whole=len(chosen))
            slices = tuple(GPUSlice(g.uuid, g.memory_mib, UNIT) for g in chosen)
        grant = Grant(self._id(), req, Placement(name, slices), req.gpu.units_milli,
                      False, 500, False, self.now)
        before = _snapshot(self.state)
        try:
            self.state.apply(grant)
        except CapacityError:
            assert _snapshot(self.state) == before, "a refused grant changed the state"

    @invariant()
    def capacities_hold(self) -> None:
        check_state(self.state)

    def teardown(self) -> None:
        for grant_id in list(self.state.grants):
            self.state.release(grant_id)
        for ns in self.state.nodes.values():
            assert ns.free_cpu == ns.node.cpu_milli and ns.free_mem == ns.node.memory_mib
            for gs in ns.gpus:
                assert (gs.used_mib, gs.used_compute, gs.holders, gs.whole) == (0, 0, 0, False)
        assert not any(self.state.usage.values())
        assert not any(self.state.borrowed.values())


CoreMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestCoreMachine = CoreMachine.TestCase


class GuaranteeMachine(RuleBasedStateMachine):
    """Whole single GPUs in an exclusive pool whose guarantees add up to its capacity:
    a request inside its team's guarantee is always admitted, by preemption if needed."""

    def __init__(self) -> None:
        super().__init__()
        quotas = {"a": {"train": (3, 5)}, "b": {"train": (3, 5)}, "c": {"train": (2, 6)}}
        self.state = ClusterState(policy(quotas, {"train": SharingMode.EXCLUSIVE}, node_count=2,
                                         priorities=PRIORITY_CLASSES))
        self.serial = 0
        self.now = 0.0

    @rule(team=st.sampled_from(TEAMS), priority=st.sampled_from(sorted(PRIORITY_VALUES)))
    def ask(self, team: str, priority: str) -> None:
        self.serial += 1
        self.now += 1
        req = request(team, "train", whole=1, priority=priority, kind=Kind.INTERACTIVE)
        quota = self.state.policy.team(team).quota("train")  # type: ignore[union-attr]
        inside = self.state.team_used(team, "train") + UNIT <= quota.guaranteed_milli
        decision = decide(self.state, req, f"g{self.serial}", AdmissionFacts(now=self.now))
        if decision.outcome is Outcome.PREEMPTING:
            for victim in decision.victims:
                self.state.release(victim)
            decision = decide(self.state, req, f"g{self.serial}b", AdmissionFacts(now=self.now))
        if inside:
            assert decision.outcome is Outcome.GRANTED, decision.reason
        if decision.outcome is Outcome.GRANTED:
            assert decision.grant is not None
            self.state.apply(decision.grant)

    @precondition(lambda self: bool(self.state.grants))
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        self.state.release(data.draw(st.sampled_from(sorted(self.state.grants))))

    @invariant()
    def capacities_hold(self) -> None:
        check_state(self.state)


GuaranteeMachine.TestCase.settings = settings(
    max_examples=100, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestGuaranteeMachine = GuaranteeMachine.TestCase


def test_place_on_node_never_overfills_a_shared_gpu() -> None:
    state = ClusterState(policy({"a": {"shared": (4, 0)}}, {"shared": SharingMode.SHARED}))
    ns = state.by_pool["shared"][0]
    placed = 0
    while True:
        req = request("a", "shared", fraction=0.25)
        placement = place_on_node(ns, req)
        if placement is None:
            break
        decision = decide(state, req, f"x{placed}")
        assert decision.grant is not None
        state.apply(decision.grant)
        placed += 1
    # a quarter is a quarter of the shareable 80 %: four per card, the headroom stays free
    assert placed == 16
    for gs in ns.gpus:
        assert gs.gpu.memory_mib - gs.used_mib >= 0.2 * gs.gpu.memory_mib
    check_state(state)


def test_eight_eighths_fit_an_h200_with_headroom() -> None:
    from jupyter_gpushare.core.model import GPU, GPUAsk

    h200 = GPU("GPU-x", "H200", 144384)
    shareable = int(144384 * 0.8)
    eighth = GPUAsk(fraction_milli=125)
    assert 8 * eighth.memory_on(h200, shareable) <= shareable
    assert 8 * eighth.compute_on() <= UNIT
