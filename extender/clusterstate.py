"""The extender's in-memory view of the cluster, fed by watches of the API server.

Answers scheduling requests without an API call. Per node it keeps the inventory (``GpuNode``)
and the allocation ledger (``GpuAllocation``), and derives the free devices as counts per
:class:`~common.model.DeviceClass`, with a hashable ``signature`` so that nodes in the same state
share one placement plan per request.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from common.errors import InvalidInput
from common.model import (
    Allocation,
    Device,
    DeviceClass,
    GpuUuid,
    NodeCache,
    NodeInventory,
    NodeName,
    PodUid,
)
from common.objects import parse_gpu_allocation, parse_gpu_node, resource_version

log = logging.getLogger(__name__)

Signature = tuple[int, tuple[tuple[DeviceClass, int], ...]]


@dataclass(slots=True)
class NodeState:
    node: NodeName
    devices: tuple[Device, ...] = ()
    cache: NodeCache = field(default_factory=NodeCache)
    has_inventory: bool = False
    allocations: dict[PodUid, Allocation] = field(default_factory=dict)
    ledger_version: str = ""
    # derived, refreshed by _refresh()
    free: Mapping[DeviceClass, int] = field(default_factory=dict)
    free_total: int = 0  # free healthy devices
    signature: Signature = (0, ())

    def _refresh(self) -> None:
        held: set[GpuUuid] = {u for a in self.allocations.values() for u in a.devices}
        counts = Counter(d.cls for d in self.devices if d.uuid not in held)
        self.free = counts
        self.free_total = sum(n for cls, n in counts.items() if cls.healthy)
        self.signature = (
            len(self.devices),
            tuple(sorted(counts.items(), key=lambda kv: _class_key(kv[0]))),
        )

    def holder_of(self, uuid: GpuUuid) -> Allocation | None:
        for a in self.allocations.values():
            if uuid in a.devices:
                return a
        return None


def _class_key(c: DeviceClass) -> tuple[str, int, bool, str, bool]:
    return (c.gpu_type, int(c.tier), c.healthy, c.owner or "", c.standby)


class ClusterState:
    """Node states by name. Single-threaded: used from the event loop only."""

    def __init__(self) -> None:
        self._nodes: dict[NodeName, NodeState] = {}
        self.generation = 0  # bumped on every change; lets callers cache derived answers

    def __len__(self) -> int:
        return len(self._nodes)

    def __iter__(self) -> Iterator[NodeState]:
        return iter(self._nodes.values())

    def get(self, node: str) -> NodeState | None:
        return self._nodes.get(NodeName(node))

    def _node(self, node: NodeName) -> NodeState:
        state = self._nodes.get(node)
        if state is None:
            state = self._nodes[node] = NodeState(node)
        return state

    # --- inventory ---
    def set_inventory(self, inv: NodeInventory) -> None:
        state = self._node(inv.node)
        state.devices, state.cache, state.has_inventory = inv.devices, inv.cache, True
        state._refresh()
        self.generation += 1

    def remove_inventory(self, node: NodeName) -> None:
        state = self._nodes.get(node)
        if state is None:
            return
        state.devices, state.cache, state.has_inventory = (), NodeCache(), False
        state._refresh()
        if not state.allocations and not state.ledger_version:
            del self._nodes[node]
        self.generation += 1

    # --- ledger ---
    def set_ledger(self, node: NodeName, allocations: tuple[Allocation, ...], version: str) -> None:
        state = self._node(node)
        state.allocations = {a.holder.pod_uid: a for a in allocations}
        state.ledger_version = version
        state._refresh()
        self.generation += 1

    def remove_ledger(self, node: NodeName) -> None:
        self.set_ledger(node, (), "")

    # --- watch events (raw objects from the API server or a snapshot) ---
    def apply_gpu_node(self, event: str, obj: Mapping[str, Any]) -> None:
        name = NodeName(str((obj.get("metadata") or {}).get("name", "")))
        if event == "DELETED":
            self.remove_inventory(name)
            return
        try:
            self.set_inventory(parse_gpu_node(obj))
        except InvalidInput as e:
            # A bad object must not take the node's devices with it silently: offer none.
            log.error("ignoring invalid GpuNode %s: %s", name, e)
            self.remove_inventory(name)

    def apply_gpu_allocation(self, event: str, obj: Mapping[str, Any]) -> None:
        name = NodeName(str((obj.get("metadata") or {}).get("name", "")))
        if event == "DELETED":
            self.remove_ledger(name)
            return
        try:
            node, allocations = parse_gpu_allocation(obj)
        except InvalidInput as e:
            log.error("invalid GpuAllocation %s, keeping its previous view: %s", name, e)
            return
        version = resource_version(obj)
        current = self._nodes.get(node)
        if current is not None and _older(version, current.ledger_version):
            return  # our own write, applied already, is newer than this event
        self.set_ledger(node, allocations, version)


def _older(version: str, than: str) -> bool:
    """Whether ``version`` precedes ``than``. resourceVersions are opaque in general; the API
    server's are etcd revisions, so compare them as numbers when both are numbers."""
    return version.isdigit() and than.isdigit() and int(version) < int(than)
