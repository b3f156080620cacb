"""The cluster's GPUs and agents as the extender exports them (extender/cluster/metrics.py): what a
scrape reads from ClusterState, by type, tier, health, holder and heartbeat."""

from __future__ import annotations

from datetime import datetime

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.registry import DuplicateTimeseries

from common import builders
from common.model import Priority, Tier
from extender.cluster import metrics as cluster_metrics
from extender.cluster.metrics import FAMILIES
from tests.unit.cluster import allocate, cluster, holder

T0 = "2026-11-21T10:00:00.000000Z"


def lease(node: str, renewed: str) -> dict[str, object]:
    return {
        "metadata": {"name": f"tidelease-agent-{node}", "namespace": "tidelease-system"},
        "spec": {"holderIdentity": node, "renewTime": renewed, "leaseDurationSeconds": 60},
    }


def samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in registry.collect()
        for s in family.samples
    }


def test_gpus_by_type_tier_health_holder_and_tags() -> None:
    state = cluster(
        builders.gpu_node(
            "a",
            [
                *builders.devices("a", 4),  # H20 HA healthy
                *builders.devices("a", 2, start=4, healthy=False),
                *builders.devices("a", 2, start=6, tier=Tier.MA, owner="online"),
            ],
        ),
        builders.gpu_node("b", builders.devices("b", 3, gpu_type="A100", standby=True)),
    )
    a = [builders.device_uuid("a", i) for i in range(8)]
    allocate(
        state,
        "a",
        [
            (holder("owner-0", priority=Priority.HIGH, owner="online"), [a[0], a[1]]),
            (holder("borrower-0"), [a[6]]),
        ],
    )
    registry = CollectorRegistry()
    cluster_metrics.register(state, registry)
    got = samples(registry)

    def at(name: str, **labels: str) -> float:
        return got[(name, tuple(sorted(labels.items())))]

    assert at("tidelease_cluster_gpus", gpu_type="H20", tier="HA", health="healthy") == 4
    assert at("tidelease_cluster_gpus", gpu_type="H20", tier="HA", health="unhealthy") == 2
    assert at("tidelease_cluster_gpus", gpu_type="H20", tier="MA", health="healthy") == 2
    assert at("tidelease_cluster_gpus", gpu_type="A100", tier="HA", health="healthy") == 3
    assert at("tidelease_cluster_gpus_held", gpu_type="H20", tier="HA", priority="high") == 2
    assert at("tidelease_cluster_gpus_held", gpu_type="H20", tier="MA", priority="low") == 1
    assert at("tidelease_cluster_gpus_lent", gpu_type="H20", tier="MA") == 2
    assert at("tidelease_cluster_gpus_standby", gpu_type="A100", tier="HA", health="healthy") == 3
    assert at("tidelease_cluster_node_unhealthy_gpus", node="a") == 2
    # Only what exists is exported: no zero series per combination, no node without a problem.
    assert ("tidelease_cluster_node_unhealthy_gpus", (("node", "b"),)) not in got
    assert not [k for k in got if k[0] == "tidelease_cluster_agent_silent"]
    # No Lease seen for either node: not judged.
    assert at("tidelease_cluster_nodes", agent="no_heartbeat") == 2
    assert at("tidelease_cluster_nodes", agent="silent") == 0
    assert at("tidelease_cluster_nodes", agent="ready") == 0


def test_a_silent_agent_is_exported_by_node_until_it_renews() -> None:
    state = cluster(builders.gpu_node("a"), builders.gpu_node("b"), builders.gpu_node("c"))
    t0 = datetime.fromisoformat(T0).timestamp()
    state.apply_lease("ADDED", lease("a", T0))
    state.apply_lease("ADDED", lease("b", T0))
    registry = CollectorRegistry()
    cluster_metrics.register(state, registry)

    state.sweep(t0 + 30, 60)
    got = samples(registry)
    assert got[("tidelease_cluster_nodes", (("agent", "ready"),))] == 2
    assert got[("tidelease_cluster_nodes", (("agent", "no_heartbeat"),))] == 1
    assert not [k for k in got if k[0] == "tidelease_cluster_agent_silent"]

    state.apply_lease("MODIFIED", lease("b", "2026-11-21T10:01:00.000000Z"))
    state.sweep(t0 + 61, 60)  # a's agent is silent now, b's renewed
    got = samples(registry)
    assert got[("tidelease_cluster_agent_silent", (("node", "a"),))] == 1
    assert ("tidelease_cluster_agent_silent", (("node", "b"),)) not in got
    assert got[("tidelease_cluster_nodes", (("agent", "silent"),))] == 1
    assert got[("tidelease_cluster_nodes", (("agent", "ready"),))] == 1
    silent_gpus = (("gpu_type", "H20"), ("tier", "HA"))
    assert got[("tidelease_cluster_gpus_agent_silent", silent_gpus)] == 8

    state.apply_lease("MODIFIED", lease("a", "2026-11-21T10:01:05.000000Z"))
    state.sweep(t0 + 66, 60)
    got = samples(registry)
    assert not [k for k in got if k[0] == "tidelease_cluster_agent_silent"]
    assert got[("tidelease_cluster_nodes", (("agent", "ready"),))] == 2


def test_a_node_without_a_gpunode_is_not_counted() -> None:
    state = cluster(builders.gpu_node("a"))
    state.apply_lease("ADDED", lease("gone", T0))  # a Lease, but no GpuNode
    state.sweep(datetime.fromisoformat(T0).timestamp() + 600, 60)
    registry = CollectorRegistry()
    cluster_metrics.register(state, registry)
    got = samples(registry)
    assert got[("tidelease_cluster_nodes", (("agent", "no_heartbeat"),))] == 1
    assert got[("tidelease_cluster_nodes", (("agent", "silent"),))] == 0
    assert not [k for k in got if k[0] == "tidelease_cluster_agent_silent"]


def test_every_family_is_described_and_exposed_with_help() -> None:
    registry = CollectorRegistry()
    cluster_metrics.register(cluster(builders.gpu_node("a")), registry)
    with pytest.raises(DuplicateTimeseries):  # described: a clash is refused at registration
        cluster_metrics.register(cluster(), registry)
    text = generate_latest(registry).decode()
    for name, _, _ in FAMILIES:
        assert f"# HELP {name} " in text
        assert f"# TYPE {name} gauge" in text


def test_nodes_in_one_state_count_once_each_and_a_change_shows_at_the_next_scrape() -> None:
    state = cluster(*(builders.gpu_node(f"n{i}") for i in range(3)))
    registry = CollectorRegistry()
    cluster_metrics.register(state, registry)
    healthy = (
        "tidelease_cluster_gpus",
        (("gpu_type", "H20"), ("health", "healthy"), ("tier", "HA")),
    )
    unhealthy = (healthy[0], (("gpu_type", "H20"), ("health", "unhealthy"), ("tier", "HA")))
    assert samples(registry)[healthy] == 24

    state.apply_gpu_node(
        "MODIFIED",
        builders.gpu_node(
            "n1", [*builders.devices("n1", 7), *builders.devices("n1", 1, start=7, healthy=False)]
        ),
    )
    got = samples(registry)
    assert got[healthy] == 23
    assert got[unhealthy] == 1
    assert got[("tidelease_cluster_node_unhealthy_gpus", (("node", "n1"),))] == 1

    allocate(state, "n2", [(holder("b"), [builders.device_uuid("n2", 0)])])
    state.apply_gpu_node("DELETED", builders.gpu_node("n1"))
    got = samples(registry)
    assert got[healthy] == 16
    assert unhealthy not in got
    held = (("gpu_type", "H20"), ("priority", "low"), ("tier", "HA"))
    assert got[("tidelease_cluster_gpus_held", held)] == 1


def gpu_info(registry: CollectorRegistry) -> dict[str, dict[str, str]]:
    """The per-GPU series by UUID: their labels."""
    return {
        s.labels["UUID"]: s.labels
        for family in registry.collect()
        for s in family.samples
        if s.name == "tidelease_cluster_gpu_info"
    }


def test_a_series_per_gpu_by_uuid_only_when_asked() -> None:
    state = cluster(
        builders.gpu_node(
            "a",
            [
                *builders.devices("a", 2),
                *builders.devices("a", 1, start=2, healthy=False),
                *builders.devices("a", 2, start=3, tier=Tier.LA, owner="ml/online"),
            ],
        ),
        builders.gpu_node("b", builders.devices("b", 1, gpu_type="A100", standby=True)),
    )
    a = [builders.device_uuid("a", i) for i in range(5)]
    allocate(
        state,
        "a",
        [
            (holder("owner-0", priority=Priority.HIGH, owner="ml/online"), [a[0]]),
            (holder("borrower-0"), [a[3]]),
        ],
    )
    plain = CollectorRegistry()
    cluster_metrics.register(state, plain)
    assert gpu_info(plain) == {}
    assert b"tidelease_cluster_gpu_info" not in generate_latest(plain)

    registry = CollectorRegistry()
    cluster_metrics.register(state, registry, gpu_info=True)
    got = gpu_info(registry)
    b0 = builders.device_uuid("b", 0)
    assert set(got) == {*a, b0}

    def row(uuid: str) -> tuple[str, ...]:
        labels = got[uuid]
        keys = ("node", "gpu_type", "tier", "health", "holder", "lent", "standby")
        return tuple(labels[k] for k in keys)

    assert row(a[0]) == ("a", "H20", "HA", "healthy", "online", "false", "false")
    assert row(a[1]) == ("a", "H20", "HA", "healthy", "none", "false", "false")
    assert row(a[2]) == ("a", "H20", "HA", "unhealthy", "none", "false", "false")
    assert row(a[3]) == ("a", "H20", "LA", "healthy", "borrower", "true", "false")
    assert row(a[4]) == ("a", "H20", "LA", "healthy", "none", "true", "false")
    assert row(b0) == ("b", "A100", "HA", "healthy", "none", "false", "true")
    # Every series is 1, and the family carries its help.
    text = generate_latest(registry).decode()
    assert "# HELP tidelease_cluster_gpu_info One series per GPU" in text
    assert all(
        s.value == 1
        for f in registry.collect()
        for s in f.samples
        if s.name == "tidelease_cluster_gpu_info"
    )
