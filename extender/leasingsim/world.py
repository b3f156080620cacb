"""The simulated cluster: devices, allocation ledgers and pods, mirrored into a ``ClusterState``.
Pure.

What the node agents and the extender's bind would write to the API server (device health,
owner tags and standby flags, the ``GpuAllocation`` ledgers) is written here, and every change
is pushed into an :class:`extender.cluster.state.ClusterState` through the same calls its watches
use (``set_inventory``, ``set_ledger``), so the policy code sees exactly what the extender would.

For speed the world also keeps, per GPU type, the nodes by number of free healthy devices: only
a node with at least ``n`` of them can pass the filter for a pod of ``n`` GPUs; and by number of
free healthy devices outside the standby pool: only those count for a pod that is not a reclaim.
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
from extender.leasingsim.scenario import NodeSpec

ANY_TYPE = ""


class _FreeIndex:
    """Nodes by a count of their devices (per GPU type, ``ANY_TYPE`` for all): ``count[node]``
    is the node's count (-1 before the first ``move``), and the node is in
    ``buckets[type][count]`` for its own type and ``ANY_TYPE``, in no other bucket.

    A set keeps its table as it shrinks, and walking it walks the whole table: a bucket that
    has shrunk to a quarter of the most it held since it was last built (``peak``) is built
    again, so walking it costs in proportion to the nodes in it."""

    def __init__(self, types: Mapping[str, Sequence[NodeName]], largest: int) -> None:
        self.count: dict[NodeName, int] = {}
        self.buckets: dict[str, list[set[NodeName]]] = {
            key: [set() for _ in range(largest + 1)] for key in types
        }
        self.peak: dict[str, list[int]] = {key: [0] * (largest + 1) for key in types}

    def move(self, node: NodeName, gpu_type: str, count: int) -> None:
        old = self.count.get(node, -1)
        if count == old:
            return
        for key in {ANY_TYPE, gpu_type}:
            buckets, peak = self.buckets[key], self.peak[key]
            if old >= 0:
                bucket = buckets[old]
                bucket.discard(node)
                if 4 * len(bucket) < peak[old]:
                    buckets[old] = set(bucket)
                    peak[old] = len(bucket)
            bucket = buckets[count]
            bucket.add(node)
            if len(bucket) > peak[count]:
                peak[count] = len(bucket)
        self.count[node] = count

    def at_least(self, n: int, gpu_type: str | None) -> list[NodeName]:
        """Nodes (of the type) whose count is at least ``n`` (and at least 1)."""
        buckets = self.buckets.get(gpu_type or ANY_TYPE)
        if buckets is None:
            return []
        out: list[NodeName] = []
        for bucket in buckets[max(n, 1) :]:
            out.extend(bucket)
        return out

    def any_at_least(self, n: int, gpu_type: str | None) -> bool:
        """Whether ``at_least`` would name a node."""
        buckets = self.buckets.get(gpu_type or ANY_TYPE)
        return buckets is not None and any(buckets[max(n, 1) :])


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
        # the healthy ones among them, per GPU type and tier (no zero counts)
        self._pool: Counter[tuple[str, Tier]] = Counter()
        self.tagged: dict[str, Counter[NodeName]] = {}  # per owner tag: its devices per node
        self.unhealthy = 0
        self.healthy: dict[NodeName, int] = {}  # per node: its healthy devices (allocatable)
        # per pod: when it was bound, as a count of binds (kube-scheduler's preemption prefers
        # the node whose victims started last)
        self.started: dict[PodUid, int] = {}
        self._binds = 0
        self.total = 0
        self.changes = 0  # bumped on every change of any node
        # per owner tag: bumped whenever a device tagged with it, before or after, changes class
        self.tag_changes: Counter[str] = Counter()
        # per owner tag: the devices tagged with it, before or after, that changed class since
        # the owner's tag check (.tagging.TagChecks) last took them
        self.retouched: dict[str, set[GpuUuid]] = {}
        self.offering: dict[str, bool] = {}
        self._types: dict[str, list[NodeName]] = {ANY_TYPE: self.names}
        largest = max((n.gpus for n in nodes), default=0)
        for name in self.names:
            spec = self.specs[name]
            self._types.setdefault(spec.gpu_type, []).append(name)
        # per GPU type, the nodes by count of free healthy devices (``state.free_total``) ...
        self._free = _FreeIndex(self._types, largest)
        # ... and of those outside the standby pool: all a pod that is no reclaim may take
        self._open = _FreeIndex(self._types, largest)
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
            self.healthy[name] = len(devs)
            self.total += len(devs)
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
        return self._free.at_least(gpus, gpu_type)

    def any_free(self, gpus: int, gpu_type: str | None) -> bool:
        """Whether ``with_free`` would name a node."""
        return self._free.any_at_least(gpus, gpu_type)

    def with_open(self, gpus: int, gpu_type: str | None) -> list[NodeName]:
        """Nodes (of the type) with at least ``gpus`` free healthy devices outside the standby
        pool: the only ones a pod of ``gpus`` GPUs that is not a reclaim can pass the filter on
        (every other pod's plan takes no standby device: ``Verdict.STANDBY_RESERVED``)."""
        return self._open.at_least(gpus, gpu_type)

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
        """Healthy standby devices per GPU type and tier (no zero counts). Every node of the
        simulated cluster offers its devices throughout (``offering`` never changes), so this
        is also the leasing controller's pool: healthy standby devices on offering nodes."""
        return Counter(self._pool)

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
            self.healthy[old.node] += int(cls.healthy) - int(old.cls.healthy)
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
            if old.cls.standby and old.cls.healthy:
                key = (old.cls.gpu_type, old.cls.tier)
                self._pool[key] -= 1
                if not self._pool[key]:
                    del self._pool[key]
            if cls.standby and cls.healthy:
                self._pool[(cls.gpu_type, cls.tier)] += 1
            touched[old.node] = None
            if old.cls.owner is not None:
                self.tag_changes[old.cls.owner] += 1
                self.retouched.setdefault(old.cls.owner, set()).add(uuid)
            if cls.owner is not None and cls.owner != old.cls.owner:
                self.tag_changes[cls.owner] += 1
                self.retouched.setdefault(cls.owner, set()).add(uuid)
        for node in touched:
            self.state.set_inventory(NodeInventory(node, tuple(self.by_node[node])))
            self._changed(node)

    def bind(self, node: NodeName, holder: Holder, devices: Iterable[Device]) -> Allocation:
        alloc = Allocation(holder, tuple(d.uuid for d in devices))
        self.ledger[node][holder.pod_uid] = alloc
        self.pod_node[holder.pod_uid] = node
        self._binds += 1
        self.started[holder.pod_uid] = self._binds
        for u in alloc.devices:
            self.holder_of[u] = holder
        self._write_ledger(node)
        return alloc

    def release(self, pod: PodUid) -> Allocation | None:
        node = self.pod_node.pop(pod, None)
        if node is None:
            return None
        alloc = self.ledger[node].pop(pod)
        self.started.pop(pod, None)
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
        gpu_type = self.specs[node].gpu_type
        self._free.move(node, gpu_type, state.free_total)
        self._open.move(
            node,
            gpu_type,
            sum(n for cls, n in state.free.items() if cls.healthy and not cls.standby),
        )

    def free_counts(self) -> tuple[dict[NodeName, int], dict[NodeName, int]]:
        """Per node, as the indexes hold them: free healthy devices, and those of them outside
        the standby pool (for tests: they must equal a count over ``state``)."""
        return dict(self._free.count), dict(self._open.count)
