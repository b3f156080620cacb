"""Fakes and named factories for the device plugin's tests (and for demos without a cluster).

``InMemoryPodLookup`` keeps pod objects as the API server would return them and behaves as the
API server does for the plugin's two calls: the node's Pending pods, and a merge patch of the
assigned annotation with the pod's UID as precondition (NotFound, Conflict).
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Iterable, Sequence
from typing import Any

from common import builders, contract
from common.errors import Conflict, NotFound
from common.model import GpuUuid
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


class InMemoryPodLookup:
    """A faithful fake of :class:`~nodeagent.deviceplugin.pods.KubePodLookup`.

    ``fail_with`` makes every call raise it; ``delay_s`` makes every call that long (for the
    timeout paths). ``patches`` records each successful mark as (namespace/name, uid).
    """

    def __init__(self, pods: Iterable[dict[str, Any]] = ()) -> None:
        self._pods: dict[tuple[str, str], dict[str, Any]] = {}
        for obj in pods:
            self.put(obj)
        self.fail_with: Exception | None = None
        self.delay_s = 0.0
        self.patches: list[tuple[str, str]] = []

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

    async def mark_assigned(self, pod: NodePod) -> None:
        await self._call()
        obj = self._pods.get((pod.namespace, pod.name))
        if obj is None:
            raise NotFound(f"pod {pod.key} not found")
        if obj["metadata"].get("uid") != pod.uid:
            raise Conflict(f"pod {pod.key}: precondition failed: UID {pod.uid}")
        obj["metadata"].setdefault("annotations", {})[contract.ANN_DEVICES_ASSIGNED] = "true"
        self.patches.append((pod.key, pod.uid))
