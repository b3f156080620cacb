"""The bind verb: choose devices, record them, then bind. And the release of stale allocations.

Device choice sticks because every allocation goes through the node's ``GpuAllocation`` ledger
with compare-and-swap on its resourceVersion:

1. pick devices on the chosen node from the current view (:func:`pick_devices`);
2. write the ledger with the new allocation, conditional on the version the pick was made from;
   a lost race re-reads the ledger and picks again, so two replicas (or two concurrent binds)
   never hand out one device twice;
3. create the Binding, carrying the device UUIDs as annotations: the API server writes them on
   the pod in the same update that binds it (the node agent's device plugin reads them), so a
   pod is never bound without its devices, nor annotated without being bound.

If 3 fails the allocation is released again; if the process dies in between, the reaper
releases it once the pod turns out not to be bound there (:func:`stale_allocations`). A retried
bind of a pod that already holds an allocation on the node reuses it.

Reference: weflex Algorithm 1 (PICKGPUS) (docs/references.md).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Set
from dataclasses import dataclass
from datetime import UTC, datetime

from common import contract
from common.errors import Conflict, NotFound, TideleaseError
from common.model import Allocation, GpuUuid, NodeName, PodRequest, PodUid
from common.waiting import wait_event
from extender.cluster.state import ClusterState, NodeState
from extender.cluster.store import Store
from extender.cluster.watching import TERMINAL_PHASES, PodCache, PodStatus
from extender.scheduler.admitting import placed_request
from extender.scheduler.metrics import ExtenderMetrics
from extender.scheduler.placement import pick_devices
from extender.scheduler.settings import ExtenderSettings

log = logging.getLogger(__name__)

Clock = Callable[[], datetime]

# Ledgers the reaper writes at once (each node's own write, one node's at a time).
RELEASES_AT_ONCE = 16


def utcnow() -> datetime:
    return datetime.now(UTC)


class BindRefused(TideleaseError):
    """The pod cannot be bound to that node now (no room, unknown node); the scheduler retries."""


@dataclass(frozen=True, slots=True)
class BindResult:
    node: NodeName
    devices: tuple[str, ...]
    reused: bool


def stale_allocations(
    allocations: Iterable[Allocation],
    node: NodeName,
    pods: Mapping[PodUid, PodStatus],
    now: datetime,
    *,
    reserve_ttl_s: float,
    missing_grace_s: float,
    gone: Set[PodUid] = frozenset(),
) -> list[tuple[Allocation, str]]:
    """Allocations to release, each with its reason. Pure. ``gone``: pods seen deleted."""
    stale: list[tuple[Allocation, str]] = []
    for a in allocations:
        if a.holder.pod_uid in gone:
            stale.append((a, "pod-gone"))
            continue
        try:
            age = (now - datetime.fromisoformat(a.since)).total_seconds()
        except ValueError:
            age = float("inf")  # no usable timestamp: treat as old
        pod = pods.get(a.holder.pod_uid)
        if pod is None:
            if age > missing_grace_s:
                stale.append((a, "pod-gone"))
        elif pod.phase in TERMINAL_PHASES:
            stale.append((a, "pod-finished"))
        elif pod.node_name and pod.node_name != node:
            stale.append((a, "pod-elsewhere"))
        elif not pod.node_name and age > reserve_ttl_s:
            stale.append((a, "never-bound"))
    return stale


class Binder:
    def __init__(
        self,
        *,
        store: Store,
        cluster: ClusterState,
        pods: PodCache,
        settings: ExtenderSettings,
        metrics: ExtenderMetrics,
        clock: Clock = utcnow,
    ) -> None:
        self._store = store
        self._cluster = cluster
        self._pods = pods
        self._settings = settings
        self._metrics = metrics
        self._clock = clock
        self._locks: dict[str, asyncio.Lock] = {}
        self._soon = asyncio.Event()

    def _lock(self, node: str) -> asyncio.Lock:
        lock = self._locks.get(node)
        if lock is None:
            lock = self._locks[node] = asyncio.Lock()
        return lock

    async def _refresh_ledger(self, node: NodeName) -> None:
        allocations, version = await self._store.read_ledger(node)
        self._cluster.set_ledger(node, allocations, version)

    async def _request(self, namespace: str, name: str, uid: str) -> tuple[PodRequest, str]:
        """The pod's request and the node it is already bound to ("" if none). Refuses pods
        the extender does not place: of a scheduler it does not serve, or asking for no GPU
        (kube-scheduler sends it only pods of its managed resource)."""
        raw = self._pods.get(namespace, name)
        if raw is None or (raw.get("metadata") or {}).get("uid") != uid:
            raw = await self._store.get_pod(namespace, name)
        if raw is None:
            raise NotFound(f"pod {namespace}/{name} not found")
        req = placed_request(
            self._cluster,
            raw,
            resource=self._settings.gpu_resource,
            online_class=self._settings.online_priority_class,
            release_key=self._settings.queue_release_key(),
        )
        if req.uid != uid:
            raise NotFound(f"pod {namespace}/{name} has UID {req.uid}, not {uid}")
        spec = raw.get("spec") or {}
        scheduler = spec.get("schedulerName") or "default-scheduler"
        if scheduler not in self._settings.scheduler_names:
            raise BindRefused(
                f"pod {req.key} is for scheduler {scheduler!r}, which this extender does not serve"
            )
        if req.gpus == 0:
            raise BindRefused(
                f"pod {req.key} asks for no {self._settings.gpu_resource}: only GPU pods are bound"
            )
        return req, str(spec.get("nodeName") or "")

    async def _allocate(self, req: PodRequest, node: NodeName) -> tuple[Allocation, bool]:
        """Record an allocation for the pod on the node; (allocation, reused)."""
        for attempt in range(self._settings.bind_attempts):
            async with self._lock(node):
                state = self._cluster.get(node)
                if state is None or not state.has_inventory:
                    raise BindRefused(f"node {node} has no GPU inventory")
                if state.silent:
                    raise BindRefused(f"node {node}: agent silent, its GPUs are not offered")
                if req.uid in state.allocations and req.uid in state.ledger:
                    return state.ledger[req.uid], True
                taken = state.unavailable_to(req, self._clock().timestamp())
                devices = self._held(req, state, taken)
                if devices is None:
                    plan, chosen = pick_devices(state.devices, taken, req, state.topology)
                    if not plan.fits:
                        raise BindRefused(plan.reason)
                    devices = tuple(d.uuid for d in chosen)
                allocation = Allocation(req.holder(), devices, self._clock().isoformat())
                # the stored entries of live pods (not other pods' reservations), and this one
                stored = [
                    a for u, a in state.allocations.items() if u in state.ledger and u != req.uid
                ]
                allocations = (*stored, allocation)
                try:
                    version = await self._store.write_ledger(
                        node, allocations, state.ledger_version
                    )
                except Conflict:
                    self._metrics.bind_conflicts.inc()
                    log.info(
                        "ledger of %s changed under bind of %s (attempt %d), re-reading",
                        node,
                        req.key,
                        attempt + 1,
                    )
                    await self._refresh_ledger(node)
                    continue
                self._cluster.set_ledger(node, allocations, version)
                self._cluster.unreserve(req.uid)  # in the ledger now
                return allocation, False
        raise BindRefused(f"ledger of node {node} kept changing; giving up for now")

    def _held(
        self, req: PodRequest, state: NodeState, taken: list[GpuUuid]
    ) -> tuple[GpuUuid, ...] | None:
        """The devices held for a gang pod on this node (extender.scheduler.gangplacement),
        while each is healthy and none is taken; None: pick afresh (a hold on another node is
        dropped: kube-scheduler placed the pod elsewhere)."""
        held = self._cluster.reservation(req.uid)
        if held is None:
            return None
        where, allocation = held
        healthy = {d.uuid for d in state.devices if d.cls.healthy}
        devices = set(allocation.devices)
        if where != state.node or devices & set(taken) or not devices <= healthy:
            self._cluster.unreserve(req.uid)
            return None
        return allocation.devices

    async def release(self, node: NodeName, uids: set[PodUid], reason: str) -> int:
        """Remove the pods' allocations from the node's ledger; the number removed."""
        for _ in range(self._settings.bind_attempts):
            async with self._lock(node):
                state = self._cluster.get(node)
                if state is None:
                    return 0
                keep = tuple(a for u, a in state.ledger.items() if u not in uids)
                removed = len(state.ledger) - len(keep)
                if removed == 0:
                    return 0
                try:
                    version = await self._store.write_ledger(node, keep, state.ledger_version)
                except Conflict:
                    self._metrics.bind_conflicts.inc()
                    await self._refresh_ledger(node)
                    continue
                self._cluster.set_ledger(node, keep, version)
                self._metrics.released.labels(reason).inc(removed)
                return removed
        log.warning("could not release %s on %s after retries; the reaper will", uids, node)
        return 0

    async def bind(self, namespace: str, name: str, uid: str, node: str) -> BindResult:
        """Allocate, then bind with the devices annotated. Raises BindRefused, NotFound,
        InvalidInput or Conflict."""
        req, bound_to = await self._request(namespace, name, uid)
        node_name = NodeName(node)
        if bound_to:
            state = self._cluster.get(node)
            held = state.allocations.get(req.uid) if state is not None else None
            if bound_to == node and held is not None:
                return BindResult(node_name, held.devices, True)
            raise Conflict(f"pod {req.key} is already bound to {bound_to}")
        allocation, reused = await self._allocate(req, node_name)
        devices = ",".join(allocation.devices)
        try:
            await self._store.bind_pod(
                namespace,
                name,
                uid,
                node,
                {contract.ANN_DEVICES: devices, contract.ANN_DEVICE_NODE: node},
            )
        except Exception:
            await self.release(node_name, {req.uid}, "bind-failed")
            raise
        log.info(
            "bound pod %s to %s with devices %s%s",
            req.key,
            node,
            devices,
            " (existing allocation)" if reused else "",
        )
        return BindResult(node_name, allocation.devices, reused)

    async def reap_once(self) -> int:
        """Release every stale allocation in the view; the number released. Gang pods'
        reservations past their time are dropped too (in memory only)."""
        self._cluster.expire_reservations(time.monotonic())
        now = self._clock()
        releases: list[tuple[NodeName, set[PodUid], str]] = []
        for state in list(self._cluster):
            stale = stale_allocations(
                state.ledger.values(),
                state.node,
                self._pods.by_uid,
                now,
                reserve_ttl_s=self._settings.reserve_ttl_s,
                missing_grace_s=self._settings.missing_grace_s,
                gone=self._cluster.gone,
            )
            by_reason: dict[str, set[PodUid]] = {}
            for a, reason in stale:
                log.info(
                    "releasing %s of pod %s on %s: %s",
                    ",".join(a.devices),
                    a.holder.key,
                    state.node,
                    reason,
                )
                by_reason.setdefault(reason, set()).add(a.holder.pod_uid)
            releases.extend((state.node, uids, reason) for reason, uids in by_reason.items())
        # Each node's ledger is its own write: many at once (at dawn hundreds of evicted
        # borrowers' devices, whose owners' replicas wait for them), one node's at a time.
        limit = asyncio.Semaphore(RELEASES_AT_ONCE)

        async def one(node: NodeName, uids: set[PodUid], reason: str) -> int:
            async with limit:
                return await self.release(node, uids, reason)

        results = await asyncio.gather(*(one(*r) for r in releases), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return sum(r for r in results if isinstance(r, int))

    async def run_reaper(self, *, ready: asyncio.Event | None = None) -> None:
        """Release stale allocations every reap interval, until cancelled."""
        if ready is not None:
            await ready.wait()
        while True:
            try:
                await self.reap_once()
            except TideleaseError as e:
                log.warning("reaper pass failed, will retry: %s", e)
            self._metrics.allocated_gpus.set(
                sum(len(a.devices) for s in self._cluster for a in s.allocations.values())
            )
            self._metrics.nodes.set(sum(1 for s in self._cluster if s.offering))
            self._soon.clear()
            await wait_event(self._soon, self._settings.reap_interval_s)

    def reap_soon(self) -> None:
        """A pod went away: look for allocations to release now, not at the next interval."""
        self._soon.set()
