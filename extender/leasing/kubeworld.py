"""The leasing controller's world on the API server: its writes (the workload's scale, the
devices' tags in the GpuNodes, the lease's status, borrowers' notices and evictions, DRA mode's
claim pins and gate lifts) and its one read the watches do not give it (the workload's replicas).

Each write is idempotent or a compare-and-swap on what it read, so a step cut short is taken
again without harm.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from common import contract
from common.deviceattributes import API_VERSION as DRA_API_VERSION
from common.deviceattributes import ATTR_RECLAIMING as RECLAIMING
from common.errors import Conflict, InvalidInput, NotFound, TooManyRequests
from common.events import Involved, post_event
from common.kubeclient import KubeClient
from common.model import GpuUuid, Holder
from common.objects import DISRUPTION_TARGET, eviction
from common.timefmt import microtime, rfc3339
from extender.leasing import claimpinning
from extender.leasing.decisions import OwnerPod, TagChange
from extender.rightofreturn.lease import GpuLease, LeaseStatus, Trouble, Workload, lease_conditions

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


class KubeWorld:
    """The leasing controller's writes (and its one read the watches do not give it) against the
    API server: :class:`~extender.leasing.controller.World`."""

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

    async def set_deletion_cost(self, namespace: str, pod: OwnerPod, cost: str | None) -> None:
        """The pod's pod-deletion-cost annotation set (or removed, ``None``); a pod gone, or
        replaced under its name (the UID is a precondition), is left alone."""
        with contextlib.suppress(NotFound, Conflict):
            await self._annotate(
                namespace, pod.name, pod.uid, {contract.ANN_POD_DELETION_COST: cost}
            )

    async def _annotate(
        self, namespace: str, name: str, uid: str, annotations: dict[str, str | None]
    ) -> None:
        """Set (None: remove) annotations of the pod with this UID (a precondition)."""
        await self._kube.json(
            "PATCH",
            f"/api/v1/namespaces/{namespace}/pods/{name}",
            body={"metadata": {"uid": uid, "annotations": annotations}},
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

    async def mark_reclaiming(self, step: claimpinning.MarkReclaiming) -> None:
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
            await self._annotate(
                pod.namespace, pod.name, pod.pod_uid, {contract.ANN_RECLAIM_NOTICE: when}
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

        The pod carries the condition ``DisruptionTarget`` with reason ``TideleaseReclaim``, as
        Kubernetes marks the pods it disrupts: a Job's ``podFailurePolicy`` can then tell a
        reclaim from a failure (docs/leasing.md, "Borrowers that restart"). The Eviction API
        writes the condition itself (reason ``EvictionByEvictionAPI``): the reclaim's reason is
        written just after, while the pod terminates, not before (at dawn every write before
        the eviction delays the devices' return). A pod deleted past its budget gets it
        before its deletion (Kubernetes writes no condition then)."""
        path = f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}"
        # The notice was the time to checkpoint; now stop promptly.
        body = eviction(pod.namespace, pod.name, pod.pod_uid, EVICTION_GRACE_S)
        with contextlib.suppress(NotFound, Conflict):
            try:
                await self._post_eviction(f"{path}/eviction", body, pod)
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
            await self._mark_disrupted(pod, lease)
            await self._kube.json("DELETE", path, body=body["deleteOptions"])

    async def _post_eviction(self, path: str, body: dict[str, Any], pod: Holder) -> None:
        """POST the eviction; a throttled one (429 naming no disruption budget) again after a
        wait, up to EVICTION_TRIES in all; the last 429 raised."""
        delay = 1.0
        for attempt in range(1, EVICTION_TRIES + 1):
            try:
                await self._kube.json("POST", path, body=body)
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

    async def pin(self, step: claimpinning.Pin, lease: GpuLease) -> None:
        """Write the pinned allocation of the pod's claim (after kube-scheduler's finalizer and
        the group it takes back, :func:`~extender.leasing.claimpinning.pin_patch`; each write on
        the resourceVersion it read: a claim changed meanwhile is a Conflict), then lift the
        pod's gate. A step cut short is taken again: the finalizer is not added twice, and an
        allocated claim only has its pod let go
        (:func:`~extender.leasing.claimpinning.next_claim_step`)."""
        claim, meta = step.claim, step.claim.get("metadata") or {}
        path = (
            f"/apis/{DRA_API_VERSION}/namespaces/{meta.get('namespace')}/resourceclaims/"
            f"{meta.get('name')}"
        )
        version = meta.get("resourceVersion")
        patch = claimpinning.pin_patch(claim, step.group)
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
            raise claimpinning.PinRefused(f"claim {meta.get('name')}: {e}") from e
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

    async def ungate(self, step: claimpinning.Ungate, lease: GpuLease) -> None:
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

    async def _ungate(self, pod: claimpinning.GatedPod) -> None:
        """Lift the reclaim gate (a pod deleted or replaced meanwhile is left alone: the UID is
        a precondition)."""
        path = f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}"
        with contextlib.suppress(NotFound, Conflict):
            current = await self._kube.json("GET", path)
            patch = claimpinning.ungated(current)
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
                    "type": DISRUPTION_TARGET,
                    "status": "True",
                    "reason": DISRUPTION_REASON,
                    "message": f"tidelease: the GPUs it borrowed are taken back by "
                    f"{lease.spec.owner} (GpuLease {lease.key}); its notice is over",
                    "lastTransitionTime": rfc3339(now),
                }
            ]
        },
    }
