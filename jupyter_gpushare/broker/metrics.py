"""Prometheus metrics of the broker (own registry, so several brokers can live in one process)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from ..core.model import from_milli

if TYPE_CHECKING:
    from .service import Broker


class _StateCollector(Collector):
    def __init__(self, metrics: BrokerMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[GaugeMetricFamily]:
        broker = self.metrics.broker
        grants = GaugeMetricFamily("gpushare_grants", "Live grants", labels=["pool", "kind"])
        units = GaugeMetricFamily(
            "gpushare_units_in_use", "GPU units in use", labels=["team", "pool"]
        )
        borrowed = GaugeMetricFamily(
            "gpushare_units_borrowed",
            "GPU units borrowed above the guarantee",
            labels=["team", "pool"],
        )
        capacity = GaugeMetricFamily(
            "gpushare_pool_capacity_units", "GPU units of a pool (uncordoned)", labels=["pool"]
        )
        queue = GaugeMetricFamily("gpushare_queue_length", "Queued requests", labels=["pool"])
        preempting = GaugeMetricFamily(
            "gpushare_preempting_requests", "Requests waiting for victims"
        )
        if broker is not None:
            counts: dict[tuple[str, str], int] = defaultdict(int)
            for g in broker.state.grants.values():
                counts[(g.pool, g.request.kind.value)] += 1
            for (pool, kind), n in sorted(counts.items()):
                grants.add_metric([pool, kind], n)
            for (team, pool), milli in sorted(broker.state.usage.items()):
                units.add_metric([team, pool], from_milli(milli))
            for (team, pool), milli in sorted(broker.state.borrowed.items()):
                borrowed.add_metric([team, pool], from_milli(milli))
            for pool_obj in broker.policy.pools:
                capacity.add_metric(
                    [pool_obj.name], from_milli(broker.state.pool_capacity_milli(pool_obj.name))
                )
                queue.add_metric(
                    [pool_obj.name],
                    sum(1 for r in broker.queue.values() if r.pool == pool_obj.name),
                )
            preempting.add_metric([], len(broker.pending))
        yield from (grants, units, borrowed, capacity, queue, preempting)


class BrokerMetrics:
    """Counters fed by the service (it is the service's ``Observer``) plus state gauges."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.broker: Broker | None = None
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
            "gpushare_releases", "Grants released", ["reason"], registry=self.registry
        )
        self.latency = Histogram(
            "gpushare_request_latency_seconds",
            "HTTP request latency",
            ["handler", "method"],
            buckets=(0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
            registry=self.registry,
        )
        self.registry.register(_StateCollector(self))
        # label children resolved once (``labels()`` costs a lock and a tuple per call)
        self._latency: dict[tuple[str, str], Any] = {}
        self._admissions: dict[tuple[str, str, str], tuple[Any, Any]] = {}

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

    def preemption(self, reason: str, count: int) -> None:
        if count:
            self.preemptions.labels(reason).inc(count)

    def release(self, reason: str) -> None:
        self.releases.labels(reason).inc()
