"""Prometheus metrics of the orchestrator, on a registry of their own. What they count is the
orchestrator's own (commands, evaluations, jobs); its reconcile loop's queue depth, reconcile
durations, errors and retries are the shared :class:`common.reconcile.ControllerMetrics`
(``controller="orchestrator"``), registered on the same registry by the loop."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class OrchestratorMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.issues = Counter(
            "tidelease_orchestrator_issues",
            "Commands issued, by framework, command and outcome (ok, failed, gave_up).",
            ["framework", "command", "outcome"],
            registry=r,
        )
        self.issue_latency = Histogram(
            "tidelease_orchestrator_issue_duration_seconds",
            "From the issue to the command's exit, by framework.",
            ["framework"],
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800),
            registry=r,
        )
        self.evaluation = Histogram(
            "tidelease_orchestrator_evaluation_duration_seconds",
            "One DAG evaluation of one job.",
            buckets=(0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.1),
            registry=r,
        )
        self.jobs = Gauge("tidelease_orchestrator_jobs", "Orchestrated jobs known.", registry=r)
        self.invalid = Counter(
            "tidelease_orchestrator_invalid_jobs",
            "Job ConfigMaps whose dependency file or replicas were rejected.",
            registry=r,
        )
        self.hosts_writes = Counter(
            "tidelease_orchestrator_discover_hosts_writes",
            "Writes of a job's discover_hosts ConfigMap (workers came or went).",
            registry=r,
        )
