"""Build a ClusterState from builder objects, for unit tests of the decisions."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from common import builders
from common.builders import owner_key
from common.model import Allocation, GpuUuid, Holder, NodeName, PodRequest, PodUid, Priority
from common.podrequest import parse_pod
from extender.cluster.state import ClusterState
from extender.leasing.controller import LeaseCache


def cluster(*gpu_nodes: dict[str, Any]) -> ClusterState:
    state = ClusterState()
    for obj in gpu_nodes:
        state.apply_gpu_node("ADDED", obj)
    return state


def holder(
    name: str,
    *,
    priority: Priority = Priority.LOW,
    pod_priority: int = 0,
    owner: str | None = None,
) -> Holder:
    return Holder(
        pod_uid=PodUid(f"uid-{name}"),
        namespace="default",
        name=name,
        priority=priority,
        pod_priority=pod_priority,
        owner=owner_key(owner),
    )


def as_reclaim(pod: dict[str, Any]) -> PodRequest:
    """A raw pod's request as the cluster view derives it while its owner's lease reclaims
    (ClusterState.with_reclaim): a pod never declares a reclaim itself."""
    return replace(parse_pod(pod), reclaim=True)


def allocate(
    state: ClusterState, node: str, allocations: Iterable[tuple[Holder, list[str]]]
) -> None:
    current = state.get(node)
    existing = tuple(current.allocations.values()) if current else ()
    new = tuple(
        Allocation(h, tuple(GpuUuid(u) for u in uuids), "2026-01-01T00:00:00+00:00")
        for h, uuids in allocations
    )
    state.set_ledger(NodeName(node), existing + new, "1")


# The namespaces the unit tests' GpuLeases live in, granted online jobs as an admin would.
TEST_NAMESPACES = ("default", "ns", "ml")


def granted_leases(*namespaces: str) -> LeaseCache:
    """A GpuLease cache whose namespaces (all of :data:`TEST_NAMESPACES` unless given) an
    admin granted online jobs, as the controllers' Namespace watch reports them."""
    leases = LeaseCache()
    for ns in namespaces or TEST_NAMESPACES:
        leases.apply_namespace("ADDED", builders.namespace(ns))
    return leases
