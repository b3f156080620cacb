"""Named builders of objects in tidelease's contract: pods with annotations, GPU nodes.

The embedded demo, the benchmarks and the tests build their clusters with these, so every one of
them speaks the same contract that :mod:`common.podrequest` and :mod:`common.objects` parse.
"""

from __future__ import annotations

import uuid as uuidlib
from collections.abc import Iterable
from typing import Any

from common import contract
from common.model import (
    Device,
    DeviceClass,
    GpuUuid,
    JobName,
    NodeCache,
    NodeInventory,
    NodeName,
    Priority,
    Tier,
)
from common.objects import gpu_node_object


def device_uuid(node: str, index: int) -> GpuUuid:
    """A stable, UUID-shaped device id derived from its place (NVML's form: ``GPU-<uuid>``)."""
    return GpuUuid(f"GPU-{uuidlib.uuid5(uuidlib.NAMESPACE_DNS, f'{node}/{index}')}")


def devices(
    node: str,
    count: int = 8,
    *,
    gpu_type: str = "H20",
    tier: Tier = Tier.HA,
    healthy: bool = True,
    owner: str | None = None,
    standby: bool = False,
    start: int = 0,
    replica: str | None = None,
) -> list[Device]:
    cls = DeviceClass(gpu_type, tier, healthy, JobName(owner) if owner else None, standby, replica)
    return [
        Device(NodeName(node), i, device_uuid(node, i), cls) for i in range(start, start + count)
    ]


def gpu_node(
    name: str,
    devs: Iterable[Device] | None = None,
    *,
    images: Iterable[str] = (),
    checkpoints: Iterable[str] = (),
) -> dict[str, Any]:
    """A ``GpuNode`` object; eight healthy HA H20 devices unless ``devs`` is given."""
    inv = NodeInventory(
        node=NodeName(name),
        devices=tuple(devices(name) if devs is None else devs),
        cache=NodeCache(images=frozenset(images), checkpoints=frozenset(checkpoints)),
    )
    return gpu_node_object(inv)


def pod(
    name: str,
    gpus: int = 1,
    *,
    namespace: str = "default",
    uid: str | None = None,
    priority: Priority | None = None,
    owner: str | None = None,
    tier: Tier | None = None,
    gpu_type: str | None = None,
    reclaim: bool = False,
    checkpoint: str | None = None,
    image: str = "registry.example/train:v1",
    pod_priority: int | None = None,
    priority_class: str | None = None,
    node_name: str | None = None,
    phase: str = "Pending",
    extra_annotations: dict[str, str] | None = None,
    resource: str = contract.DEFAULT_GPU_RESOURCE,
) -> dict[str, Any]:
    """A Pod as the API server (and kube-scheduler) would send it."""
    annotations: dict[str, str] = {}
    if priority is not None:
        annotations[contract.ANN_PRIORITY] = priority.value
    if owner is not None:
        annotations[contract.ANN_OWNER] = owner
    if tier is not None:
        annotations[contract.ANN_RELIABILITY] = tier.name
    if gpu_type is not None:
        annotations[contract.ANN_GPU_TYPE] = gpu_type
    if reclaim:
        annotations[contract.ANN_RECLAIM] = "true"
    if checkpoint is not None:
        annotations[contract.ANN_CHECKPOINT] = checkpoint
    annotations.update(extra_annotations or {})
    container: dict[str, Any] = {"name": "main", "image": image}
    if gpus:
        container["resources"] = {
            "limits": {resource: str(gpus)},
            "requests": {resource: str(gpus)},
        }
    spec: dict[str, Any] = {"containers": [container], "schedulerName": "default-scheduler"}
    if pod_priority is not None:
        spec["priority"] = pod_priority
    if priority_class is not None:
        spec["priorityClassName"] = priority_class
    if node_name:
        spec["nodeName"] = node_name
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid or str(uuidlib.uuid5(uuidlib.NAMESPACE_URL, f"{namespace}/{name}")),
            "annotations": annotations,
        },
        "spec": spec,
        "status": {"phase": phase},
    }
