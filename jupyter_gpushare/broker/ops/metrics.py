"""Prometheus metrics of the broker (own registry, so several brokers can live in one process).

Names, units and labels follow the Prometheus conventions (``promtool check metrics`` is
clean, ``tests/test_prometheus.py``): GPU amounts are in GPUs (1 = a whole GPU, a quarter
share 0.25), time in seconds, power in watts, shares as ``_ratio``; counters end in
``_total``. The state gauges are computed from the broker's memory at each scrape.

===========================================  =================  =================================
metric                                       labels             meaning
===========================================  =================  =================================
gpushare_grants                              pool, kind         live grants
gpushare_team_used_gpus                      team, pool         GPUs the team's grants hold
gpushare_team_borrowed_gpus                  team, pool         of which above the guarantee
gpushare_team_guaranteed_gpus                team, pool         the policy's guarantee
gpushare_team_borrow_limit_gpus              team, pool         how far above it the team may go
gpushare_team_measured_gpus                  team, pool         held by grants with a fresh
                                                                heartbeat
gpushare_team_busy_gpus                      team, pool         of those, computing (each GPU:
                                                                min(share, utilisation))
gpushare_team_month_gpu_seconds              team, pool         granted this month (UTC)
gpushare_team_month_budget_gpu_seconds       team, pool         the monthly budget, if any
gpushare_pool_capacity_gpus                  pool               GPUs of uncordoned nodes
gpushare_pool_queued_requests                pool               requests in the queue
gpushare_preempting_requests                 (none)             requests waiting for victims
gpushare_node_power_watts                    node, pool         sum of the node's GPUs' latest
                                                                power (heartbeats, 2 min)
gpushare_node_drained                        node, pool         1 when drained (cordoned)
gpushare_admissions_total                    pool, outcome,     admission decisions
                                             code
gpushare_refusals_total                      pool, code         refused requests
gpushare_preemptions_total                   reason             grants preempted
gpushare_releases_total                      reason             grants ended, by end kind
                                                                (core.grant_end: released,
                                                                preempted, culled, expired,
                                                                node_lost, reconciled, policy)
gpushare_culls_total                         pool, action       servers culled by the GPU
                                                                idle culler
gpushare_http_request_duration_seconds       handler, method    HTTP request latency
gpushare_decision_cpu_seconds                pool               CPU time of each admission
                                                                decision of the core (the
                                                                broker's thread: a garbage
                                                                collection begun inside counts)
===========================================  =================  =================================
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from ...core.grant_end import ALL_KINDS
from ...core.model import from_milli

if TYPE_CHECKING:
    from ..service.broker import Broker
    from .whywarm import WhyWarmer

FRESH_S = 120.0  # a heartbeat older than this no longer counts as measured


class _StateCollector(Collector):
    def __init__(self, metrics: BrokerMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        broker = self.metrics.broker
        tp = ["team", "pool"]
        g = GaugeMetricFamily
        grants = g("gpushare_grants", "Live grants", labels=["pool", "kind"])
        used = g("gpushare_team_used_gpus", "GPUs held by the team's live grants", labels=tp)
        borrowed = g("gpushare_team_borrowed_gpus", "GPUs the team holds above its guarantee",
                     labels=tp)
        guaranteed = g("gpushare_team_guaranteed_gpus", "The team's guaranteed GPUs",
                       labels=tp)
        limit = g("gpushare_team_borrow_limit_gpus",
                  "GPUs the team may borrow above its guarantee", labels=tp)
        measured = g("gpushare_team_measured_gpus",
                     "GPUs held by the team's grants that sent a heartbeat lately", labels=tp)
        busy = g("gpushare_team_busy_gpus",
                 "Measured GPUs weighted by utilisation (per GPU min(share, utilisation))",
                 labels=tp)
        month = g("gpushare_team_month_gpu_seconds",
                  "GPU-seconds granted to the team this month (UTC)", labels=tp)
        budget = g("gpushare_team_month_budget_gpu_seconds",
                   "The team's monthly GPU budget in GPU-seconds", labels=tp)
        capacity = g("gpushare_pool_capacity_gpus", "GPUs of the pool's uncordoned nodes",
                     labels=["pool"])
        queue = g("gpushare_pool_queued_requests", "Requests in the pool's queue",
                  labels=["pool"])
        preempting = g("gpushare_preempting_requests", "Requests waiting for victims")
        power = g("gpushare_node_power_watts",
                  "Power of the node's GPUs (latest heartbeat of each, last 2 minutes)",
                  labels=["node", "pool"])
        drained = g("gpushare_node_drained", "1 when the node is drained (cordoned)",
                    labels=["node", "pool"])
        backlog = g("gpushare_commit_backlog",
                    "Changes applied and waiting for their group commit")
        groups = CounterMetricFamily(
            "gpushare_commit_groups",
            "Group commits done since the broker started (BrokerApp.commit_mode thread or async)",
        )
        warm_steps = CounterMetricFamily(
            "gpushare_why_warm_steps",
            "Steps between requests that read nodes into the refusal tables made ahead "
            "or node positions into the next placement targets' lists, or rows into the "
            "short lists in use "
            "(BrokerApp.why_warm_interval_s, why_warm_positions)",
        )
        warm_seconds = CounterMetricFamily(
            "gpushare_why_warm_seconds",
            "Seconds of the event loop those steps took (the background cost of the refusal "
            "tables, the next placement targets made ahead and the short lists kept up)",
        )
        warmer = self.metrics.warmer
        warm_steps.add_metric([], warmer.steps if warmer else 0)
        warm_seconds.add_metric([], warmer.busy_s if warmer else 0.0)
        families = (grants, used, borrowed, guaranteed, limit, measured, busy, month, budget,
                    capacity, queue, preempting, power, drained, backlog, groups, warm_steps,
                    warm_seconds)
        if broker is None:
            yield from families
            return
        commits = broker.commits
        backlog.add_metric([], commits.backlog if commits else 0)
        groups.add_metric([], commits.groups if commits else 0)
        state = broker.state
        now = broker.clock()
        counts: dict[tuple[str, str], int] = defaultdict(int)
        meas: dict[tuple[str, str], float] = defaultdict(float)
        bus: dict[tuple[str, str], float] = defaultdict(float)
        usage = broker.usage
        for gr in state.grants.values():
            counts[(gr.pool, gr.request.kind.value)] += 1
            seen = usage.last_seen.get(gr.id)
            if seen is None or now - seen > FRESH_S:
                continue
            key = (gr.team, gr.pool)
            meas[key] += from_milli(gr.units_milli)
            util = {
                i.get("uuid"): float(i.get("utilization_pct") or 0.0)
                for i in usage.last_gpus.get(gr.id, ())
            }
            for sl in gr.placement.slices:
                bus[key] += min(sl.compute_milli / 1000.0, util.get(sl.gpu_uuid, 0.0) / 100.0)
        for (pool, kind), n in sorted(counts.items()):
            grants.add_metric([pool, kind], n)
        ledger = broker.month_hours(now)
        for team in broker.policy.teams:
            for pool, quota in team.quotas:
                key = (team.name, pool)
                labels = [team.name, pool]
                used.add_metric(labels, from_milli(state.usage.get(key, 0)))
                borrowed.add_metric(labels, from_milli(state.borrowed.get(key, 0)))
                guaranteed.add_metric(labels, from_milli(quota.guaranteed_milli))
                limit.add_metric(labels, from_milli(quota.borrow_limit_milli))
                measured.add_metric(labels, meas.get(key, 0.0))
                busy.add_metric(labels, bus.get(key, 0.0))
                month.add_metric(labels, ledger.hours(key, now) * 3600.0)
                if quota.gpu_hours_per_month is not None:
                    budget.add_metric(labels, quota.gpu_hours_per_month * 3600.0)
        for pool_obj in broker.policy.pools:
            capacity.add_metric(
                [pool_obj.name], from_milli(state.pool_capacity_milli(pool_obj.name))
            )
            queue.add_metric(
                [pool_obj.name], sum(1 for r in broker.queue.values() if r.pool == pool_obj.name)
            )
        preempting.add_metric([], len(broker.pending))
        for node in broker.policy.nodes:
            latest = usage.last_power.get(node.name, {})
            watts = [w for ts, w in latest.values() if now - ts <= FRESH_S]
            if watts:
                power.add_metric([node.name, node.pool], sum(watts))
            drained.add_metric(
                [node.name, node.pool], 1.0 if state.nodes[node.name].cordoned else 0.0
            )
        yield from families


class BrokerMetrics:
    """Counters fed by the service (it is the service's ``Observer``) plus state gauges."""

    #: refusal codes whose counters start at 0 for every pool (so dashboards show 0, not
    #: "no data", until the first refusal)
    KNOWN_REFUSALS = ("quota", "user_cap", "budget", "no_capacity", "invalid")

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._broker: Broker | None = None
        self.warmer: WhyWarmer | None = None  # the refusal tables made ahead, once serving
        self.admissions = Counter(
            "gpushare_admissions",
            "Admission decisions",
            ["pool", "outcome", "code"],
            registry=self.registry,
        )
        self.refusals = Counter(
            "gpushare_refusals",
            "Refused requests by reason",
            ["pool", "code"],
            registry=self.registry,
        )
        self.preemptions = Counter(
            "gpushare_preemptions",
            "Grants preempted (victims noticed)",
            ["reason"],
            registry=self.registry,
        )
        self.releases = Counter(
            "gpushare_releases",
            "Grants ended, by the kind of their end record (released, preempted, culled, "
            "expired, node_lost, reconciled, policy)",
            ["reason"],
            registry=self.registry,
        )
        for kind in ALL_KINDS:
            self.releases.labels(kind)
        self.culls = Counter(
            "gpushare_culls",
            "Servers stopped or moved to the CPU-only profile by the GPU idle culler",
            ["pool", "action"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "gpushare_http_request_duration_seconds",
            "HTTP request latency",
            ["handler", "method"],
            buckets=(0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
            registry=self.registry,
        )
        self.decision_cpu = Histogram(
            "gpushare_decision_cpu_seconds",
            "CPU time of each admission decision of the core (placement included; a garbage "
            "collection that began inside counts)",
            ["pool"],
            buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1),
            registry=self.registry,
        )
        self.registry.register(_StateCollector(self))
        # label children resolved once (``labels()`` costs a lock and a tuple per call)
        self._latency: dict[tuple[str, str], Any] = {}
        self._admissions: dict[tuple[str, str, str], tuple[Any, Any]] = {}
        self._decision_cpu: dict[str, Any] = {}

    @property
    def broker(self) -> Broker | None:
        return self._broker

    @broker.setter
    def broker(self, broker: Broker | None) -> None:
        """Attach the broker; counters of its pools start at 0 (conventional for known
        label values)."""
        self._broker = broker
        if broker is None:
            return
        self.preemptions.labels("preempting")
        for pool in broker.policy.pools:
            for action in ("stop", "cpu"):
                self.culls.labels(pool.name, action)
            for code in self.KNOWN_REFUSALS:
                self.refusals.labels(pool.name, code)

    def observe_latency(self, handler: str, method: str, seconds: float) -> None:
        child = self._latency.get((handler, method))
        if child is None:
            child = self._latency[(handler, method)] = self.latency.labels(handler, method)
        child.observe(seconds)

    def admission(self, pool: str, outcome: str, code: str) -> None:
        key = (pool, outcome, code)
        children = self._admissions.get(key)
        if children is None:
            refused = self.refusals.labels(pool, code) if outcome == "refused" else None
            children = self._admissions[key] = (self.admissions.labels(*key), refused)
        children[0].inc()
        if children[1] is not None:
            children[1].inc()

    def decision(self, pool: str, cpu_s: float) -> None:
        child = self._decision_cpu.get(pool)
        if child is None:
            child = self._decision_cpu[pool] = self.decision_cpu.labels(pool)
        child.observe(cpu_s)

    def preemption(self, reason: str, count: int) -> None:
        if count:
            self.preemptions.labels(reason).inc(count)

    def release(self, reason: str) -> None:
        """One grant ended; ``reason`` is its end kind (the grant's end record)."""
        self.releases.labels(reason).inc()

    def cull(self, pool: str, action: str) -> None:
        self.culls.labels(pool, action).inc()
