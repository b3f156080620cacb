"""Which pod a kubelet request is for, and so which devices it gets: pure decisions, no I/O.

At bind time the extender records its choice on the pod (``tidelease.io/devices``: GPU UUIDs,
``tidelease.io/devices-node``: the node). The kubelet does not say which pod a device-plugin call
serves, so the plugin matches on what it does say: the number of devices (GetPreferredAllocation)
or the device IDs it allocated (Allocate). A candidate is a pod of this node that is still
Pending, not being deleted, carries a readable choice for this node and is not yet marked
``tidelease.io/devices-assigned: "true"``; candidates are tried oldest first.

The choice is recorded per pod; a pod whose GPUs are requested by several containers gets one
GetPreferredAllocation/Allocate per container, whose sizes do not match the pod's total, so the
kubelet's own pick is used for it (with a warning).

A match is only a candidate: the annotation is the pod's, so the allocator grants the devices only
once the node's allocation ledger confirms them (:mod:`~nodeagent.deviceplugin.confirming`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from common import contract
from common.coercion import mapping
from common.model import GpuUuid, PodUid
from common.topology import NodeTopology, choose


@dataclass(frozen=True, slots=True)
class NodePod:
    """What the plugin needs of a pod bound to its node, parsed once from the API object."""

    namespace: str
    name: str
    uid: PodUid
    created: str = ""  # metadata.creationTimestamp, RFC 3339 (sorts as text)
    phase: str = "Pending"
    deleting: bool = False
    devices: tuple[GpuUuid, ...] = ()  # the extender's choice; empty when none is recorded
    devices_node: str = ""
    assigned: bool = False
    problem: str = ""  # why a recorded choice cannot be used ("" when it can)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def parse_node_pod(obj: Mapping[str, Any]) -> NodePod:
    """A pod object as the API server returns it; never raises, problems land in ``problem``."""
    meta = mapping(obj.get("metadata"))
    ann = mapping(meta.get("annotations"))
    problem = ""
    devices: tuple[GpuUuid, ...] = ()
    raw = ann.get(contract.ANN_DEVICES)
    if raw is not None:
        parts = [p.strip() for p in raw.split(",")] if isinstance(raw, str) else []
        devices = tuple(GpuUuid(p) for p in parts if p)
        if not devices:
            problem = f"{contract.ANN_DEVICES} names no device"
        elif len(set(devices)) != len(devices):
            problem = f"{contract.ANN_DEVICES} names a device twice"
    node = ann.get(contract.ANN_DEVICE_NODE)
    return NodePod(
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        uid=PodUid(str(meta.get("uid") or "")),
        created=str(meta.get("creationTimestamp") or ""),
        phase=str(mapping(obj.get("status")).get("phase") or "Pending"),
        deleting=meta.get("deletionTimestamp") is not None,
        devices=devices,
        devices_node=node if isinstance(node, str) else "",
        assigned=ann.get(contract.ANN_DEVICES_ASSIGNED) == "true",
        problem=problem,
    )


def candidates(pods: Iterable[NodePod], node: str) -> list[NodePod]:
    """Pods of ``node`` waiting for the devices the extender chose for them, oldest first."""
    waiting = [
        p
        for p in pods
        if p.phase == "Pending"
        and not p.deleting
        and not p.assigned
        and p.devices
        and not p.problem
        and p.devices_node == node
    ]
    return sorted(waiting, key=lambda p: (p.created == "", p.created, p.namespace, p.name))


@dataclass(frozen=True, slots=True)
class Preference:
    """GetPreferredAllocation's answer for one container, and why."""

    devices: tuple[GpuUuid, ...]
    pod: NodePod | None  # the pod whose recorded choice this is; None when no pod matched
    reason: str


def prefer(
    pods: Iterable[NodePod],
    node: str,
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
    *,
    topology: NodeTopology | None = None,
    index_of: Mapping[str, int] | None = None,
) -> Preference:
    """The devices recorded on the oldest candidate asking for ``size`` devices, all available.

    Without one (a pod placed without the extender), the kubelet still gets a full answer: the
    devices it must include, then available devices no other candidate is waiting for, then, if
    that is not enough, the remaining available ones. Where the node publishes its
    ``topology`` (``index_of``: each device's NVML index), the kubelet must include none and
    enough devices are free of waiting pods, those taken are the tightest group of them
    (:func:`common.topology.choose`, as the extender's bind would choose), not the first.
    """
    if size <= 0:
        return Preference((), None, f"allocation size {size}")
    free = set(available)
    must = set(must_include)
    waiting = candidates(pods, node)
    for pod in waiting:
        chosen = set(pod.devices)
        if len(pod.devices) == size and chosen <= free and must <= chosen:
            return Preference(pod.devices, pod, f"recorded on pod {pod.key}")
    reserved = {d for pod in waiting for d in pod.devices}
    reason = (
        f"no pending pod records {size} available device(s)"
        if waiting
        else "no pending pod with recorded devices on this node"
    )
    unreserved = [d for d in dict.fromkeys(available) if d not in reserved]
    if (
        topology is not None
        and index_of is not None
        and not must_include
        and len(unreserved) >= size
        and all(d in index_of for d in unreserved)
    ):
        device_at = {index_of[d]: d for d in unreserved}
        (group,) = choose(topology, [([index_of[d] for d in unreserved], size)])
        picked = tuple(GpuUuid(device_at[i]) for i in group)
        return Preference(picked, None, f"{reason}; the tightest group on the node's topology")
    picked_ids = list(dict.fromkeys(must_include))
    for pool in (unreserved, [d for d in available if d in reserved]):
        picked_ids += [d for d in pool if d not in picked_ids][: max(0, size - len(picked_ids))]
    return Preference(tuple(GpuUuid(d) for d in picked_ids[:size]), None, reason)


@dataclass(frozen=True, slots=True)
class AllocationMatch:
    """Allocate's decision for one container: the devices it gets and the pod they were for."""

    devices: tuple[GpuUuid, ...]
    pod: NodePod | None  # the pod to mark assigned; None when the kubelet's IDs are used as sent
    reason: str


def match_allocation(
    pods: Iterable[NodePod], node: str, requested: Sequence[str]
) -> AllocationMatch:
    """The oldest candidate whose recorded devices are exactly the kubelet's IDs.

    Without one, the container gets the kubelet's IDs: the kubelet has accounted for exactly
    these, so handing out others could give one GPU to two containers.
    """
    wanted = set(requested)
    waiting = candidates(pods, node)
    for pod in waiting:
        if set(pod.devices) == wanted and len(pod.devices) == len(requested):
            return AllocationMatch(pod.devices, pod, f"recorded on pod {pod.key}")
    same_size = [p.key for p in waiting if len(p.devices) == len(requested)]
    if same_size:
        reason = f"pending pod(s) {', '.join(same_size)} record other devices of this count"
    elif waiting:
        reason = f"no pending pod records {len(requested)} device(s)"
    else:
        reason = "no pending pod with recorded devices on this node"
    return AllocationMatch(tuple(GpuUuid(d) for d in requested), None, reason)
