"""Parse a Pod (as JSON from kube-scheduler or the API server) into a :class:`PodRequest`. Pure.

This is the pod-author contract in code. Every problem is collected, so an author fixing a pod
sees all of them at once.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from common import contract
from common.annotationrules import annotation_problems
from common.checkpointref import parse_checkpoint_ref
from common.coercion import items, whole
from common.errors import InvalidInput
from common.gangs import gang_of
from common.model import PodRequest, PodUid, Priority, Tier
from common.tenancy import job_key
from common.topology import REQUIREMENTS

_INTEGER = re.compile(r"^[0-9]{1,6}$")

_PRIORITIES = {p.value: p for p in Priority}
_TIERS = {t.name: t for t in Tier}


def _str_map(value: object, where: str, problems: list[str]) -> Mapping[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        problems.append(f"{where} must be a map of strings")
        return {}
    return value


def _obj(value: object, where: str, problems: list[str]) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        problems.append(f"{where} must be an object")
        return {}
    return value


def _list(value: object, where: str, problems: list[str]) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        problems.append(f"{where} must be a list")
        return []
    return value


def _quantity(value: object, where: str, problems: list[str]) -> int:
    """An extended resource quantity: Kubernetes only admits whole numbers for these."""
    if whole(value) and 0 <= value < 1_000_000:
        return value
    if isinstance(value, str) and _INTEGER.match(value):
        return int(value)
    problems.append(f"{where} must be a whole number of GPUs, got {value!r}")
    return 0


def _container_gpus(container: object, where: str, resource: str, problems: list[str]) -> int:
    c = _obj(container, where, problems)
    res = _obj(c.get("resources"), f"{where}.resources", problems)
    limits = _obj(res.get("limits"), f"{where}.resources.limits", problems)
    requests = _obj(res.get("requests"), f"{where}.resources.requests", problems)
    # Extended resources must have limits == requests; a limit alone implies the request.
    raw = limits.get(resource)
    if raw is None:
        raw = requests.get(resource)
    if raw is None:
        return 0
    return _quantity(raw, f"{where}.resources[{resource}]", problems)


def gpu_count(spec: Mapping[str, Any], resource: str, problems: list[str]) -> int:
    """GPUs a pod needs: the sum over containers, or the largest init container if larger."""
    containers = _list(spec.get("containers"), "spec.containers", problems)
    inits = _list(spec.get("initContainers"), "spec.initContainers", problems)
    total = sum(
        _container_gpus(c, f"spec.containers[{i}]", resource, problems)
        for i, c in enumerate(containers)
    )
    init_max = max(
        (
            _container_gpus(c, f"spec.initContainers[{i}]", resource, problems)
            for i, c in enumerate(inits)
        ),
        default=0,
    )
    return max(total, init_max)


def parse_pod(pod: object, *, resource: str = contract.DEFAULT_GPU_RESOURCE) -> PodRequest:
    """Parse a pod object; raise :class:`InvalidInput` listing every problem found."""
    problems: list[str] = []
    if not isinstance(pod, dict):
        raise InvalidInput("Pod must be an object")
    meta = _obj(pod.get("metadata"), "Pod.metadata", problems)
    spec = _obj(pod.get("spec"), "Pod.spec", problems)

    name, namespace, uid = meta.get("name"), meta.get("namespace", "default"), meta.get("uid")
    for field_name, value in (("name", name), ("namespace", namespace), ("uid", uid)):
        if not isinstance(value, str) or not value:
            problems.append(f"Pod.metadata.{field_name} must be a non-empty string")
    annotations = _str_map(meta.get("annotations"), "Pod.metadata.annotations", problems)

    pod_priority = spec.get("priority", 0)
    if pod_priority is None:
        pod_priority = 0
    if not whole(pod_priority):
        problems.append(f"Pod.spec.priority must be an integer, got {pod_priority!r}")
        pod_priority = 0

    gpus = gpu_count(spec, resource, problems)
    problems += annotation_problems(annotations)

    images: set[str] = set()
    for i, c in enumerate(_list(spec.get("containers"), "spec.containers", [])):
        image = c.get("image") if isinstance(c, dict) else None
        if isinstance(image, str) and image:
            images.add(image)
        elif image is not None:
            problems.append(f"spec.containers[{i}].image must be a string")

    priority_class = spec.get("priorityClassName") or ""
    if not isinstance(priority_class, str):
        problems.append("Pod.spec.priorityClassName must be a string")
        priority_class = ""

    if problems:
        raise InvalidInput(problems)
    # Every annotation is valid from here on (annotation_problems found nothing).
    owner = annotations.get(contract.ANN_OWNER)
    checkpoint = parse_checkpoint_ref(annotations.get(contract.ANN_CHECKPOINT) or "")
    return PodRequest(
        namespace=str(namespace),
        name=str(name),
        uid=PodUid(str(uid)),
        gpus=gpus,
        priority=_PRIORITIES[annotations.get(contract.ANN_PRIORITY, Priority.LOW.value)],
        pod_priority=pod_priority,
        # The job of the pod's own namespace: a pod names no other namespace's job.
        owner=job_key(str(namespace), owner) if owner else None,
        min_tier=_TIERS[annotations.get(contract.ANN_RELIABILITY, Tier.LA.name)],
        gpu_type=annotations.get(contract.ANN_GPU_TYPE),
        # tidelease.io/reclaim grants nothing: a reclaim is derived from the pod's GpuLease
        # and workload (extender.cluster.state.ClusterState.with_reclaim).
        # What nodes' caches are keyed by.
        checkpoint=checkpoint.id if checkpoint is not None else None,
        images=frozenset(images),
        controller=controller_of(meta),
        priority_class=priority_class,
        gang=gang_of(pod),
        lent_only=annotations.get(contract.ANN_LENT_ONLY) == "true",
        gpu_topology=REQUIREMENTS.get(annotations.get(contract.ANN_GPU_TOPOLOGY, "")),
    )


def controller_of(meta: Mapping[str, Any]) -> tuple[str, str] | None:
    """The (kind, name) of an object's controlling owner reference, if it has one."""
    refs = meta.get("ownerReferences")
    for ref in items(refs):
        if isinstance(ref, dict) and ref.get("controller") is True:
            kind, name = ref.get("kind"), ref.get("name")
            if isinstance(kind, str) and isinstance(name, str):
                return kind, name
    return None
