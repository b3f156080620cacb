"""Build a ClusterState from builder objects, for unit tests of the decisions."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from common.model import Allocation, GpuUuid, Holder, NodeName, PodUid, Priority
from extender.cluster.state import ClusterState


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
    from common.model import JobName

    return Holder(
        pod_uid=PodUid(f"uid-{name}"),
        namespace="default",
        name=name,
        priority=priority,
        pod_priority=pod_priority,
        owner=JobName(owner) if owner else None,
    )


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
