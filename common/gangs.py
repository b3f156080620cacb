"""Gangs: pods that are useful only together, and what evicting one loses. Pure.

A pod is in a gang when it says so the upstream way, ``spec.workloadRef`` (Kubernetes' Workload
API, ``scheduling.k8s.io/v1alpha1`` in 1.35: the Workload's name, the pod group within it and,
for groups with replicas, the replica's key), or, where the Workload API is not in use,
tidelease's own annotation ``tidelease.io/pod-group: NAME``. Either way the gang is a gang of
the pod's own namespace: its key starts with the namespace, so no pod of another namespace can
join it (or have its members evicted with it).

A pod may say when it last saved its work, ``tidelease.io/checkpointed-at`` (RFC 3339). Evicting
it loses what it did since then; a pod that says nothing loses everything since it started.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from common import contract

# The Workload API's version of the cluster's kube-scheduler (1.35): its Pod field and its group.
WORKLOAD_API = "scheduling.k8s.io/v1alpha1"
WORKLOAD_REF = "workloadRef"


def gang_of(pod: Mapping[str, Any]) -> str | None:
    """The pod's gang, as a key of its namespace: ``NS/workload/NAME/GROUP[/REPLICA]`` from
    ``spec.workloadRef``, else ``NS/pod-group/NAME`` from the annotation; None: it runs alone.
    Malformed values are taken as none (the annotation's form is checked at admission and by
    the filter)."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    namespace = meta.get("namespace") or "default"
    ref = spec.get(WORKLOAD_REF)
    if isinstance(ref, dict):
        name, group = ref.get("name"), ref.get("podGroup")
        if isinstance(name, str) and name and isinstance(group, str) and group:
            key = f"{namespace}/workload/{name}/{group}"
            replica = ref.get("podGroupReplicaKey")
            return f"{key}/{replica}" if isinstance(replica, str) and replica else key
    annotations = meta.get("annotations") or {}
    group = annotations.get(contract.ANN_POD_GROUP) if isinstance(annotations, dict) else None
    if isinstance(group, str) and group:
        return f"{namespace}/pod-group/{group}"
    return None


def parse_time(value: object) -> float | None:
    """Epoch seconds of an RFC 3339 time with its offset; None for anything else."""
    if not isinstance(value, str):
        return None
    try:
        t = datetime.fromisoformat(value)
    except ValueError:
        return None
    return t.timestamp() if t.tzinfo is not None else None


def saved_at(pod: Mapping[str, Any]) -> float | None:
    """When the pod's work was last saved (epoch seconds): its ``checkpointed-at``, else its
    start (``status.startTime``: nothing saved since); None for a pod not started. A checkpoint
    before the start counts as the start: what the pod author writes never makes the pod lose
    more than it has run (a pod that claims a checkpoint of 1970 is no dearer a victim)."""
    meta = pod.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    start = parse_time((pod.get("status") or {}).get("startTime"))
    at = None
    if isinstance(annotations, dict):
        at = parse_time(annotations.get(contract.ANN_CHECKPOINTED_AT))
    if at is None:
        return start
    return at if start is None else max(at, start)


def work_lost_s(pod: Mapping[str, Any], now: float) -> float:
    """Seconds of work evicting the pod now loses: since it last saved (0 for a pod not
    started, or one that saved in the future of ``now``: clocks differ)."""
    at = saved_at(pod)
    return 0.0 if at is None else max(0.0, now - at)
