"""Fakes and named factories for the device plugin's tests (and for demos without a cluster).

``InMemoryPodLookup`` keeps pod objects and ``GpuAllocation`` ledgers as the API server would
return them and behaves as the API server does for the plugin's three calls: the node's Pending
pods, the node's ledger, and a merge patch of the assigned annotation with the pod's UID as
precondition (NotFound, Conflict). :meth:`InMemoryPodLookup.bound` leaves pods as the extender's
bind does: each recorded choice is in its node's ledger too.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Iterable, Sequence
from typing import Any

from common import builders, contract
from common.errors import Conflict, NotFound
from common.model import GpuUuid
from nodeagent.deviceplugin.confirming import NodeLedger, parse_node_ledger
from nodeagent.deviceplugin.devices import PluginDevice, nvidia_device
from nodeagent.deviceplugin.matching import NodePod, parse_node_pod

NODE = "node-a"


def gpu(index: int, *, node: str = NODE, numa_node: int | None = None) -> PluginDevice:
    """A healthy GPU of ``node`` with its NVML-shaped UUID and ``/dev/nvidia<index>``."""
    return nvidia_device(builders.device_uuid(node, index), index, numa_node=numa_node)


def lost_gpu(index: int, *, node: str = NODE) -> PluginDevice:
    """An unhealthy GPU (an XID error, fallen off the bus)."""
    return nvidia_device(builders.device_uuid(node, index), index, healthy=False)


def gpus(count: int, *, node: str = NODE) -> tuple[PluginDevice, ...]:
    return tuple(gpu(i, node=node) for i in range(count))


def uuids(*indexes: int, node: str = NODE) -> tuple[GpuUuid, ...]:
    return tuple(builders.device_uuid(node, i) for i in indexes)


def placed_pod(
    name: str,
    devices: Sequence[str] | None,
    *,
    node: str = NODE,
    devices_node: str | None = None,
    created: str = "2025-01-01T00:00:00Z",
    assigned: bool = False,
    phase: str = "Pending",
    namespace: str = "default",
    uid: str | None = None,
) -> dict[str, Any]:
    """A pod bound to ``node``; with ``devices``, as the extender's bind leaves it.

    ``devices=None`` is a pod placed without the extender (no recorded choice).
    """
    annotations: dict[str, str] = {}
    if devices is not None:
        annotations[contract.ANN_DEVICES] = ",".join(devices)
        annotations[contract.ANN_DEVICE_NODE] = node if devices_node is None else devices_node
    if assigned:
        annotations[contract.ANN_DEVICES_ASSIGNED] = "true"
    obj = builders.pod(
        name,
        len(devices or ()) or 1,
        namespace=namespace,
        uid=uid,
        node_name=node,
        phase=phase,
        extra_annotations=annotations,
    )
    obj["metadata"]["creationTimestamp"] = created
    return obj


def node_pod(name: str, devices: Sequence[str] | None, **kwargs: Any) -> NodePod:
    """:func:`placed_pod`, parsed as the plugin sees it."""
    return parse_node_pod(placed_pod(name, devices, **kwargs))


def ledger_entry(pod: dict[str, Any], devices: Sequence[str] | None = None) -> dict[str, Any]:
    """The ``GpuAllocation`` entry the extender writes for ``pod`` (a :func:`placed_pod`):
    ``devices``, or else the ones recorded on the pod."""
    meta = pod["metadata"]
    if devices is None:
        raw = meta.get("annotations", {}).get(contract.ANN_DEVICES, "")
        devices = [d for d in raw.split(",") if d]
    return {
        "podUID": meta["uid"],
        "namespace": meta["namespace"],
        "name": meta["name"],
        "priority": "low",
        "podPriority": 0,
        "devices": list(devices),
        "since": "2025-01-01T00:00:00+00:00",
    }


def gpu_allocation(node: str, entries: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """A node's ``GpuAllocation`` ledger holding ``entries`` (see :func:`ledger_entry`)."""
    return {
        "apiVersion": contract.API_VERSION,
        "kind": contract.KIND_GPU_ALLOCATION,
        "metadata": {"name": node},
        "spec": {"allocations": list(entries)},
    }


class ManualTime:
    """A clock and a sleep for :class:`~nodeagent.deviceplugin.allocating.Allocator`: sleeping
    moves the clock on at once (``slept`` records each sleep)."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds
        await asyncio.sleep(0)


class InMemoryPodLookup:
    """A faithful fake of :class:`~nodeagent.deviceplugin.pods.KubePodLookup`.

    ``fail_with`` makes every call raise it; ``delay_s`` makes every call that long (for the
    timeout paths). ``patches`` records each successful mark as (namespace/name, uid);
    ``ledger_reads`` counts the ledger reads.
    """

    def __init__(
        self,
        pods: Iterable[dict[str, Any]] = (),
        *,
        ledgers: Iterable[dict[str, Any]] = (),
    ) -> None:
        self._pods: dict[tuple[str, str], dict[str, Any]] = {}
        self._ledgers: dict[str, dict[str, Any]] = {}
        for obj in pods:
            self.put(obj)
        for ledger in ledgers:
            self.put_ledger(ledger)
        self.fail_with: Exception | None = None
        self.delay_s = 0.0
        self.patches: list[tuple[str, str]] = []
        self.ledger_reads = 0

    @classmethod
    def bound(cls, pods: Iterable[dict[str, Any]]) -> InMemoryPodLookup:
        """The pods as the extender's bind leaves them: each recorded choice is also in the
        ledger of the node it names."""
        objs = list(pods)
        lookup = cls(objs)
        for obj in objs:
            ann = obj["metadata"].get("annotations", {})
            if contract.ANN_DEVICES in ann:
                lookup.record(obj, node=ann.get(contract.ANN_DEVICE_NODE) or NODE)
        return lookup

    def put_ledger(self, obj: dict[str, Any]) -> None:
        self._ledgers[obj["metadata"]["name"]] = copy.deepcopy(obj)

    def record(
        self, pod: dict[str, Any], devices: Sequence[str] | None = None, *, node: str = NODE
    ) -> None:
        """Add (or replace) ``pod``'s entry in ``node``'s ledger, as the extender's bind does."""
        ledger = self._ledgers.setdefault(node, gpu_allocation(node, []))
        entries = ledger["spec"]["allocations"]
        entries[:] = [e for e in entries if e["podUID"] != pod["metadata"]["uid"]]
        entries.append(ledger_entry(pod, devices))

    def put(self, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        self._pods[(meta["namespace"], meta["name"])] = copy.deepcopy(obj)

    def delete(self, namespace: str, name: str) -> None:
        self._pods.pop((namespace, name), None)

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        obj = self._pods.get((namespace, name))
        return copy.deepcopy(obj) if obj is not None else None

    def annotations(self, namespace: str, name: str) -> dict[str, str]:
        obj = self._pods.get((namespace, name)) or {}
        return dict(obj.get("metadata", {}).get("annotations") or {})

    async def _call(self) -> None:
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if self.fail_with is not None:
            raise self.fail_with

    async def pods_on_node(self, node: str) -> tuple[NodePod, ...]:
        await self._call()
        return tuple(
            parse_node_pod(copy.deepcopy(obj))
            for obj in self._pods.values()
            if obj.get("spec", {}).get("nodeName") == node
            and obj.get("status", {}).get("phase") == "Pending"
        )

    async def ledger(self, node: str) -> NodeLedger:
        await self._call()
        self.ledger_reads += 1
        obj = self._ledgers.get(node)
        return NodeLedger(node, exists=False) if obj is None else parse_node_ledger(obj)

    async def mark_assigned(self, pod: NodePod) -> None:
        await self._call()
        obj = self._pods.get((pod.namespace, pod.name))
        if obj is None:
            raise NotFound(f"pod {pod.key} not found")
        if obj["metadata"].get("uid") != pod.uid:
            raise Conflict(f"pod {pod.key}: precondition failed: UID {pod.uid}")
        obj["metadata"].setdefault("annotations", {})[contract.ANN_DEVICES_ASSIGNED] = "true"
        self.patches.append((pod.key, pod.uid))
