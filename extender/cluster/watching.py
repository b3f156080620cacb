"""Keep the extender's view current: apply a store's watch events to the cluster and pod caches."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from common import contract
from common.model import PodUid
from common.podrequest import gpu_count
from extender.cluster.state import ClusterState
from extender.cluster.store import Kind, Store

log = logging.getLogger(__name__)

_KINDS: tuple[Kind, ...] = ("Pod", "GpuNode", "GpuAllocation", "Lease", "GpuLease")
TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


@dataclass(frozen=True, slots=True)
class PodStatus:
    uid: PodUid
    namespace: str
    name: str
    node_name: str
    phase: str
    deleting: bool


def _status(pod: Mapping[str, Any]) -> PodStatus:
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    return PodStatus(
        uid=PodUid(str(meta.get("uid", ""))),
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        node_name=str(spec.get("nodeName") or ""),
        phase=str(status.get("phase") or "Pending"),
        deleting=bool(meta.get("deletionTimestamp")),
    )


class PodCache:
    """The pods that use GPUs: raw objects by namespace/name (for bind), status by UID (for GC)."""

    def __init__(self, resource: str = contract.DEFAULT_GPU_RESOURCE) -> None:
        self._resource = resource
        self._raw: dict[tuple[str, str], dict[str, Any]] = {}
        self.by_uid: dict[PodUid, PodStatus] = {}

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._raw.get((namespace, name))

    def raw_pods(self) -> list[dict[str, Any]]:
        return list(self._raw.values())

    def _relevant(self, pod: Mapping[str, Any]) -> bool:
        annotations = (pod.get("metadata") or {}).get("annotations") or {}
        if isinstance(annotations, dict) and contract.ANN_DEVICES in annotations:
            return True
        spec = pod.get("spec")
        return isinstance(spec, dict) and gpu_count(spec, self._resource, []) > 0

    def apply(self, event: str, pod: dict[str, Any]) -> None:
        st = _status(pod)
        key = (st.namespace, st.name)
        old = self._raw.get(key)
        if old is not None:
            old_uid = PodUid(str((old.get("metadata") or {}).get("uid", "")))
            if event == "DELETED" or old_uid != st.uid:
                self.by_uid.pop(old_uid, None)
                del self._raw[key]
        if event == "DELETED" or not self._relevant(pod):
            return
        self._raw[key] = pod
        self.by_uid[st.uid] = st


class LeaseSink(Protocol):
    def apply(self, event: str, obj: dict[str, Any]) -> None: ...


async def run_watch(
    *,
    store: Store,
    cluster: ClusterState,
    pods: PodCache,
    ready: asyncio.Event | None = None,
    leases: LeaseSink | None = None,
    pod_gone: Callable[[], None] | None = None,
) -> None:
    """Apply watch events until cancelled; set ``ready`` once every kind has synced."""
    synced: set[str] = set()
    async for kind, event, obj in store.watch():
        if event == "SYNCED":
            synced.add(kind)
            if ready is not None and synced.issuperset(_KINDS) and not ready.is_set():
                log.info("initial sync done: %d nodes, %d GPU pods", len(cluster), len(pods.by_uid))
                ready.set()
            continue
        if kind == "Pod":
            pods.apply(event, obj)
            meta = obj.get("metadata") or {}
            # A terminating pod's devices count as free: kube-scheduler itself keeps counting
            # them until the pod is deleted, and retries its pods on that deletion, by which
            # time this view has long moved on (no race with the watch).
            if (
                event == "DELETED"
                or meta.get("deletionTimestamp")
                or (obj.get("status") or {}).get("phase") in TERMINAL_PHASES
            ):
                cluster.pod_gone(PodUid(str(meta.get("uid", ""))))
                if pod_gone is not None:
                    pod_gone()
        elif kind == "GpuNode":
            cluster.apply_gpu_node(event, obj)
        elif kind == "GpuAllocation":
            cluster.apply_gpu_allocation(event, obj)
        elif kind == "Lease":
            cluster.apply_lease(event, obj)
        elif kind == "GpuLease":
            cluster.apply_gpu_lease(event, obj)
            if leases is not None:
                leases.apply(event, obj)


async def run_liveness(
    *,
    cluster: ClusterState,
    timeout_s: float,
    clock: Callable[[], float] = time.time,
) -> None:
    """Stop offering the devices of nodes whose agent went silent, until cancelled. Checks
    every 5 s, or a quarter of the timeout if that is shorter."""
    interval_s = min(5.0, timeout_s / 4)
    while True:
        cluster.sweep(clock(), timeout_s)
        await asyncio.sleep(interval_s)
