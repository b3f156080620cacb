"""What the leasing controller observes of one lease, from its watched view: the owner's
pods (:func:`is_replica`: the lease's job's pods that its workload controls), and the devices,
who holds them and which nodes offer them (a :class:`~extender.leasing.decisions.View`), in
DRA mode through the ResourceClaims too.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import replace
from typing import Any

from common import contract
from common.errors import InvalidInput
from common.model import GpuUuid, Holder, JobKey, PodUid, Priority
from common.podrequest import controller_of, parse_pod
from common.tenancy import belongs, pod_owner
from extender.cluster.state import ClusterState
from extender.cluster.watching import PodCache
from extender.leasing import claimpinning
from extender.leasing.decisions import OwnerPod, View
from extender.queues.allocation import JobView
from extender.queues.jobviews import held_by_job, job_views
from extender.queues.preemptionorder import eviction_cost
from extender.rightofreturn.lease import GpuLease


def observe(
    cluster: ClusterState,
    pods: PodCache,
    lease: GpuLease,
    holdings: Sequence[claimpinning.ClaimHolding] = (),
    granted: Collection[str] = (),
) -> tuple[list[OwnerPod], View]:
    """The owner's pods and the device view, from the extender's watched state; in DRA mode
    also from the ResourceClaims (``holdings``,
    :func:`~extender.leasing.claimpinning.claim_holdings`): a device a claim holds is held by
    the first known pod the claim is reserved for, high priority only in ``granted``
    namespaces."""
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
        for pod_uid, held in claimpinning.pod_devices(holdings).items():
            where.setdefault(pod_uid, held)
        by_uid: dict[PodUid, Holder] = {}
        for reserved in {p for h in holdings if h.devices for p in h.pods}:
            raw = pods.get(reserved.namespace, reserved.name)
            holder = _holder(raw, granted) if raw is not None else None
            if holder is not None and holder.pod_uid == reserved.uid:
                by_uid[reserved.uid] = holder
        for uuid, holder in claimpinning.device_holders(holdings, by_uid).items():
            holders.setdefault(uuid, holder)
    owner_pods = []
    for raw in pods.raw_pods():
        meta = raw.get("metadata") or {}
        if meta.get("deletionTimestamp") or not is_replica(raw, lease):
            continue
        uid = str(meta.get("uid", ""))
        bound = str((raw.get("spec") or {}).get("nodeName") or "")
        node, devs = where.get(uid, ("", ()))
        cost = (meta.get("annotations") or {}).get(contract.ANN_POD_DELETION_COST)
        owner_pods.append(
            OwnerPod(str(meta.get("name")), uid, bound and node, devs, cost and str(cost))
        )
    return owner_pods, View(devices, holders, offering, _eviction_cost(cluster, pods))


def is_replica(pod: Mapping[str, Any], lease: GpuLease) -> bool:
    """Whether a raw pod is one of the lease's replicas: its owner is the lease's job (a job
    of the pod's own namespace) and the lease's workload controls it (common.tenancy)."""
    if pod_owner(pod) != lease.spec.owner:
        return False
    workload = lease.spec.workload
    return belongs(controller_of(pod.get("metadata") or {}), workload.kind, workload.name)


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
    """The cost of evicting borrowers by the shared queues' rule (queue hit, jobs halted,
    throughput lost; cornucopia), over the jobs of the watched pods (built on first use: most
    steps evict nobody)."""
    allocations = [a for state in cluster for a in state.allocations.values()]
    known: list[tuple[dict[JobKey, JobView], dict[PodUid, int]]] = []

    def cost(victims: Sequence[Holder]) -> tuple[int, int, float]:
        if not known:
            jobs = job_views(pods.raw_pods(), held_by_job(allocations), now=time.time())
            known.append((jobs, {a.holder.pod_uid: len(a.devices) for a in allocations}))
        jobs, gpus = known[0]
        return eviction_cost(victims, gpus, jobs)

    return cost
