"""Prometheus metrics of the watched cluster: the GPUs in the GpuNode inventories (by type, tier
and health), who holds them, what is lent, and the node agents' heartbeats.

The node agent exports no metrics of its own; what an admin alerts on for the nodes (an agent
gone silent, devices not healthy) is what the extender sees through its watches, read from its
:class:`~extender.cluster.state.ClusterState` at scrape time. So the figures are those that
placement uses at that moment, with no second bookkeeping to drift from them.

Labels are bounded: GPU type, tier, health or priority for the counts; the node name only in the
two families that list the nodes with a problem (a silent agent, devices not healthy), which are
exported for those nodes alone. One family, off unless asked for (``gpu_info``), has a series per
GPU: :data:`GPU_INFO`, labelled by the GPU's ``UUID`` as NVIDIA's DCGM exporter labels its own, so
that the dashboards can read DCGM's figures by tidelease's tier and holder (a PromQL join on
``UUID``); a cluster with DCGM exports a few dozen series per GPU already.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from extender.cluster.state import ClusterState, NodeState

# (name, help, labels) of every family, in the order collected.
FAMILIES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    (
        "tidelease_cluster_gpus",
        "GPUs in the GpuNode inventories, by type, tier and health (healthy: reported Healthy "
        "by the node's agent; unhealthy: Unhealthy or Unknown). Nodes whose agent is silent "
        "included.",
        ("gpu_type", "tier", "health"),
    ),
    (
        "tidelease_cluster_gpus_held",
        "GPUs allocated to pods in the ledgers (pods seen gone left out), by type, tier and the "
        "holder's priority (high: online jobs, low: borrowers).",
        ("gpu_type", "tier", "priority"),
    ),
    (
        "tidelease_cluster_gpus_lent",
        "GPUs tagged with the online job that lent them (right of return), by type and tier.",
        ("gpu_type", "tier"),
    ),
    (
        "tidelease_cluster_gpus_standby",
        "GPUs tagged standby (kept to backfill reclaims), by type, tier and health.",
        ("gpu_type", "tier", "health"),
    ),
    (
        "tidelease_cluster_gpus_agent_silent",
        "GPUs on nodes whose agent is silent (heartbeat Lease not renewed within the timeout): "
        "not offered to placement, by type and tier.",
        ("gpu_type", "tier"),
    ),
    (
        "tidelease_cluster_nodes",
        "Nodes with a GpuNode, by their agent's heartbeat (ready: renewed within the timeout; "
        "silent: not; no_heartbeat: no Lease seen, not judged).",
        ("agent",),
    ),
    (
        "tidelease_cluster_agent_silent",
        "1 for each node with a GpuNode whose agent is silent; nodes whose agent is not are not "
        "exported.",
        ("node",),
    ),
    (
        "tidelease_cluster_node_unhealthy_gpus",
        "GPUs not healthy (Unhealthy or Unknown) on a node, for the nodes that have some; "
        "nodes with none are not exported.",
        ("node",),
    ),
)

AGENT_STATES = ("ready", "silent", "no_heartbeat")

# The per-GPU family (value 1): ``holder`` online, borrower or none; ``lent`` and ``standby``
# true or false. ``UUID`` as the DCGM exporter names it, so that a join needs no relabelling.
GPU_INFO: tuple[str, str, tuple[str, ...]] = (
    "tidelease_cluster_gpu_info",
    "One series per GPU in the GpuNode inventories (value 1), for joining per-GPU metrics such "
    "as the DCGM exporter's on UUID: its node, type, tier, health, who holds it (online, "
    "borrower or none), whether it is lent (tagged with an online job) and whether standby.",
    ("node", "UUID", "gpu_type", "tier", "health", "holder", "lent", "standby"),
)
HOLDERS = {"high": "online", "low": "borrower"}


def _health(healthy: bool) -> str:
    return "healthy" if healthy else "unhealthy"


Counts = Counter[tuple[str, ...]]


@dataclass(frozen=True, slots=True)
class _NodeSummary:
    """What one node adds to the counts by type and tier."""

    gpus: Counts  # (type, tier, health)
    held: Counts  # (type, tier, priority)
    lent: Counts  # (type, tier)
    standby: Counts  # (type, tier, health)
    by_class: Counts  # (type, tier)
    unhealthy: int


def _summary(state: NodeState) -> _NodeSummary:
    priority_of = {
        u: a.holder.priority.value for a in state.allocations.values() for u in a.devices
    }
    gpus: Counts = Counter()
    held: Counts = Counter()
    lent: Counts = Counter()
    standby: Counts = Counter()
    by_class: Counts = Counter()
    unhealthy = 0
    for d in state.devices:
        cls = d.cls
        tier = cls.tier.name
        health = _health(cls.healthy)
        gpus[(cls.gpu_type, tier, health)] += 1
        by_class[(cls.gpu_type, tier)] += 1
        unhealthy += not cls.healthy
        priority = priority_of.get(d.uuid)
        if priority is not None:
            held[(cls.gpu_type, tier, priority)] += 1
        if cls.owner is not None:
            lent[(cls.gpu_type, tier)] += 1
        if cls.standby:
            standby[(cls.gpu_type, tier, health)] += 1
    return _NodeSummary(gpus, held, lent, standby, by_class, unhealthy)


class ClusterCollector(Collector):
    """The cluster's GPUs and agents as :class:`ClusterState` holds them, read at each scrape.
    Collect from the thread that owns the state (the event loop: /metrics is served there).

    Nodes in the same state (``NodeState.decision_key``: their devices' classes, free or held
    and by whom) add the same counts, so a node's counts are made once per state and kept while
    some node is in it: a scrape of 5,000 nodes costs a few milliseconds of the event loop."""

    def __init__(self, cluster: ClusterState, *, gpu_info: bool = False) -> None:
        self.cluster = cluster
        self.gpu_info = gpu_info
        self._summaries: dict[int, _NodeSummary] = {}

    def describe(self) -> Iterator[GaugeMetricFamily]:
        for name, help_text, labels in (*FAMILIES, GPU_INFO) if self.gpu_info else FAMILIES:
            yield GaugeMetricFamily(name, help_text, labels=labels)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        summaries: dict[int, _NodeSummary] = {}
        nodes: Counter[int] = Counter()  # nodes by state
        silent: Counter[int] = Counter()  # nodes whose agent is silent, by state
        agents: Counts = Counter({(a,): 0 for a in AGENT_STATES})
        silent_nodes: Counts = Counter()
        unhealthy_nodes: Counts = Counter()
        for state in self.cluster:
            if not state.has_inventory:
                continue
            key = state.decision_key
            summary = summaries.get(key)
            if summary is None:
                summary = self._summaries.get(key) or _summary(state)
                summaries[key] = summary
            nodes[key] += 1
            if summary.unhealthy:
                unhealthy_nodes[(state.node,)] = summary.unhealthy
            if state.heartbeat is None:
                agents[("no_heartbeat",)] += 1
            elif state.silent:
                agents[("silent",)] += 1
                silent_nodes[(state.node,)] = 1
                silent[key] += 1
            else:
                agents[("ready",)] += 1
        self._summaries = summaries  # states no node is in any more are forgotten
        gpus: Counts = Counter()
        held: Counts = Counter()
        lent: Counts = Counter()
        standby: Counts = Counter()
        silent_gpus: Counts = Counter()
        for key, n in nodes.items():
            summary = summaries[key]
            for total, part, times in (
                (gpus, summary.gpus, n),
                (held, summary.held, n),
                (lent, summary.lent, n),
                (standby, summary.standby, n),
                (silent_gpus, summary.by_class, silent[key]),
            ):
                for labels, count in part.items():
                    total[labels] += count * times
        silent_gpus = +silent_gpus  # no zeros
        counts = (gpus, held, lent, standby, silent_gpus, agents, silent_nodes, unhealthy_nodes)
        for (name, help_text, labels), values in zip(FAMILIES, counts, strict=True):
            family = GaugeMetricFamily(name, help_text, labels=labels)
            for key_labels, value in sorted(values.items()):
                family.add_metric(list(key_labels), value)
            yield family
        if self.gpu_info:
            yield self._gpu_info()

    def _gpu_info(self) -> GaugeMetricFamily:
        name, help_text, labels = GPU_INFO
        family = GaugeMetricFamily(name, help_text, labels=labels)
        for state in self.cluster:
            if not state.has_inventory:
                continue
            holder = {
                u: HOLDERS.get(a.holder.priority.value, "none")
                for a in state.allocations.values()
                for u in a.devices
            }
            for d in state.devices:
                cls = d.cls
                family.add_metric(
                    [
                        state.node,
                        d.uuid,
                        cls.gpu_type,
                        cls.tier.name,
                        _health(cls.healthy),
                        holder.get(d.uuid, "none"),
                        _bool(cls.owner is not None),
                        _bool(cls.standby),
                    ],
                    1,
                )
        return family


def _bool(value: bool) -> str:
    return "true" if value else "false"


def register(
    cluster: ClusterState, registry: CollectorRegistry, *, gpu_info: bool = False
) -> ClusterCollector:
    """Export ``cluster`` on ``registry`` (with a series per GPU when ``gpu_info``); the
    collector (to unregister it)."""
    collector = ClusterCollector(cluster, gpu_info=gpu_info)
    registry.register(collector)
    return collector
