"""The simulated cluster: devices, allocation ledgers and pods, mirrored into a ``ClusterState``.
Pure.

What the node agents and the extender's bind would write to the API server (device health,
owner tags and standby flags, the ``GpuAllocation`` ledgers) is written here, and every change
is pushed into an :class:`extender.cluster.state.ClusterState` through the same calls its watches
use (``set_inventory``, ``set_ledger``), so the policy code sees exactly what the extender would.

For speed the world also keeps, per GPU type, the nodes by number of free healthy devices: only
a node with at least ``n`` of them can pass the filter for a pod of ``n`` GPUs.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence

from common.builders import device_uuid
from common.model import (
    Allocation,
    Device,
    DeviceClass,
    GpuUuid,
    Holder,
    NodeInventory,
    NodeName,
    PodUid,
    Tier,
)
from extender.cluster.state import ClusterState
from extender.simulation.scenario import NodeSpec

ANY_TYPE = ""


class SimCluster:
    def __init__(self, nodes: Sequence[NodeSpec]) -> None:
        self.state = ClusterState()
        self.names: list[NodeName] = sorted(n.name for n in nodes)
        self.specs: dict[NodeName, NodeSpec] = {n.name: n for n in nodes}
        self.devices: dict[GpuUuid, Device] = {}
        self.by_node: dict[NodeName, list[Device]] = {}
        self.ledger: dict[NodeName, dict[PodUid, Allocation]] = {}
        self.pod_node: dict[PodUid, NodeName] = {}
        self.holder_of: dict[GpuUuid, Holder] = {}
        self.version: dict[NodeName, int] = {}
        self.standby: set[GpuUuid] = set()
        self.tagged: dict[str, Counter[NodeName]] = {}  # per owner tag: its devices per node
        self.unhealthy = 0
        self.total = 0
        self.changes = 0  # bumped on every change of any node
        # per owner tag: bumped whenever a device tagged with it, before or after, changes class
        self.tag_changes: Counter[str] = Counter()
        self.offering: dict[str, bool] = {}
        self._types: dict[str, list[NodeName]] = {ANY_TYPE: self.names}
        self._free: dict[NodeName, int] = {}
        # per GPU type ("" for all), per count of free healthy devices: the nodes
        self._buckets: dict[str, list[set[NodeName]]] = {}
        largest = max((n.gpus for n in nodes), default=0)
        for name in self.names:
            spec = self.specs[name]
            self._types.setdefault(spec.gpu_type, []).append(name)
        for key in self._types:
            self._buckets[key] = [set() for _ in range(largest + 1)]
        for name in self.names:
            spec = self.specs[name]
            devs = [
                Device(name, i, device_uuid(name, i), DeviceClass(spec.gpu_type, tier, True))
                for i, tier in enumerate(spec.tiers)
            ]
            self.by_node[name] = devs
            self.devices.update((d.uuid, d) for d in devs)
            self.ledger[name] = {}
            self.version[name] = 0
            self.offering[name] = True
            self.total += len(devs)
            self._free[name] = -1
            self.state.set_inventory(NodeInventory(name, tuple(devs)))
            self.state.set_ledger(name, (), "0")
            self._reindex(name)

    # --- queries ---
    def nodes_of(self, gpu_type: str | None) -> list[NodeName]:
        """Nodes with GPUs of this type (all nodes for ``None``), by name."""
        return self._types.get(gpu_type or ANY_TYPE, [])

    def with_free(self, gpus: int, gpu_type: str | None) -> list[NodeName]:
        """Nodes (of the type) with at least ``gpus`` free healthy devices: the only ones a pod
        of ``gpus`` GPUs can pass the filter on."""
        buckets = self._buckets.get(gpu_type or ANY_TYPE)
        if buckets is None:
            return []
        out: list[NodeName] = []
        for bucket in buckets[max(gpus, 1) :]:
            out.extend(bucket)
        return out

    def tagged_nodes(self, owner: str | None) -> list[NodeName]:
        """Nodes with devices tagged with this owner (lent by it, or on loan to it)."""
        return sorted(self.tagged.get(owner, ())) if owner is not None else []

    def allocated_on(self, node: NodeName) -> list[GpuUuid]:
        return [u for a in self.ledger[node].values() for u in a.devices]

    def allocation(self, pod: PodUid) -> Allocation | None:
        node = self.pod_node.get(pod)
        return None if node is None else self.ledger[node].get(pod)

    def free_untagged(self) -> Iterator[Device]:
        """Free, healthy devices without owner tag or standby flag (the standby top-up's pick)."""
        held = self.holder_of
        for d in self.devices.values():
            c = d.cls
            if c.healthy and c.owner is None and not c.standby and d.uuid not in held:
                yield d

    def standby_pool(self) -> Counter[tuple[str, Tier]]:
        """Healthy standby devices per GPU type and tier."""
        pool: Counter[tuple[str, Tier]] = Counter()
        for u in self.standby:
            d = self.devices[u]
            if d.cls.healthy:
                pool[(d.gpu_type, d.tier)] += 1
        return pool

    # --- changes ---
    def set_classes(self, changes: Mapping[GpuUuid, DeviceClass]) -> None:
        """New classes (health, owner tag, standby flag) for some devices; one inventory update
        per node."""
        touched: dict[NodeName, None] = {}
        for uuid, cls in changes.items():
            old = self.devices[uuid]
            if old.cls == cls:
                continue
            new = Device(old.node, old.index, old.uuid, cls)
            self.devices[uuid] = new
            self.by_node[old.node][old.index] = new
            self.unhealthy += int(not cls.healthy) - int(not old.cls.healthy)
            if old.cls.owner != cls.owner:
                if old.cls.owner is not None:
                    nodes = self.tagged[old.cls.owner]
                    nodes[old.node] -= 1
                    if nodes[old.node] <= 0:
                        del nodes[old.node]
                if cls.owner is not None:
                    self.tagged.setdefault(cls.owner, Counter())[old.node] += 1
            if cls.standby:
                self.standby.add(uuid)
            else:
                self.standby.discard(uuid)
            touched[old.node] = None
            for owner in {old.cls.owner, cls.owner}:
                if owner is not None:
                    self.tag_changes[owner] += 1
        for node in touched:
            self.state.set_inventory(NodeInventory(node, tuple(self.by_node[node])))
            self._changed(node)

    def bind(self, node: NodeName, holder: Holder, devices: Iterable[Device]) -> Allocation:
        alloc = Allocation(holder, tuple(d.uuid for d in devices))
        self.ledger[node][holder.pod_uid] = alloc
        self.pod_node[holder.pod_uid] = node
        for u in alloc.devices:
            self.holder_of[u] = holder
        self._write_ledger(node)
        return alloc

    def release(self, pod: PodUid) -> Allocation | None:
        node = self.pod_node.pop(pod, None)
        if node is None:
            return None
        alloc = self.ledger[node].pop(pod)
        for u in alloc.devices:
            self.holder_of.pop(u, None)
        self._write_ledger(node)
        return alloc

    def _write_ledger(self, node: NodeName) -> None:
        v = self.version[node] + 1
        self.state.set_ledger(node, tuple(self.ledger[node].values()), str(v))
        self._changed(node)

    def _changed(self, node: NodeName) -> None:
        self.changes += 1
        self.version[node] += 1
        self._reindex(node)

    def _reindex(self, node: NodeName) -> None:
        state = self.state.nodes[node]
        free = state.free_total
        old = self._free[node]
        if free == old:
            return
        gpu_type = self.specs[node].gpu_type
        for key in (ANY_TYPE, gpu_type):
            buckets = self._buckets[key]
            if old >= 0:
                buckets[old].discard(node)
            buckets[free].add(node)
        self._free[node] = free
