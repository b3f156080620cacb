"""Whether the node's allocation ledger confirms a pod's recorded devices: pure decisions, no I/O.

``tidelease.io/devices`` is an annotation, and a tenant who may edit its own pods may rewrite it
(to name another tenant's GPUs on the node, say). The extender writes the choice into the node's
``GpuAllocation`` ledger first, an object no tenant can write, and only then binds the pod with the
annotation. So the device plugin gives a pod the devices its annotation names only when the
ledger's entry for that pod's UID lists exactly those devices; the grant then follows the ledger's
order. Anything else is refused, with a reason that names any other pod the ledger gives one of
those devices.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from common import contract
from common.model import Allocation, GpuUuid, PodUid
from common.objects import parse_gpu_allocation
from nodeagent.deviceplugin.matching import NodePod

# Why a pod's devices were not confirmed (logged with the refusal), or "confirmed".
Outcome = Literal["confirmed", "no-entry", "mismatch", "unreadable"]


@dataclass(frozen=True, slots=True)
class NodeLedger:
    """A node's ``GpuAllocation``, parsed once; ``exists`` is False when the node has none."""

    node: str
    allocations: tuple[Allocation, ...] = ()
    exists: bool = True

    def of(self, uid: PodUid) -> Allocation | None:
        return next((a for a in self.allocations if a.holder.pod_uid == uid), None)

    def holder_of(self, device: str) -> Allocation | None:
        return next((a for a in self.allocations if device in a.devices), None)


def parse_node_ledger(obj: Mapping[str, Any]) -> NodeLedger:
    """A ``GpuAllocation`` as the API server returns it; raises InvalidInput if it is malformed."""
    node, allocations = parse_gpu_allocation(obj)
    return NodeLedger(node, allocations)


@dataclass(frozen=True, slots=True)
class Confirmation:
    """The devices a pod may have, and why; ``devices`` is empty when it may have none."""

    devices: tuple[GpuUuid, ...]
    outcome: Outcome
    reason: str

    @property
    def confirmed(self) -> bool:
        return self.outcome == "confirmed"

    @property
    def may_catch_up(self) -> bool:
        """Worth reading the ledger again: it may not show the pod's entry yet."""
        return self.outcome in ("no-entry", "unreadable")


def unreadable(why: str) -> Confirmation:
    """The ledger could not be read (the API server failed or was slow, the object is malformed)."""
    return Confirmation((), "unreadable", f"the node's allocation ledger {why}")


def _listed(devices: tuple[GpuUuid, ...]) -> str:
    return ",".join(devices) or "no device"


def confirm(pod: NodePod, ledger: NodeLedger) -> Confirmation:
    """Whether ``ledger`` gives ``pod`` (by UID) exactly the devices its annotation names.

    The reason is written to follow "pod <namespace>/<name> on node <node>: ".
    """
    named = f"its {contract.ANN_DEVICES} names {_listed(pod.devices)}"
    others = [
        f"{d} is pod {held.holder.key}'s"
        for d in pod.devices
        if (held := ledger.holder_of(d)) is not None and held.holder.pod_uid != pod.uid
    ]
    theirs = f" ({'; '.join(others)})" if others else ""
    entry = ledger.of(pod.uid)
    if entry is None:
        missing = (
            f"the node's allocation ledger has no entry for its UID {pod.uid}"
            if ledger.exists
            else "the node has no allocation ledger"
        )
        return Confirmation((), "no-entry", f"{named} but {missing}{theirs}")
    if set(entry.devices) != set(pod.devices) or len(entry.devices) != len(pod.devices):
        return Confirmation(
            (),
            "mismatch",
            f"{named} but the node's allocation ledger gives it {_listed(entry.devices)}{theirs}",
        )
    return Confirmation(entry.devices, "confirmed", "confirmed by the node's allocation ledger")
