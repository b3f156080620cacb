"""Prometheus metrics of the extender, on a registry of their own (one per server instance)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class ExtenderMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "tidelease_extender_requests",
            "Extender calls by verb and outcome (ok, error, bad_request).",
            ["verb", "outcome"],
            registry=r,
        )
        self.latency = Histogram(
            "tidelease_extender_request_duration_seconds",
            "Time to answer an extender call, by verb.",
            ["verb"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.decisions = Counter(
            "tidelease_extender_decisions",
            "Placement decisions by verb and reason (fits, a rejection reason, bound, ...).",
            ["verb", "reason"],
            registry=r,
        )
        self.bind_conflicts = Counter(
            "tidelease_extender_ledger_conflicts",
            "Allocation-ledger writes that lost a race and were retried.",
            registry=r,
        )
        self.released = Counter(
            "tidelease_extender_allocations_released",
            "Allocations removed from the ledger, by reason.",
            ["reason"],
            registry=r,
        )
        self.allocated_gpus = Gauge(
            "tidelease_extender_allocated_gpus",
            "GPUs held by pods according to the allocation ledgers.",
            registry=r,
        )
        self.nodes = Gauge(
            "tidelease_extender_nodes", "Nodes with a GpuNode inventory.", registry=r
        )
