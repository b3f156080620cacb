"""The leasing controller's own metrics: what lending does (loans, reclaims, evictions, the
standby pool) and the reclaims past their borrowers' notice, read at every scrape.

How the controller's loop fares (queue, reconcile time, errors, retries) is
:class:`common.reconcile.ControllerMetrics`'s, on the same registry under
``controller="leasing"``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector


@dataclass
class LeasingMetrics:
    """What lending does (loans, reclaims, evictions). How the controller's loop fares (queue,
    reconcile time, errors, retries) is :class:`common.reconcile.ControllerMetrics`'s, on the
    same ``registry`` under ``controller="leasing"``."""

    registry: CollectorRegistry
    lent: Gauge = field(init=False)
    view_active: Gauge = field(init=False)
    reclaims: Counter = field(init=False)
    latency: Histogram = field(init=False)
    backfills: Counter = field(init=False)
    evictions: Counter = field(init=False)
    standby: Gauge = field(init=False)
    standby_target: Gauge = field(init=False)
    # (lease, seconds past its notice deadline) of each reclaim under way past it; read at
    # every scrape (the controller points it at its lease cache).
    overdue: Callable[[], Iterable[tuple[str, float]]] = field(init=False)

    def __post_init__(self) -> None:
        r = self.registry
        self.overdue = lambda: ()
        r.register(_OverdueCollector(self))
        self.lent = Gauge(
            "tidelease_leasing_lent_gpus", "GPUs lent, by lease.", ["lease"], registry=r
        )
        self.view_active = Gauge(
            "tidelease_leasing_view_active",
            "1 while the controller watches the cluster (pods, GpuNodes, ledgers, agents' "
            "Leases): while a GpuLease exists or standby targets are set; else 0.",
            registry=r,
        )
        self.reclaims = Counter(
            "tidelease_leasing_reclaims", "Completed reclaims.", ["lease"], registry=r
        )
        self.latency = Histogram(
            "tidelease_leasing_reclaim_duration_seconds",
            "From the reclaim decision to the owner's pods placed and tags cleared.",
            buckets=(5, 15, 30, 45, 60, 75, 90, 120, 180, 300, 600),
            registry=r,
        )
        self.backfills = Counter(
            "tidelease_leasing_backfilled_gpus",
            "Standby GPUs given instead of lent ones.",
            registry=r,
        )
        self.evictions = Counter(
            "tidelease_leasing_evictions", "Borrower pods evicted after their notice.", registry=r
        )
        self.standby = Gauge(
            "tidelease_leasing_standby_gpus",
            "Healthy GPUs in the standby pool (free or on loan), by type and tier, as of the "
            "last top-up.",
            ["gpu_type", "tier"],
            registry=r,
        )
        self.standby_target = Gauge(
            "tidelease_leasing_standby_target_gpus",
            "The standby pool's target, by type and tier (the extender's standby setting).",
            ["gpu_type", "tier"],
            registry=r,
        )


class _OverdueCollector(Collector):
    def __init__(self, metrics: LeasingMetrics) -> None:
        self._metrics = metrics

    def describe(self) -> Iterable[Metric]:
        return [self._family()]

    def collect(self) -> Iterable[Metric]:
        family = self._family()
        for lease, late in self._metrics.overdue():
            family.add_metric([lease], late)
        return [family]

    @staticmethod
    def _family() -> GaugeMetricFamily:
        return GaugeMetricFamily(
            "tidelease_leasing_reclaim_overdue_seconds",
            "Seconds past the borrowers' notice of each reclaim still under way (only leases "
            "whose reclaim is past it).",
            labels=["lease"],
        )
