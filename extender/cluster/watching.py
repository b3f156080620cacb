"""Keep a watched view current: apply a store's watch events to the cluster and pod caches.

The extender watches every kind for as long as it runs. The leasing controller watches its view
only while it has something to act on (:class:`DemandView`): a watch of every pod and ledger
costs a process CPU on every pod the cluster schedules, whether or not anyone reads the view.
"""

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
from common.waiting import first_of
from extender.cluster.state import ClusterState
from extender.cluster.store import KINDS, Kind, Store

log = logging.getLogger(__name__)

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
    """The pods that use GPUs: raw objects by namespace/name (for bind), status by UID (for GC).
    With ``claims`` (the leasing controller in DRA mode), pods with ResourceClaims too."""

    def __init__(self, resource: str = contract.DEFAULT_GPU_RESOURCE, claims: bool = False) -> None:
        self._resource, self._claims = resource, claims
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
        if not isinstance(spec, dict):
            return False
        return gpu_count(spec, self._resource, []) > 0 or bool(
            self._claims and spec.get("resourceClaims")
        )

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


class ClaimCache:
    """ResourceClaims from the watch, raw, by namespace/name (the leasing controller's, in DRA
    mode: who holds which device, extender.leasing.claimpinning)."""

    def __init__(self) -> None:
        self._raw: dict[tuple[str, str], dict[str, Any]] = {}

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._raw.get((namespace, name))

    def raw_claims(self) -> list[dict[str, Any]]:
        return list(self._raw.values())

    def apply(self, event: str, claim: dict[str, Any]) -> None:
        meta = claim.get("metadata") or {}
        key = (str(meta.get("namespace", "")), str(meta.get("name", "")))
        if event == "DELETED":
            self._raw.pop(key, None)
        else:
            self._raw[key] = claim

    def __len__(self) -> int:
        return len(self._raw)


class LeaseSink(Protocol):
    def apply(self, event: str, obj: dict[str, Any]) -> None: ...


Apply = Callable[[Kind, str, dict[str, Any]], None]


async def follow_watch(
    *,
    store: Store,
    kinds: tuple[Kind, ...],
    apply: Apply,
    synced: Callable[[], None] | None = None,
) -> None:
    """Hand every event of a watch of ``kinds`` to ``apply`` until cancelled; call ``synced``
    once, when every kind has listed."""
    listed: set[Kind] = set()
    async for kind, event, obj in store.watch(kinds):
        if event != "SYNCED":
            apply(kind, event, obj)
            continue
        listed.add(kind)
        if synced is not None and listed.issuperset(kinds):
            synced()
            synced = None


def view_applier(
    cluster: ClusterState,
    pods: PodCache,
    *,
    leases: LeaseSink | None = None,
    pod_gone: Callable[[], None] | None = None,
    claims: ClaimCache | None = None,
    on_pod: Callable[[dict[str, Any]], None] | None = None,
) -> Apply:
    """What a watched view does with each event: the extender's rules for its cluster state,
    kept in one place for every reader (the watch below, ``tidelease ctl explain``)."""

    def apply(kind: Kind, event: str, obj: dict[str, Any]) -> None:
        if kind == "Pod":
            pods.apply(event, obj)
            if on_pod is not None and event != "DELETED":
                on_pod(obj)
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
        elif kind == "Namespace":
            cluster.apply_namespace(event, obj)
        elif kind == "ResourceClaim" and claims is not None:
            claims.apply(event, obj)

    return apply


async def run_watch(
    *,
    store: Store,
    cluster: ClusterState,
    pods: PodCache,
    ready: asyncio.Event | None = None,
    leases: LeaseSink | None = None,
    pod_gone: Callable[[], None] | None = None,
    kinds: tuple[Kind, ...] = KINDS,
    claims: ClaimCache | None = None,
    on_pod: Callable[[dict[str, Any]], None] | None = None,
) -> None:
    """Apply watch events of ``kinds`` until cancelled; set ``ready`` once every kind has
    synced. ``on_pod`` is told of every pod added or changed, after the caches."""
    apply = view_applier(
        cluster, pods, leases=leases, pod_gone=pod_gone, claims=claims, on_pod=on_pod
    )

    def synced() -> None:
        log.info("initial sync done: %d nodes, %d GPU pods", len(cluster), len(pods.by_uid))
        if ready is not None:
            ready.set()

    await follow_watch(store=store, kinds=kinds, apply=apply, synced=synced)


def liveness_interval(timeout_s: float) -> float:
    """How often :func:`run_liveness` judges the agents: every 5 s, or a quarter of the timeout
    if that is shorter. A node whose agent is heard again is offered at the next judgement."""
    return min(5.0, timeout_s / 4)


async def run_liveness(
    *,
    cluster: ClusterState,
    timeout_s: float,
    clock: Callable[[], float] = time.time,
) -> None:
    """Stop offering the devices of nodes whose agent went silent, until cancelled. Checks
    every 5 s, or a quarter of the timeout if that is shorter."""
    interval_s = liveness_interval(timeout_s)
    while True:
        cluster.sweep(clock(), timeout_s)
        await asyncio.sleep(interval_s)


class ClusterView(Protocol):
    """A watched view as its reader sees it: the cluster and its GPU pods, to be read once
    ``synced`` is set; ``want`` says whether the reader needs it at all (and why)."""

    @property
    def cluster(self) -> ClusterState: ...

    @property
    def pods(self) -> PodCache: ...

    @property
    def claims(self) -> ClaimCache:
        """ResourceClaims: empty unless the view watches them (DRA mode)."""
        ...

    # Told of every pod the watch adds or changes (the leasing controller in DRA mode: a gated
    # pod of an owner steps its lease); None: nobody.
    on_pod: Callable[[dict[str, Any]], None] | None

    @property
    def synced(self) -> asyncio.Event: ...

    @property
    def active(self) -> bool:
        """Whether the view is being watched now."""
        ...

    def want(self, wanted: bool, why: str) -> None: ...


class DemandView:
    """A view watched only while it is wanted (:meth:`want`), by :meth:`run`.

    Each time it is wanted it starts afresh: a new cluster state and pod cache, a watch of
    ``kinds`` and the agents' liveness sweep; ``synced`` is set once the watch has listed.
    With ``"ResourceClaim"`` among ``kinds`` it keeps the claims, and the pods that have any.
    When it is no longer wanted the watch stops and the state is dropped, its memory with it;
    ``synced`` is cleared. Each start and stop is logged once, with the reason given to
    :meth:`want`.
    """

    def __init__(
        self,
        store: Store,
        *,
        kinds: tuple[Kind, ...],
        resource: str = contract.DEFAULT_GPU_RESOURCE,
        agent_timeout_s: float,
        name: str = "view",
    ) -> None:
        self._store, self._kinds, self._resource = store, kinds, resource
        self._agent_timeout_s, self._name = agent_timeout_s, name
        self._claims = "ResourceClaim" in kinds
        self.cluster, self.pods, self.claims = self._empty()
        self.on_pod: Callable[[dict[str, Any]], None] | None = None
        self.synced = asyncio.Event()
        self.active = False
        self._why = {True: "", False: ""}  # the reason last given to start, and to stop
        self._on, self._off = asyncio.Event(), asyncio.Event()
        self._off.set()

    def _empty(self) -> tuple[ClusterState, PodCache, ClaimCache]:
        return ClusterState(), PodCache(self._resource, claims=self._claims), ClaimCache()

    def want(self, wanted: bool, why: str) -> None:
        """Watch (``wanted``) or stop; ``why`` is logged when :meth:`run` acts on it."""
        if wanted == self._on.is_set():
            return
        self._why[wanted] = why
        (self._on if wanted else self._off).set()
        (self._off if wanted else self._on).clear()

    def ready(self) -> bool:
        """Whether the reader can act: the view is not wanted, or it has synced."""
        return not self._on.is_set() or self.synced.is_set()

    async def run(self) -> None:
        """Watch while wanted, until cancelled; a watch that fails raises here."""
        while True:
            await self._on.wait()
            log.info("%s: watching %s: %s", self._name, ", ".join(self._kinds), self._why[True])
            try:
                await self._watch_until_unwanted()
            finally:
                # Dropped: nothing refers to the old state any more, and the next start
                # begins with these empty ones.
                self.synced.clear()
                self.cluster, self.pods, self.claims = self._empty()
                self.active = False
            log.info("%s: stopped watching: %s", self._name, self._why[False])

    async def _watch_until_unwanted(self) -> None:
        self.active = True
        watching = (
            asyncio.create_task(
                run_watch(
                    store=self._store,
                    cluster=self.cluster,
                    pods=self.pods,
                    ready=self.synced,
                    kinds=self._kinds,
                    claims=self.claims,
                    on_pod=self.on_pod,
                ),
                name=f"{self._name}-watch",
            ),
            asyncio.create_task(
                run_liveness(cluster=self.cluster, timeout_s=self._agent_timeout_s),
                name=f"{self._name}-liveness",
            ),
        )
        try:
            await first_of(self._off, watching)
        finally:
            for task in watching:
                task.cancel()
            await asyncio.gather(*watching, return_exceptions=True)
