"""Translate tidelease's custom resources to and from typed values. Pure.

Two kinds, both cluster-scoped and named after their node (the chart's crds/ document them):

* ``GpuNode`` — the node's devices. ``status`` is written by the node agent (index, UUID, type,
  health, tier, cache inventory, topology: :mod:`common.topology`); ``spec.devices`` by the
  leasing controller (owner tag, standby).
* ``GpuAllocation`` — the node's allocation ledger: which pod holds which devices. Written only by
  the extender's bind, with optimistic concurrency, so two replicas never hand out one device twice.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from common import contract
from common.coercion import whole
from common.errors import InvalidInput
from common.model import (
    Allocation,
    Device,
    DeviceClass,
    GpuUuid,
    Health,
    Holder,
    JobKey,
    NodeCache,
    NodeInventory,
    NodeName,
    PodUid,
    Priority,
    Tier,
)
from common.tenancy import is_job_key, job_key
from common.topology import from_json as topology_from_json
from common.topology import to_json as topology_to_json

_HEALTH = {h.value: h for h in Health}
_TIERS = {t.name: t for t in Tier}
_PRIORITIES = {p.value: p for p in Priority}


def _name(obj: Mapping[str, Any], kind: str) -> str:
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    if not isinstance(name, str) or not name:
        raise InvalidInput(f"{kind} without metadata.name")
    return name


def object_key(obj: Mapping[str, Any]) -> str:
    """``namespace/name`` of an API object (``/name`` for a cluster-scoped one)."""
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        return "/"
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def resource_version(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata")
    rv = meta.get("resourceVersion", "") if isinstance(meta, dict) else ""
    return rv if isinstance(rv, str) else ""


def _strings(value: object, where: str, problems: list[str]) -> frozenset[str]:
    if value is None:
        return frozenset()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        problems.append(f"{where} must be a list of strings")
        return frozenset()
    return frozenset(value)


def parse_gpu_node(obj: Mapping[str, Any]) -> NodeInventory:
    """Parse a ``GpuNode`` object; raise :class:`InvalidInput` naming each bad field."""
    node = NodeName(_name(obj, contract.KIND_GPU_NODE))
    where = f"GpuNode {node}"
    problems: list[str] = []
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    if not isinstance(spec, dict) or not isinstance(status, dict):
        raise InvalidInput(f"{where}: spec and status must be objects")

    tags: dict[str, tuple[JobKey | None, bool, str | None]] = {}
    for i, entry in enumerate(spec.get("devices") or []):
        if not isinstance(entry, dict) or not isinstance(entry.get("uuid"), str):
            problems.append(f"{where}: spec.devices[{i}] needs a uuid")
            continue
        owner = entry.get("owner")
        standby = entry.get("standby", False)
        if owner is not None and not (isinstance(owner, str) and owner):
            problems.append(f"{where}: spec.devices[{i}].owner must be a job name")
            owner = None
        if not isinstance(standby, bool):
            problems.append(f"{where}: spec.devices[{i}].standby must be a boolean")
            standby = False
        replica = entry.get("replica")
        if replica is not None and not (isinstance(replica, str) and replica and owner):
            problems.append(f"{where}: spec.devices[{i}].replica must be a pod name, with an owner")
            replica = None
        tags[entry["uuid"]] = (JobKey(owner) if owner else None, standby, replica or None)

    devices: list[Device] = []
    seen: set[str] = set()
    for i, entry in enumerate(status.get("devices") or []):
        at = f"{where}: status.devices[{i}]"
        if not isinstance(entry, dict):
            problems.append(f"{at} must be an object")
            continue
        uuid, index, gpu_type = entry.get("uuid"), entry.get("index"), entry.get("type")
        health = _HEALTH.get(entry.get("health", "Unknown"))
        tier = _TIERS.get(entry.get("tier", "LA"))
        if not isinstance(uuid, str) or not uuid:
            problems.append(f"{at}.uuid must be a non-empty string")
            continue
        if uuid in seen:
            problems.append(f"{at}.uuid {uuid} appears twice")
            continue
        seen.add(uuid)
        if not whole(index) or index < 0:
            problems.append(f"{at}.index must be a non-negative integer")
            continue
        if not isinstance(gpu_type, str) or not gpu_type:
            problems.append(f"{at}.type must be a non-empty string")
            continue
        if health is None:
            problems.append(f"{at}.health must be one of {', '.join(_HEALTH)}")
            continue
        if tier is None:
            problems.append(f"{at}.tier must be one of {', '.join(_TIERS)}")
            continue
        owner, standby, replica = tags.get(uuid, (None, False, None))
        cls = DeviceClass(gpu_type, tier, health is Health.HEALTHY, owner, standby, replica)
        devices.append(Device(node, index, GpuUuid(uuid), cls))

    cache = status.get("cache") or {}
    if not isinstance(cache, dict):
        problems.append(f"{where}: status.cache must be an object")
        cache = {}
    node_cache = NodeCache(
        images=_strings(cache.get("images"), f"{where}: status.cache.images", problems),
        checkpoints=_strings(
            cache.get("checkpoints"), f"{where}: status.cache.checkpoints", problems
        ),
    )
    topology = None
    try:
        topology = topology_from_json(status.get("topology"), f"{where}: status.topology")
    except InvalidInput as e:
        problems += e.problems
    if problems:
        raise InvalidInput(problems)
    devices.sort(key=lambda d: d.index)
    return NodeInventory(node=node, devices=tuple(devices), cache=node_cache, topology=topology)


def gpu_node_object(inv: NodeInventory) -> dict[str, Any]:
    """The ``GpuNode`` object for an inventory (used by the demo, tests and the agent)."""
    tagged = [
        {
            "uuid": d.uuid,
            **({"owner": d.cls.owner} if d.cls.owner else {}),
            **({"standby": True} if d.cls.standby else {}),
            **({"replica": d.cls.replica} if d.cls.replica else {}),
        }
        for d in inv.devices
        if d.cls.owner or d.cls.standby
    ]
    return {
        "apiVersion": contract.API_VERSION,
        "kind": contract.KIND_GPU_NODE,
        "metadata": {"name": inv.node},
        "spec": {"devices": tagged},
        "status": {
            "devices": [
                {
                    "index": d.index,
                    "uuid": d.uuid,
                    "type": d.gpu_type,
                    "health": (Health.HEALTHY if d.cls.healthy else Health.UNHEALTHY).value,
                    "tier": d.tier.name,
                }
                for d in inv.devices
            ],
            "cache": {
                "images": sorted(inv.cache.images),
                "checkpoints": sorted(inv.cache.checkpoints),
            },
            **({"topology": topology_to_json(inv.topology)} if inv.topology is not None else {}),
        },
    }


def _holder_owner(owner: object, namespace: str) -> JobKey | None:
    if not isinstance(owner, str) or not owner:
        return None
    return JobKey(owner) if is_job_key(owner) else job_key(namespace, owner)


def parse_gpu_allocation(obj: Mapping[str, Any]) -> tuple[NodeName, tuple[Allocation, ...]]:
    """Parse a ``GpuAllocation`` ledger; raise :class:`InvalidInput` naming each bad entry."""
    node = NodeName(_name(obj, contract.KIND_GPU_ALLOCATION))
    spec = obj.get("spec") or {}
    if not isinstance(spec, dict):
        raise InvalidInput(f"GpuAllocation {node}: spec must be an object")
    problems: list[str] = []
    allocations: list[Allocation] = []
    for i, entry in enumerate(spec.get("allocations") or []):
        at = f"GpuAllocation {node}: spec.allocations[{i}]"
        if not isinstance(entry, dict):
            problems.append(f"{at} must be an object")
            continue
        uid, ns, name = entry.get("podUID"), entry.get("namespace"), entry.get("name")
        devices = entry.get("devices")
        priority = _PRIORITIES.get(entry.get("priority", "low"))
        pod_priority = entry.get("podPriority", 0)
        owner = entry.get("owner")
        gang = entry.get("gang")
        if not all(isinstance(v, str) and v for v in (uid, ns, name)):
            problems.append(f"{at} needs podUID, namespace and name")
            continue
        if not isinstance(devices, list) or not all(isinstance(d, str) for d in devices):
            problems.append(f"{at}.devices must be a list of UUIDs")
            continue
        if priority is None or not isinstance(pod_priority, int):
            problems.append(f"{at} has an invalid priority")
            continue
        holder = Holder(
            pod_uid=PodUid(str(uid)),
            namespace=str(ns),
            name=str(name),
            priority=priority,
            pod_priority=pod_priority,
            # A ledger written before owners were namespaced names the job alone: the pod's
            # own namespace is the job's.
            owner=_holder_owner(owner, str(ns)),
            gang=gang if isinstance(gang, str) and gang else None,
        )
        since = entry.get("since", "")
        devs = tuple(GpuUuid(d) for d in devices)
        allocations.append(Allocation(holder, devs, since if isinstance(since, str) else ""))
    if problems:
        raise InvalidInput(problems)
    return node, tuple(allocations)


def allocation_spec(allocations: Iterable[Allocation]) -> dict[str, Any]:
    """The ``spec`` of a ``GpuAllocation`` holding these allocations."""
    return {
        "allocations": [
            {
                "podUID": a.holder.pod_uid,
                "namespace": a.holder.namespace,
                "name": a.holder.name,
                "priority": a.holder.priority.value,
                "podPriority": a.holder.pod_priority,
                **({"owner": a.holder.owner} if a.holder.owner else {}),
                **({"gang": a.holder.gang} if a.holder.gang else {}),
                "devices": list(a.devices),
                "since": a.since,
            }
            for a in allocations
        ]
    }


def gpu_allocation_object(
    node: NodeName, allocations: Iterable[Allocation], resource_version: str = ""
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": node}
    if resource_version:
        meta["resourceVersion"] = resource_version
    return {
        "apiVersion": contract.API_VERSION,
        "kind": contract.KIND_GPU_ALLOCATION,
        "metadata": meta,
        "spec": allocation_spec(allocations),
    }


# The pod condition Kubernetes sets on the pods it disrupts (preemption, eviction, taints), and
# tidelease on the borrowers it reclaims.
DISRUPTION_TARGET = "DisruptionTarget"


def eviction(namespace: str, name: str, uid: str, grace_s: int | None = None) -> dict[str, Any]:
    """The Eviction (policy/v1) of that very pod (its UID a precondition), with ``grace_s``
    seconds to stop (None: the pod's own grace)."""
    options: dict[str, Any] = {"preconditions": {"uid": uid}}
    if grace_s is not None:
        options["gracePeriodSeconds"] = grace_s
    return {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": name, "namespace": namespace},
        "deleteOptions": options,
    }
