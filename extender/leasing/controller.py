"""The leasing controller: executes :mod:`extender.leasing.decisions`'s decisions against the API
server.

It runs in the controllers' process (extender/controllers.py) and acts only while it holds the
leader Lease. It reads a watched view of its own (devices, ledgers, pods, agents' Leases:
:data:`VIEW_KINDS`), and only while it has something to act on: a GpuLease, or standby targets
to keep (:meth:`LeaseController.wants_view`). Without either the view is not watched at all,
and scheduling GPU pods costs this process nothing; GpuLeases alone are always watched.

Every GpuLease is stepped until its next action is to wait; a step is one idempotent API
write. The devices' tags live in the ``GpuNode`` specs (compare-and-swap), the lease's progress
in the ``GpuLease`` status (compare-and-swap), so a controller killed at any point resumes from
what is stored.

It runs on :class:`common.reconcile.ReconcileLoop` (named ``leasing``): one key per GpuLease
(``namespace/name``) and one, :data:`STANDBY_KEY`, for the standby pool's top-up. A lease's
watch event queues its key (:attr:`LeaseCache.on_change`); reconciling it is one step, and the
step's result says when to step again (soon after an action, at a ``Wait``'s time otherwise).
The loop gives every key its own retry (a Conflict after 0.2 s, other errors with backoff), so
one lease failing never delays another, and its shared metrics
(``tidelease_controller_*{controller="leasing"}``) count the reconciles, errors and retries;
:class:`LeasingMetrics` keeps only what lending itself does.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from common import contract
from common.dra import API_VERSION as DRA_API_VERSION
from common.dra import ATTR_RECLAIMING as RECLAIMING
from common.errors import Conflict, InvalidInput, NotFound, TideleaseError, TooManyRequests
from common.events import Involved, post_event
from common.kubeclient import KubeClient
from common.model import Device, GpuUuid, Holder, JobKey, PodUid, Priority
from common.objects import object_key
from common.podrequest import controller_of, parse_pod
from common.reconcile import ReconcileLoop, ReconcileSettings, Requeue, Result
from common.tenancy import belongs, granted, online_refusal, pod_owner
from common.timefmt import epoch, microtime, rfc3339
from extender.cluster.state import ClusterState
from extender.cluster.store import Kind
from extender.cluster.watching import ClusterView, PodCache
from extender.leasing import dra
from extender.leasing.decisions import (
    RECLAIM_OVERDUE_S,
    Action,
    Evict,
    Notify,
    OwnerPod,
    ScaleTo,
    SetTags,
    TagChange,
    View,
    Wait,
    WriteStatus,
    decide,
    legacy_tags,
    overdue,
)
from extender.leasing.lease import (
    GpuLease,
    LeaseStatus,
    Trouble,
    Workload,
    lease_conditions,
    parse_gpu_lease,
)
from extender.leasing.rules import TypeTier, standby_excess, standby_topup
from extender.queues.allocation import JobView
from extender.queues.jobviews import held_by_job, job_views
from extender.queues.preemption import eviction_cost

log = logging.getLogger(__name__)

EVICTION_GRACE_S = 2  # termination grace of an evicted borrower, after its notice period
# A 429 on an eviction that names no disruption budget is the API server's own rate limit (API
# Priority and Fairness): the eviction is asked again after its Retry-After (else 1 s, doubling),
# up to EVICTION_TRIES times in all, then the step fails and the reconcile loop takes it again
# after its backoff. Never read as a refusing budget: the pod is not deleted for it.
EVICTION_TRIES = 4
EVICTION_BACKOFF_MAX_S = 8.0
# The reason of the DisruptionTarget condition on a borrower evicted by a reclaim.
DISRUPTION_REASON = "TideleaseReclaim"
# The reconcile key of the standby pool's top-up: no GpuLease key is without a "/".
STANDBY_KEY = "standby-pool"
# After an action, the lease is stepped again this soon (its watch event usually comes first).
STEP_AGAIN_S = 0.1
# A Wait whose time has come is stepped again no sooner than this (never a busy loop).
MIN_WAIT_S = 0.05
RESYNC_S = 30.0  # every lease (and the standby key) is reconciled at least this often
# The first retry after an error (the old loop's fixed 2 s), doubling to the resync period.
RETRY_BASE_S = 2.0
# What a step reads besides the GpuLease itself: the owner's and borrowers' pods, devices and
# tags (GpuNodes), holders (ledgers), which nodes offer devices (agents' Leases).
VIEW_KINDS: tuple[Kind, ...] = ("Pod", "GpuNode", "GpuAllocation", "Lease")
# In DRA mode (docs/dra.md) the devices pods hold are in their ResourceClaims too.
DRA_VIEW_KINDS: tuple[Kind, ...] = (*VIEW_KINDS, "ResourceClaim")


class LeaseCache:
    """GpuLease objects from the watch, by namespace/name.

    ``on_change`` (set by :class:`LeaseController`) is told the key of every lease an event
    touched, deletions included, so the controller reconciles that lease, and only it.
    """

    def __init__(self) -> None:
        self.raw: dict[str, dict[str, Any]] = {}
        self.on_change: Callable[[str], None] | None = None
        # Namespaces an admin granted online jobs (common.tenancy): only their leases step.
        self.granted: set[str] = set()

    def apply(self, event: str, obj: dict[str, Any]) -> None:
        key = object_key(obj)
        if event == "DELETED":
            self.raw.pop(key, None)
        else:
            self.raw[key] = obj
        if self.on_change is not None:
            self.on_change(key)

    def apply_namespace(self, event: str, obj: dict[str, Any]) -> None:
        """A Namespace of the granted ones (the watch selects them by label) came or went: its
        leases are stepped again (or stopped, with a Degraded condition saying why)."""
        meta = obj.get("metadata") or {}
        name = str(meta.get("name", ""))
        was = name in self.granted
        if event != "DELETED" and granted(meta.get("labels")):
            self.granted.add(name)
        else:
            self.granted.discard(name)
        if was != (name in self.granted) and self.on_change is not None:
            prefix = f"{name}/"
            for key in [k for k in self.raw if k.startswith(prefix)]:
                self.on_change(key)


class World(Protocol):
    """The writes the controller makes (and the one read the watches do not give it)."""

    async def replicas(self, namespace: str, workload: Workload) -> int: ...

    async def scale(self, namespace: str, workload: Workload, replicas: int) -> None: ...

    async def set_tags(self, changes: Iterable[TagChange]) -> None: ...

    async def write_status(
        self, lease: GpuLease, status: LeaseStatus, degraded: Trouble | None = None
    ) -> None: ...

    async def notify(self, pod: Holder, lease: GpuLease, deadline: float) -> None: ...

    async def evict(self, pod: Holder, lease: GpuLease) -> None: ...

    async def pin(self, step: dra.Pin, lease: GpuLease) -> None: ...

    async def ungate(self, step: dra.Ungate, lease: GpuLease) -> None: ...

    async def mark_reclaiming(self, step: dra.MarkReclaiming) -> None: ...


class KubeWorld:
    def __init__(
        self, kube: KubeClient, *, sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    ) -> None:
        self._kube = kube
        self._sleep = sleep  # between throttled evictions (tests: no real waits)

    async def replicas(self, namespace: str, workload: Workload) -> int:
        scale = await self._kube.json("GET", workload.path(namespace) + "/scale")
        return int((scale.get("spec") or {}).get("replicas") or 0)

    async def scale(self, namespace: str, workload: Workload, replicas: int) -> None:
        await self._kube.json(
            "PATCH",
            workload.path(namespace) + "/scale",
            body={"spec": {"replicas": replicas}},
            content_type="application/merge-patch+json",
        )

    async def set_tags(self, changes: Iterable[TagChange]) -> None:
        """Each device's tags as the change says; a device that stays lent keeps its
        ``reclaiming`` mark (DRA mode: :meth:`mark_reclaiming`), one given back loses it."""
        by_node: dict[str, list[TagChange]] = {}
        for c in changes:
            by_node.setdefault(c.node, []).append(c)

        def edit(entries: dict[str, dict[str, Any]], node_changes: list[TagChange]) -> None:
            for c in node_changes:
                entry: dict[str, Any] = {"uuid": c.uuid}
                if c.owner:
                    entry["owner"] = c.owner
                if c.standby:
                    entry["standby"] = True
                if c.owner and c.replica:
                    entry["replica"] = c.replica
                if c.owner and (entries.get(c.uuid) or {}).get(RECLAIMING):
                    entry[RECLAIMING] = True
                entries[c.uuid] = entry

        for node, node_changes in by_node.items():
            await self._edit_tags(node, functools.partial(edit, node_changes=node_changes))

    async def mark_reclaiming(self, step: dra.MarkReclaiming) -> None:
        """Set or clear ``reclaiming`` on devices' tags (a device without an owner tag is
        never marked); a GpuNode whose tags say so already is not written."""

        def edit(entries: dict[str, dict[str, Any]], marks: Mapping[GpuUuid, bool]) -> None:
            for uuid, on in marks.items():
                entry = entries.get(uuid)
                if entry is None:
                    continue
                if on and entry.get("owner"):
                    entry[RECLAIMING] = True
                elif not on:
                    entry.pop(RECLAIMING, None)

        for node, marks in step.marks.items():
            await self._edit_tags(node, functools.partial(edit, marks=marks))

    async def _edit_tags(
        self, node: str, edit: Callable[[dict[str, dict[str, Any]]], None]
    ) -> None:
        """Apply ``edit`` to the GpuNode's tags by UUID and write them back (compare-and-swap,
        retried on Conflict), unless nothing changed; a node gone has nothing to tag."""
        path = f"/apis/{contract.API_VERSION}/{contract.PLURAL_GPU_NODE}/{node}"
        for _ in range(5):
            try:
                obj = await self._kube.json("GET", path)
            except NotFound:
                return
            spec = obj.setdefault("spec", {})
            before = [e for e in spec.get("devices") or [] if "uuid" in e]
            entries = {e["uuid"]: dict(e) for e in before}
            edit(entries)
            after = [e for e in entries.values() if len(e) > 1]
            if after == before:
                return
            spec["devices"] = after
            obj.pop("status", None)
            try:
                await self._kube.json("PUT", path, body=obj)
                return
            except Conflict:
                continue
        raise Conflict(f"GpuNode {node}: tags kept conflicting")

    async def write_status(
        self, lease: GpuLease, status: LeaseStatus, degraded: Trouble | None = None
    ) -> None:
        path = (
            f"/apis/{contract.API_VERSION}/namespaces/{lease.namespace}/"
            f"{contract.PLURAL_GPU_LEASE}/{lease.name}"
        )
        obj = await self._kube.json("GET", path)
        meta = obj.get("metadata") or {}
        if meta.get("resourceVersion") != lease.resource_version:
            raise Conflict(f"GpuLease {lease.key} changed since it was read")
        previous = (obj.get("status") or {}).get("conditions")
        generation = meta.get("generation")
        written = status.to_json()
        written["conditions"] = lease_conditions(
            status,
            previous,
            generation if isinstance(generation, int) else None,
            time.time(),
            degraded,
        )
        obj["status"] = written
        await self._kube.json("PUT", f"{path}/status", body=obj)

    async def notify(self, pod: Holder, lease: GpuLease, deadline: float) -> None:
        when = microtime(deadline)
        with contextlib.suppress(NotFound):
            await self._kube.json(
                "PATCH",
                f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}",
                body={
                    "metadata": {
                        "uid": pod.pod_uid,
                        "annotations": {contract.ANN_RECLAIM_NOTICE: when},
                    }
                },
                content_type="application/merge-patch+json",
            )
            await post_event(
                self._kube,
                Involved("Pod", pod.namespace, pod.name, pod.pod_uid),
                "ReclaimNotice",
                f"GPUs lent by {lease.spec.owner} are taken back; this pod is evicted at "
                f"{when}: checkpoint now",
                warning=True,
                component="tidelease-leasing",
            )

    async def evict(self, pod: Holder, lease: GpuLease) -> None:
        """Through the Eviction API, so that the pod's end is an eviction to whoever watches it
        (and counts against its PodDisruptionBudget). A budget that refuses does not hold back a
        reclaim, or right of return would depend on a borrower's budget: the notice was the
        borrower's time to go. The pod is then deleted, and a Warning Event says why. A 429 that
        names no budget (the API server's rate limits) is retried, never taken for a refusal
        (``EVICTION_TRIES``).

        First the pod gets the condition ``DisruptionTarget`` (reason ``TideleaseReclaim``), as
        Kubernetes marks the pods it disrupts: a Job's ``podFailurePolicy`` can then tell a
        reclaim from a failure (docs/leasing.md, "Borrowers that restart")."""
        path = f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}"
        await self._mark_disrupted(pod, lease)
        # The notice was the time to checkpoint; now stop promptly.
        options = {"preconditions": {"uid": pod.pod_uid}, "gracePeriodSeconds": EVICTION_GRACE_S}
        eviction = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": pod.name, "namespace": pod.namespace},
            "deleteOptions": options,
        }
        with contextlib.suppress(NotFound, Conflict):
            try:
                await self._post_eviction(f"{path}/eviction", eviction, pod)
                # The Eviction API writes its own reason over ours (EvictionByEvictionAPI):
                # name the reclaim again while the pod terminates.
                await self._mark_disrupted(pod, lease)
                return
            except TooManyRequests as e:
                if not e.disruption_budget:
                    raise  # still throttled: the step is taken again later
                log.warning("borrower %s: its disruption budget refuses (%s): deleted", pod.key, e)
                await post_event(
                    self._kube,
                    Involved("Pod", pod.namespace, pod.name, pod.pod_uid),
                    "EvictedPastDisruptionBudget",
                    "the GPUs it borrowed are taken back and its notice is over; its "
                    "PodDisruptionBudget refused the eviction, so the pod is deleted",
                    warning=True,
                    component="tidelease-leasing",
                )
            await self._kube.json("DELETE", path, body=options)

    async def _post_eviction(self, path: str, eviction: dict[str, Any], pod: Holder) -> None:
        """POST the eviction; a throttled one (429 naming no disruption budget) again after a
        wait, up to EVICTION_TRIES in all; the last 429 raised."""
        delay = 1.0
        for attempt in range(1, EVICTION_TRIES + 1):
            try:
                await self._kube.json("POST", path, body=eviction)
                return
            except TooManyRequests as e:
                if e.disruption_budget or attempt == EVICTION_TRIES:
                    raise
                wait = min(EVICTION_BACKOFF_MAX_S, e.retry_after_s or delay)
                log.info(
                    "borrower %s: eviction throttled by the API server (%s): again in %.1f s",
                    pod.key,
                    e,
                    wait,
                )
                await self._sleep(wait)
                delay = min(EVICTION_BACKOFF_MAX_S, delay * 2)

    async def _mark_disrupted(self, pod: Holder, lease: GpuLease) -> None:
        with contextlib.suppress(NotFound, Conflict):
            await self._kube.json(
                "PATCH",
                f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}/status",
                body=disruption_target(pod, lease, time.time()),
                content_type="application/strategic-merge-patch+json",
            )

    async def pin(self, step: dra.Pin, lease: GpuLease) -> None:
        """Write the pinned allocation of the pod's claim (after kube-scheduler's finalizer and
        the group it takes back, :func:`dra.pin_patch`; each write on the resourceVersion it
        read: a claim changed meanwhile is a Conflict),
        then lift the pod's gate. A step cut short is taken again: the finalizer is not added
        twice, and an allocated claim only has its pod let go (:func:`dra.next_claim_step`)."""
        claim, meta = step.claim, step.claim.get("metadata") or {}
        path = (
            f"/apis/{DRA_API_VERSION}/namespaces/{meta.get('namespace')}/resourceclaims/"
            f"{meta.get('name')}"
        )
        version = meta.get("resourceVersion")
        patch = dra.pin_patch(claim, step.group)
        try:
            if patch is not None:
                written = await self._kube.json(
                    "PATCH", path, body=patch, content_type="application/merge-patch+json"
                )
                version = (written.get("metadata") or {}).get("resourceVersion")
            await self._kube.json(
                "PATCH",
                f"{path}/status",
                body={"metadata": {"resourceVersion": version}, "status": step.status},
                content_type="application/merge-patch+json",
            )
        except InvalidInput as e:
            raise dra.PinRefused(f"claim {meta.get('name')}: {e}") from e
        devices = ", ".join(d.uuid for d in step.devices)
        what = (
            f"standby devices ({devices}) in place of those its replica {step.group} lent, "
            "which cannot come back whole,"
            if step.standby
            else f"the devices its replica {step.group} lent ({devices}),"
        )
        await post_event(
            self._kube,
            Involved("Pod", step.pod.namespace, step.pod.name, step.pod.uid),
            "ReclaimPinned",
            f"its claim {meta.get('name')} is allocated {what} as GpuLease {lease.key} "
            "takes them back",
            warning=False,
            component="tidelease-leasing",
        )
        await self._ungate(step.pod)

    async def ungate(self, step: dra.Ungate, lease: GpuLease) -> None:
        if step.warning:
            await post_event(
                self._kube,
                Involved("Pod", step.pod.namespace, step.pod.name, step.pod.uid),
                "ReclaimNotPinned",
                f"GpuLease {lease.key} lets it go without its lent devices: {step.why}",
                warning=True,
                component="tidelease-leasing",
            )
        await self._ungate(step.pod)

    async def _ungate(self, pod: dra.GatedPod) -> None:
        """Lift the reclaim gate (a pod deleted or replaced meanwhile is left alone: the UID is
        a precondition)."""
        path = f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}"
        with contextlib.suppress(NotFound, Conflict):
            current = await self._kube.json("GET", path)
            patch = dra.ungated(current)
            if patch is None:
                return
            patch["metadata"] = {
                "uid": pod.uid,
                "resourceVersion": (current.get("metadata") or {}).get("resourceVersion"),
            }
            await self._kube.json(
                "PATCH", path, body=patch, content_type="application/merge-patch+json"
            )


def disruption_target(pod: Holder, lease: GpuLease, now: float) -> dict[str, Any]:
    """A strategic merge patch of the pod's status: the condition Kubernetes' own disruptions
    set (conditions merge by type), naming the reclaim. The UID makes it a precondition."""
    return {
        "metadata": {"uid": pod.pod_uid},
        "status": {
            "conditions": [
                {
                    "type": "DisruptionTarget",
                    "status": "True",
                    "reason": DISRUPTION_REASON,
                    "message": f"tidelease: the GPUs it borrowed are taken back by "
                    f"{lease.spec.owner} (GpuLease {lease.key}); its notice is over",
                    "lastTransitionTime": rfc3339(now),
                }
            ]
        },
    }


@dataclass
class LeasingMetrics:
    """What lending does (loans, reclaims, evictions). How the controller's loop fares (queue,
    reconcile time, errors, retries) is :class:`common.reconcile.ControllerMetrics`'s, on the
    same ``registry`` under ``controller="leasing"``."""

    registry: CollectorRegistry
    lent: Gauge = field(init=False)
    view_active: Gauge = field(init=False)
    reclaims: Counter = field(init=False)
    latency: Histogram = field(init=False)
    backfills: Counter = field(init=False)
    evictions: Counter = field(init=False)
    standby: Gauge = field(init=False)
    standby_target: Gauge = field(init=False)
    # (lease, seconds past its notice deadline) of each reclaim under way past it; read at
    # every scrape (the controller points it at its lease cache).
    overdue: Callable[[], Iterable[tuple[str, float]]] = field(init=False)

    def __post_init__(self) -> None:
        r = self.registry
        self.overdue = lambda: ()
        r.register(_OverdueCollector(self))
        self.lent = Gauge(
            "tidelease_leasing_lent_gpus", "GPUs lent, by lease.", ["lease"], registry=r
        )
        self.view_active = Gauge(
            "tidelease_leasing_view_active",
            "1 while the controller watches the cluster (pods, GpuNodes, ledgers, agents' "
            "Leases): while a GpuLease exists or standby targets are set; else 0.",
            registry=r,
        )
        self.reclaims = Counter(
            "tidelease_leasing_reclaims", "Completed reclaims.", ["lease"], registry=r
        )
        self.latency = Histogram(
            "tidelease_leasing_reclaim_duration_seconds",
            "From the reclaim decision to the owner's pods placed and tags cleared.",
            buckets=(5, 15, 30, 45, 60, 75, 90, 120, 180, 300, 600),
            registry=r,
        )
        self.backfills = Counter(
            "tidelease_leasing_backfilled_gpus",
            "Standby GPUs given instead of lent ones.",
            registry=r,
        )
        self.evictions = Counter(
            "tidelease_leasing_evictions", "Borrower pods evicted after their notice.", registry=r
        )
        self.standby = Gauge(
            "tidelease_leasing_standby_gpus",
            "Healthy GPUs in the standby pool (free or on loan), by type and tier, as of the "
            "last top-up.",
            ["gpu_type", "tier"],
            registry=r,
        )
        self.standby_target = Gauge(
            "tidelease_leasing_standby_target_gpus",
            "The standby pool's target, by type and tier (the extender's standby setting).",
            ["gpu_type", "tier"],
            registry=r,
        )


class _OverdueCollector(Collector):
    def __init__(self, metrics: LeasingMetrics) -> None:
        self._metrics = metrics

    def describe(self) -> Iterable[Metric]:
        return [self._family()]

    def collect(self) -> Iterable[Metric]:
        family = self._family()
        for lease, late in self._metrics.overdue():
            family.add_metric([lease], late)
        return [family]

    @staticmethod
    def _family() -> GaugeMetricFamily:
        return GaugeMetricFamily(
            "tidelease_leasing_reclaim_overdue_seconds",
            "Seconds past the borrowers' notice of each reclaim still under way (only leases "
            "whose reclaim is past it).",
            labels=["lease"],
        )


def observe(
    cluster: ClusterState,
    pods: PodCache,
    lease: GpuLease,
    holdings: Sequence[dra.ClaimHolding] = (),
    granted: Collection[str] = (),
) -> tuple[list[OwnerPod], View]:
    """The owner's pods and the device view, from the extender's watched state; in DRA mode
    also from the ResourceClaims (``holdings``, :func:`dra.claim_holdings`): a device a claim
    holds is held by the first known pod the claim is reserved for, high priority only in
    ``granted`` namespaces."""
    devices = {}
    holders: dict[GpuUuid, Holder] = {}
    offering: dict[str, bool] = {}
    where: dict[str, tuple[str, tuple[GpuUuid, ...]]] = {}
    for state in cluster:
        offering[state.node] = state.offering
        for d in state.devices:
            devices[d.uuid] = d
        for a in state.allocations.values():
            where[a.holder.pod_uid] = (state.node, a.devices)
            for u in a.devices:
                holders[u] = a.holder
    if holdings:
        for pod_uid, held in dra.pod_devices(holdings).items():
            where.setdefault(pod_uid, held)
        by_uid: dict[PodUid, Holder] = {}
        for reserved in {p for h in holdings if h.devices for p in h.pods}:
            raw = pods.get(reserved.namespace, reserved.name)
            holder = _holder(raw, granted) if raw is not None else None
            if holder is not None and holder.pod_uid == reserved.uid:
                by_uid[reserved.uid] = holder
        for uuid, holder in dra.device_holders(holdings, by_uid).items():
            holders.setdefault(uuid, holder)
    owner_pods = []
    for raw in pods.raw_pods():
        meta = raw.get("metadata") or {}
        if meta.get("deletionTimestamp") or not is_replica(raw, lease):
            continue
        uid = str(meta.get("uid", ""))
        bound = str((raw.get("spec") or {}).get("nodeName") or "")
        node, devs = where.get(uid, ("", ()))
        owner_pods.append(OwnerPod(str(meta.get("name")), uid, bound and node, devs))
    return owner_pods, View(devices, holders, offering, _eviction_cost(cluster, pods))


# The Degraded reason of a lease whose namespace an admin has not granted online jobs.
NOT_GRANTED = "NotGranted"


def is_replica(pod: Mapping[str, Any], lease: GpuLease) -> bool:
    """Whether a raw pod is one of the lease's replicas: its owner is the lease's job (a job
    of the pod's own namespace) and the lease's workload controls it (common.tenancy)."""
    if pod_owner(pod) != lease.spec.owner:
        return False
    workload = lease.spec.workload
    return belongs(controller_of(pod.get("metadata") or {}), workload.kind, workload.name)


def _allocated(claim: Mapping[str, Any] | None) -> bool:
    """Whether the view shows ``claim`` allocated (or gone: nothing left to wait for)."""
    return claim is None or (claim.get("status") or {}).get("allocation") is not None


def _keyed(claims: Iterable[Mapping[str, Any]]) -> Iterable[tuple[str, str, Mapping[str, Any]]]:
    for c in claims:
        meta = c.get("metadata") or {}
        yield str(meta.get("namespace", "")), str(meta.get("name", "")), c


def _holder(raw: Mapping[str, Any], granted: Collection[str]) -> Holder | None:
    """A pod as the holder of its claims' devices: its annotations' priority and owner, but
    high priority only in a namespace granted online jobs (``granted``: nothing a pod writes
    makes it no victim); a pod whose annotations do not parse is a low-priority pod of no job
    (evicted, if it borrowed, as every borrower is)."""
    try:
        holder = parse_pod(raw).holder()
        if holder.priority is Priority.HIGH and holder.namespace not in granted:
            holder = replace(holder, priority=Priority.LOW)
        return holder
    except InvalidInput:
        meta = raw.get("metadata") or {}
        uid, name = meta.get("uid"), meta.get("name")
        if not (isinstance(uid, str) and uid and isinstance(name, str) and name):
            return None
        return Holder(PodUid(uid), str(meta.get("namespace", "")), name, Priority.LOW, 0)


def _eviction_cost(
    cluster: ClusterState, pods: PodCache
) -> Callable[[Sequence[Holder]], tuple[int, int, float]]:
    """Cornucopia's cost of evicting borrowers, over the jobs of the watched pods (built on
    first use: most steps evict nobody)."""
    allocations = [a for state in cluster for a in state.allocations.values()]
    known: list[tuple[dict[JobKey, JobView], dict[PodUid, int]]] = []

    def cost(victims: Sequence[Holder]) -> tuple[int, int, float]:
        if not known:
            jobs = job_views(pods.raw_pods(), held_by_job(allocations), now=time.time())
            known.append((jobs, {a.holder.pod_uid: len(a.devices) for a in allocations}))
        jobs, gpus = known[0]
        return eviction_cost(victims, gpus, jobs)

    return cost


class LeaseController:
    """Steps every GpuLease (and tops up the standby pool) on its :class:`ReconcileLoop`.

    The loop is built here and :attr:`leases` is wired to it, so whoever feeds the cache (the
    GpuLease watch) queues the leases its events touch, and tells :attr:`view` whether it is
    wanted (:meth:`wants_view`); :meth:`run` runs the loop while this replica leads. A step
    waits for the view to have synced: a lease's first step after the view started waits for
    the view's first list.
    """

    def __init__(
        self,
        *,
        view: ClusterView,
        leases: LeaseCache,
        world: World,
        metrics: LeasingMetrics,
        clock: Callable[[], float] = time.time,
        standby_targets: Mapping[TypeTier, int] | None = None,
        standby_interval_s: float = 60.0,
        test_grace_s: int | None = None,
        overdue_after_s: float = RECLAIM_OVERDUE_S,
        dra_mode: bool = False,
    ) -> None:
        self.view, self.leases = view, leases
        # DRA mode (docs/dra.md): devices held through ResourceClaims, owners' gated pods
        # pinned to their lent devices (the view must watch DRA_VIEW_KINDS).
        self.dra_mode = dra_mode
        # Claims pinned by this process that the view has not shown allocated yet, with their
        # devices: no other pod is pinned to those meanwhile.
        self._pins: dict[tuple[str, str], tuple[GpuUuid, ...]] = {}
        self.world, self.metrics, self.clock = world, metrics, clock
        self.standby_targets = dict(standby_targets or {})
        self.standby_interval_s = standby_interval_s
        # extender.scheduler.settings' leasing_test_grace_s: every lease's notice, for test clusters
        self.test_grace_s = test_grace_s
        self.overdue_after_s = overdue_after_s
        self._next_topup = 0.0  # on self.clock: when the standby pool is next topped up
        # The loop keeps its own monotonic clock: lease times (Wait.until) are wall time and
        # reach it only as "seconds from now".
        self.loop = ReconcileLoop(
            "leasing",
            self.reconcile,
            keys=self.keys,
            settings=ReconcileSettings(
                resync_s=RESYNC_S, retry_base_s=RETRY_BASE_S, retry_cap_s=RESYNC_S
            ),
            registry=metrics.registry,
        )
        leases.on_change = self._lease_changed
        if dra_mode:
            view.on_pod = self._pod_changed
        metrics.view_active.set_function(lambda: float(view.active))
        metrics.overdue = self._overdue
        for (gpu_type, tier), count in self.standby_targets.items():
            metrics.standby_target.labels(gpu_type, tier.name).set(count)
        self._want_view()

    def wants_view(self) -> tuple[bool, str]:
        """Whether the controller needs its view, and why: only to step a GpuLease or to keep
        the standby pool at its targets. With neither it has nothing to read."""
        if self.standby_targets:
            return True, "standby pool targets are set"
        first = next(iter(self.leases.raw), None)
        if first is not None:
            return True, f"GpuLease {first} exists"
        return False, "no GpuLease and no standby targets"

    def _overdue(self) -> list[tuple[str, float]]:
        now, out = self.clock(), []
        for key, raw in list(self.leases.raw.items()):
            status = raw.get("status") or {}
            deadline = epoch((status.get("reclaim") or {}).get("deadline"))
            if status.get("phase") == "Reclaiming" and deadline is not None and now > deadline:
                out.append((key, now - deadline))
        return out

    def _want_view(self) -> None:
        self.view.want(*self.wants_view())

    def _lease_changed(self, key: str) -> None:
        self._want_view()
        self.loop.add(key)

    def _pod_changed(self, pod: dict[str, Any]) -> None:
        """A gated pod (or its claim's name) appeared: step its owner's leases now, not at
        their next resync."""
        meta = pod.get("metadata") or {}
        owner = (meta.get("annotations") or {}).get(contract.ANN_OWNER)
        if not owner or dra.gated_pod(pod) is None:
            return
        prefix = f"{meta.get('namespace')}/"  # the owner is a job of the pod's namespace
        for key, raw in self.leases.raw.items():
            if key.startswith(prefix) and (raw.get("spec") or {}).get("owner") == owner:
                self.loop.add(key)

    async def step(self, lease: GpuLease) -> Action | dra.ClaimStep | dra.MarkReclaiming:
        """Decide and execute one action for one lease. In DRA mode first, if there is one to
        write, the ``reclaiming`` marks of the devices its reclaim takes back (so that no
        borrower's claim is allocated them again), then the next pin or gate lift of its gated
        pods (:meth:`_claim_step`)."""
        if self.test_grace_s is not None:
            lease = replace(lease, spec=replace(lease.spec, grace_s=self.test_grace_s))
        holdings = self._holdings()
        owner_pods, view = observe(
            self.view.cluster, self.view.pods, lease, holdings, self.leases.granted
        )
        if self.dra_mode:
            marked = {
                (state.node, d.uuid): d.cls.owner
                for state in self.view.cluster
                if state.reclaiming
                for d in state.devices
                if d.uuid in state.reclaiming
            }
            # The other leases matter only to marks that might be cleared: none, none to parse.
            others = self._other_leases(lease) if marked else []
            marks = dra.reclaiming_marks(lease, view.devices, marked, others)
            if marks is not None:
                log.info("lease %s: %s", lease.key, marks.why)
                await self.world.mark_reclaiming(marks)
                return marks
            claim_step = await self._claim_step(lease, owner_pods, view, holdings)
            if claim_step is not None:
                return claim_step
        upgraded = legacy_tags(lease, owner_pods, view)
        if upgraded:
            why = f"tag {len(upgraded)} device(s) with the namespaced owner {lease.spec.owner}"
            log.info("lease %s: %s", lease.key, why)
            await self.world.set_tags(upgraded)
            return SetTags(upgraded, why)
        replicas = await self.world.replicas(lease.namespace, lease.spec.workload)
        now = self.clock()
        action = decide(lease, replicas, owner_pods, view, now)
        name = lease.key

        def trouble_of(status: LeaseStatus) -> Trouble | None:
            """Degraded or not, as the status about to be stored says (a reclaim just done is
            not overdue, whatever the one it ends was)."""
            return overdue(replace(lease, status=status), owner_pods, now, self.overdue_after_s)

        trouble = trouble_of(lease.status)
        if isinstance(action, WriteStatus):
            log.info("lease %s: %s", name, action.why)
            await self.world.write_status(lease, action.status, trouble_of(action.status))
            self.metrics.lent.labels(name).set(len(action.status.lent))
            if action.status.phase == "Steady" and lease.status.phase == "Reclaiming":
                self.metrics.reclaims.labels(name).inc()
                self.metrics.latency.observe(action.status.last_reclaim_s or 0.0)
                self.metrics.backfills.inc(action.status.backfilled - lease.status.backfilled)
        elif isinstance(action, SetTags):
            log.info("lease %s: %s", name, action.why)
            await self.world.set_tags(action.changes)
        elif isinstance(action, ScaleTo):
            log.info(
                "lease %s: scale %s to %d replicas", name, lease.spec.workload.name, action.replicas
            )
            await self.world.scale(lease.namespace, lease.spec.workload, action.replicas)
        elif isinstance(action, Notify):
            for pod in action.pods:
                log.info(
                    "lease %s: notice to borrower %s: evicted at %s",
                    name,
                    pod.key,
                    microtime(action.deadline),
                )
                await self.world.notify(pod, lease, action.deadline)
            await self.world.write_status(lease, action.then, trouble_of(action.then))
        elif isinstance(action, Evict):
            for pod in action.pods:
                log.info("lease %s: evicting borrower %s", name, pod.key)
                await self.world.evict(pod, lease)
                self.metrics.evictions.inc()
        elif (trouble.reason if trouble else None) != lease.degraded:
            # Waiting, and the lease's Degraded condition is not what it is: say so.
            if trouble is not None:
                log.warning("lease %s: degraded: %s", name, trouble.message)
            else:
                log.info("lease %s: no longer degraded", name)
            await self.world.write_status(lease, lease.status, trouble)
        return action

    def _other_leases(self, lease: GpuLease) -> list[GpuLease]:
        """Every GpuLease but ``lease`` that parses (an invalid one is logged at its own step)."""
        out = []
        for key, raw in list(self.leases.raw.items()):
            if key != lease.key:
                with contextlib.suppress(InvalidInput):
                    out.append(parse_gpu_lease(raw))
        return out

    def _holdings(self) -> tuple[dra.ClaimHolding, ...]:
        """DRA mode: who holds which device through the claims the view shows; none otherwise."""
        if not self.dra_mode:
            return ()
        every = (d for state in self.view.cluster for d in state.devices)
        return dra.claim_holdings(self.view.claims.raw_claims(), every)

    async def _claim_step(
        self,
        lease: GpuLease,
        owner_pods: Sequence[OwnerPod],
        view: View,
        holdings: Sequence[dra.ClaimHolding],
    ) -> dra.ClaimStep | None:
        """Pin the claim of an owner's gated pod to its lent group, or let the pod go
        (:func:`dra.next_claim_step`), and say which; None when no gated pod can go yet."""
        claims = self.view.claims
        for key in [k for k in self._pins if _allocated(claims.get(*k))]:
            del self._pins[key]  # the view shows it now
        gated, live = [], set()
        for raw in self.view.pods.raw_pods():
            meta = raw.get("metadata") or {}
            if not meta.get("deletionTimestamp"):
                live.add(str(meta.get("uid", "")))
            if not is_replica(raw, lease):
                continue
            pod = dra.gated_pod(raw)
            if pod is not None:
                gated.append(pod)
        if not gated:
            return None
        pinned = {u for devices in self._pins.values() for u in devices}
        taken = {u for h in holdings for u in h.devices} | pinned
        owned = {u for p in owner_pods for u in p.devices} | pinned
        by_key = {(c_ns, c_name): c for c_ns, c_name, c in _keyed(claims.raw_claims())}
        step = dra.next_claim_step(
            lease, gated, by_key, view.devices, view.offering, taken, owned, live
        )
        if isinstance(step, dra.Pin):
            meta = step.claim.get("metadata") or {}
            log.info(
                "lease %s: pin claim %s of %s to %s (%s)",
                lease.key,
                meta.get("name"),
                step.pod.key,
                f"standby devices for the group {step.group} lent"
                if step.standby
                else f"the devices {step.group} lent",
                ", ".join(d.uuid for d in step.devices),
            )
            key = (str(meta.get("namespace", "")), str(meta.get("name", "")))
            self._pins[key] = tuple(d.uuid for d in step.devices)
            try:
                await self.world.pin(step, lease)
            except dra.PinRefused as e:
                # Refused (403, 422): retrying cannot help, and the lease must not stop here.
                self._pins.pop(key, None)
                log.error("lease %s: pinning claim %s refused: %s", lease.key, meta.get("name"), e)
                refused = dra.Ungate(step.pod, f"pinning its claim was refused: {e}", warning=True)
                await self.world.ungate(refused, lease)
                return refused
            except BaseException:
                self._pins.pop(key, None)  # not written, or not known to be
                raise
        elif isinstance(step, dra.Ungate):
            (log.warning if step.warning else log.info)(
                "lease %s: let %s go: %s", lease.key, step.pod.key, step.why
            )
            await self.world.ungate(step, lease)
        return step

    def keys(self) -> list[str]:
        """Every lease in the cache, and the standby key when there are targets to keep: what
        the loop reconciles first and at every resync."""
        keys = list(self.leases.raw)
        if self.standby_targets:
            keys.append(STANDBY_KEY)
        return keys

    async def reconcile(self, key: str) -> Result:
        """One step of the lease ``key`` (or the standby top-up for :data:`STANDBY_KEY`); when to
        step it again. Errors go to the loop, which retries this key alone.

        Nothing is stepped on a view that has not synced: the view starts with the first
        lease, whose first step waits for the view's list. Should the lease be deleted
        meanwhile, the last, this waits for the next view with nothing else to do."""
        if key == STANDBY_KEY or key in self.leases.raw:
            await self.view.synced.wait()
        if key == STANDBY_KEY:
            return await self._reconcile_standby()
        raw = self.leases.raw.get(key)
        if raw is None:
            log.info("lease %s: deleted; nothing left to step", key)
            return None
        try:
            lease = parse_gpu_lease(raw)
        except InvalidInput as e:
            # Retrying cannot help: the next event (a fixed spec) or resync looks again.
            log.error("GpuLease %s is invalid and left alone: %s", key, e)
            return None
        if lease.namespace not in self.leases.granted:
            await self._not_granted(lease)
            return None  # stepped again when an admin grants the namespace
        try:
            action = await self.step(lease)
        except TideleaseError:
            raise  # expected (API server down, a write that lost a race): the loop says it
        except Exception as e:
            # The loop logs the traceback under its key ("leasing: ns/name: ..."); this line
            # names the lease as every other line about it does, so that grepping for
            # "lease ns/name" tells its whole story, the bug included.
            log.error("lease %s: unexpected error (retrying): %r", key, e)
            raise
        if isinstance(action, Wait):
            return Requeue(max(MIN_WAIT_S, action.until - self.clock()))
        return Requeue(STEP_AGAIN_S)

    async def _not_granted(self, lease: GpuLease) -> None:
        """A lease in a namespace not granted online jobs does nothing; its Degraded condition
        says why (once). A lease that was lending stays where it stands: its lent devices stay
        lent, and come back once the namespace is granted again."""
        if lease.degraded == NOT_GRANTED:
            return
        why = online_refusal(lease.namespace, "a GpuLease")
        log.warning("lease %s: not stepped: %s", lease.key, why)
        await self.world.write_status(lease, lease.status, Trouble(NOT_GRANTED, why))

    async def _reconcile_standby(self) -> Requeue:
        """Top the standby pool up every ``standby_interval_s`` (the loop's resync comes more
        often and only asks when the next top-up is due). The time advances only after a
        top-up succeeded: a failed one is the loop's to retry."""
        now = self.clock()
        if now < self._next_topup:
            return Requeue(self._next_topup - now)
        await self.top_up_standby()
        self._next_topup = self.clock() + self.standby_interval_s
        return Requeue(self.standby_interval_s)

    async def top_up_standby(self) -> int:
        """Keep the standby pool at its targets (weflex 3.5: released GPUs rejoin the pool
        periodically): free standby devices beyond a target (loans given back) leave the pool
        (:func:`~extender.leasing.rules.standby_excess`), free untagged devices join it where it is
        short (:func:`~extender.leasing.rules.standby_topup`, whole nodes first); the devices
        changed. The simulator's top-up (extender.simulation.controlling) mirrors this."""
        if not self.standby_targets:
            return 0
        pool: dict[TypeTier, int] = {}
        free: list[Device] = []
        free_standby: list[Device] = []
        standby: list[Device] = []
        # Held by a pod (in DRA mode also through a claim, or pinned a moment ago): not free.
        held = {u for h in self._holdings() for u in h.devices}
        held.update(u for devices in self._pins.values() for u in devices)
        for state in self.view.cluster:
            held.update(u for a in state.allocations.values() for u in a.devices)
        for state in self.view.cluster:
            if not state.offering:
                continue
            for d in state.devices:
                if d.cls.standby:
                    standby.append(d)
                if d.cls.standby and d.cls.healthy:
                    key = (d.gpu_type, d.tier)
                    pool[key] = pool.get(key, 0) + 1
                    if d.uuid not in held:
                        free_standby.append(d)
                elif d.uuid not in held:
                    free.append(d)
        extra = standby_excess(free_standby, pool, self.standby_targets)
        if extra:
            log.info("standby pool: giving %d device(s) above its targets back", len(extra))
            await self.world.set_tags(TagChange(d.node, d.uuid, None, False) for d in extra)
        chosen = standby_topup(free, pool, self.standby_targets, standby)
        if chosen:
            log.info("standby pool: adding %d device(s) to reach its targets", len(chosen))
            await self.world.set_tags(TagChange(d.node, d.uuid, None, True) for d in chosen)
        now_pool = {key: 0 for key in self.standby_targets} | pool
        for d, step in [(d, 1) for d in chosen] + [(d, -1) for d in extra]:
            now_pool[(d.gpu_type, d.tier)] = now_pool.get((d.gpu_type, d.tier), 0) + step
        for (gpu_type, tier), count in now_pool.items():
            self.metrics.standby.labels(gpu_type, tier.name).set(count)
        return len(extra) + len(chosen)

    async def run(self, *, ready: asyncio.Event | None = None) -> None:
        """Reconcile until cancelled (one leadership term); ``ready`` is set once every lease
        known at the start was stepped once. A new term tops the standby pool up at once: the
        pool may have drifted while another replica led, or none did."""
        self._next_topup = 0.0
        self._pins.clear()  # another replica may have led since: the claims say what stands
        await self.loop.run(ready=ready)
