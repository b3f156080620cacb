"""Named builders of objects in tidelease's contract: pods with annotations, GPU nodes, leases.

The embedded demo, the benchmarks and the tests build their clusters with these, so every one of
them speaks the same contract that :mod:`common.podrequest` and :mod:`common.objects` parse.
"""

from __future__ import annotations

import uuid as uuidlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from common import contract, deviceattributes
from common.model import (
    Device,
    DeviceClass,
    GpuUuid,
    JobKey,
    NodeCache,
    NodeInventory,
    NodeName,
    Priority,
    Tier,
)
from common.objects import gpu_node_object
from common.tenancy import LABEL_ONLINE, ONLINE_VALUE, is_job_key, job_key


def device_uuid(node: str, index: int) -> GpuUuid:
    """A stable, UUID-shaped device id derived from its place (NVML's form: ``GPU-<uuid>``)."""
    return GpuUuid(f"GPU-{uuidlib.uuid5(uuidlib.NAMESPACE_DNS, f'{node}/{index}')}")


def owner_key(owner: str | None, namespace: str = "default") -> JobKey | None:
    """The job key of ``owner``: as given when it names its namespace (``ns/job``), else the
    job of ``namespace``."""
    if not owner:
        return None
    return JobKey(owner) if is_job_key(owner) else job_key(namespace, owner)


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
    cls = DeviceClass(gpu_type, tier, healthy, owner_key(owner), standby, replica)
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
    controller: tuple[str, str] | None = None,
) -> dict[str, Any]:
    """A Pod as the API server (and kube-scheduler) would send it; ``controller`` (kind, name)
    is its controlling owner reference (e.g. its StatefulSet). ``reclaim`` writes the
    annotation, which grants nothing: a reclaim is the view's to derive."""
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
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "uid": uid or str(uuidlib.uuid5(uuidlib.NAMESPACE_URL, f"{namespace}/{name}")),
        "annotations": annotations,
    }
    if controller is not None:
        kind, owner_name = controller
        metadata["ownerReferences"] = [
            {
                "apiVersion": "apps/v1",
                "kind": kind,
                "name": owner_name,
                "uid": str(
                    uuidlib.uuid5(uuidlib.NAMESPACE_URL, f"{namespace}/{kind}/{owner_name}")
                ),
                "controller": True,
            }
        ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": spec,
        "status": {"phase": phase},
    }


def statefulset(
    name: str,
    namespace: str,
    *,
    replicas: int,
    image: str = "i:v1",
    container: str = "c",
    annotations: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A StatefulSet of ``replicas`` pods labelled ``app: <name>``, one container each;
    ``annotations`` go on its pod template."""
    obj = deployment(
        name, namespace, replicas=replicas, image=image, container=container,
        annotations=annotations,
    )  # fmt: skip
    obj["kind"] = "StatefulSet"
    obj["spec"]["serviceName"] = name
    return obj


def deployment(
    name: str,
    namespace: str,
    *,
    replicas: int,
    image: str = "i:v1",
    container: str = "c",
    annotations: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A Deployment of ``replicas`` pods labelled ``app: <name>``, one container each;
    ``annotations`` go on its pod template."""
    template_meta: dict[str, Any] = {"labels": {"app": name}}
    if annotations is not None:
        template_meta["annotations"] = dict(annotations)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": template_meta,
                "spec": {"containers": [{"name": container, "image": image}]},
            },
        },
    }


def gpu_lease_spec(
    owner: str,
    *,
    gpus_per_replica: int,
    desired_gpus: int | None = None,
    grace_s: int | None = None,
    schedule: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A GpuLease's spec: ``owner``'s StatefulSet (named as the owner) in groups of
    ``gpus_per_replica``; the optional fields only where given."""
    spec: dict[str, Any] = {"owner": owner, "gpusPerReplica": gpus_per_replica}
    if desired_gpus is not None:
        spec["desiredGPUs"] = desired_gpus
    if grace_s is not None:
        spec["graceSeconds"] = grace_s
    if schedule is not None:
        spec["schedule"] = schedule
    spec["workload"] = {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": owner}
    return spec


def gpu_lease(
    name: str,
    namespace: str,
    *,
    owner: str | None = None,
    gpus_per_replica: int,
    desired_gpus: int | None = None,
    grace_s: int | None = None,
    schedule: list[dict[str, Any]] | None = None,
    resource_version: str | None = None,
    annotations: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A ``GpuLease`` object without status; its owner (and workload) is ``name`` unless
    ``owner`` is given. See :func:`gpu_lease_spec`."""
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if resource_version is not None:
        metadata["resourceVersion"] = resource_version
    if annotations is not None:
        metadata["annotations"] = dict(annotations)
    return {
        "apiVersion": contract.API_VERSION,
        "kind": contract.KIND_GPU_LEASE,
        "metadata": metadata,
        "spec": gpu_lease_spec(
            name if owner is None else owner,
            gpus_per_replica=gpus_per_replica,
            desired_gpus=desired_gpus,
            grace_s=grace_s,
            schedule=schedule,
        ),
    }


def namespace(name: str, *, online: bool = True) -> dict[str, Any]:
    """A Namespace; ``online``: labelled as an admin grants online jobs (common.tenancy)."""
    labels = {LABEL_ONLINE: ONLINE_VALUE} if online else {}
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}


def claim_template(
    namespace: str,
    name: str,
    device_class: str,
    *,
    all_devices: bool = False,
    selectors: Sequence[str] = (),
    count: int = 1,
) -> dict[str, Any]:
    """A ResourceClaimTemplate (DRA mode, ``resource.k8s.io/v1``) whose one request, ``gpu``,
    asks for ``count`` whole devices of ``device_class`` (or all it selects), narrowed by
    further CEL ``selectors``."""
    exactly: dict[str, Any] = {"deviceClassName": device_class}
    exactly.update({"allocationMode": "All"} if all_devices else {"count": count})
    if selectors:
        exactly["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    return {
        "apiVersion": deviceattributes.API_VERSION,
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}},
    }
