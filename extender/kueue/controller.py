"""tidelease's Kueue admission check controller (issue 37; docs/kueue.md): lent GPUs as capacity
Kueue admits into, and reclaim as a Kueue eviction. Runs in the controllers' process under its
own leader election (``tidelease controllers --kueue-admission-check``; the chart turns it on
with ``kueue.enabled``), beside the leasing controller, whose watched view of the cluster
(pods, GpuNodes, ledgers) it reads: what is lent is what that view says is free and tagged.

Lent GPUs of an online job whose GpuLease is reclaiming are no borrower's (the extender keeps
borrowers off them): they do not count, so a workload Kueue requeues at dawn waits for the next
lend rather than being let through onto GPUs on their way home.

It watches Kueue's AdmissionChecks (those whose ``spec.controllerName`` is
:data:`CONTROLLER_NAME` are its own: it marks each ``Active``, without which Kueue holds back
their ClusterQueues) and Workloads, and reconciles them all as one key
(:mod:`extender.kueue.admission` decides; lent capacity is shared), on every Workload or
AdmissionCheck change, every :data:`RESYNC_S` (pods and ledgers change in the view) and at the
next reclaim notice's time. Each decision is written as the check's own entry of the
Workload's ``status.admissionChecks``, by server-side apply with field manager
:data:`FIELD_MANAGER` (Kueue's own fields of that entry and the other checks' entries are left
as they are); a ``Ready`` one asks Kueue to add ``tidelease.io/lent-only: "true"`` to the pods
(``podSetUpdates``), so the extender places them on lent GPUs only, where they were counted.
A Workload whose pod template tidelease cannot read is ``Rejected`` with the problems.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from common import contract
from common.errors import InvalidInput, NotFound, Unavailable
from common.keptmarks import NO_MARK, KeptMark, encode
from common.kubeclient import KubeClient
from common.model import Device, JobKey, NodeName
from common.reconcile import ReconcileLoop, ReconcileSettings, Requeue, Result, run_checked
from common.timefmt import epoch, rfc3339
from common.watches import Watches, object_key
from extender.cluster.watching import DemandView
from extender.kueue.admission import Decision, PodsOf, decide
from extender.kueue.capacity import Reservation, kept_devices, lent_capacity
from extender.kueue.workloads import API_VERSION, PLURAL, Workload, parse_workload

log = logging.getLogger(__name__)

LEASE_NAME = "tidelease-kueue-admission-check"
CONTROLLER_NAME = contract.KUEUE_CONTROLLER_NAME  # an AdmissionCheck's spec.controllerName
FIELD_MANAGER = "tidelease-kueue-admission-check"
PODSET_LABEL = "kueue.x-k8s.io/podset"  # Kueue's label of a pod's pod set
RESYNC_S = 2.0
API_POLL_S = 10.0
KEY = "all"
KEEP_FOR_S = 60.0  # a kept mark lapses this long after it was written, unless renewed
# What this controller wrote (a kept mark, a check's Ready) counts as written for this long
# while the watch has not brought it back: a pass in between must not judge the stale copy.
ECHO_S = 5.0
_GPU_NODES = f"/apis/{contract.API_VERSION}/{contract.PLURAL_GPU_NODE}"
DEFAULT_CHECKS = (contract.KUEUE_CHECK,)  # the AdmissionChecks it decides for, by name


@dataclass
class KueueMetrics:
    registry: CollectorRegistry
    decisions: Counter = field(init=False)
    kept: Gauge = field(init=False)
    lent: Gauge = field(init=False)

    def __post_init__(self) -> None:
        self.decisions = Counter(
            "tidelease_kueue_check_decisions",
            "States tidelease's Kueue admission check wrote on Workloads, by state.",
            ["state"],
            registry=self.registry,
        )
        self.kept = Gauge(
            "tidelease_kueue_lent_gpus_kept",
            "Lent GPUs kept for Kueue workloads let through and not placed yet.",
            registry=self.registry,
        )
        self.lent = Gauge(
            "tidelease_kueue_lent_gpus_free",
            "Lent GPUs free now, before what is kept for Kueue workloads.",
            registry=self.registry,
        )


def pods_by_owner(pods: list[dict[str, Any]]) -> dict[str, PodsOf]:
    """What the GPU pods of each controlling owner (``namespace/UID``: a pod of another
    namespace naming the UID is not its) are doing: how many are placed and running per Kueue
    pod set (unlabelled ones count for the set named ``main``), and the earliest reclaim notice
    among them."""
    placed: dict[str, dict[str, int]] = {}
    notices: dict[str, float] = {}
    for pod in pods:
        meta, spec, status = (pod.get(k) or {} for k in ("metadata", "spec", "status"))
        owner = next(
            (
                str(r.get("uid") or "")
                for r in meta.get("ownerReferences") or []
                if isinstance(r, dict) and r.get("controller") is True
            ),
            "",
        )
        if not owner or meta.get("deletionTimestamp"):
            continue
        owner = f"{meta.get('namespace') or 'default'}/{owner}"
        if status.get("phase") in ("Succeeded", "Failed"):
            continue
        annotations = meta.get("annotations") or {}
        notice = epoch(annotations.get(contract.ANN_RECLAIM_NOTICE))
        if notice is not None:
            notices[owner] = min(notice, notices.get(owner, notice))
        if spec.get("nodeName"):
            pod_set = str((meta.get("labels") or {}).get(PODSET_LABEL) or "main")
            counts = placed.setdefault(owner, {})
            counts[pod_set] = counts.get(pod_set, 0) + 1
    return {
        owner: PodsOf(placed=placed.get(owner, {}), notice_at=notices.get(owner))
        for owner in placed.keys() | notices.keys()
    }


def check_entry(decision: Decision, now: float) -> dict[str, Any]:
    """The check's own entry of ``status.admissionChecks``, as applied."""
    entry: dict[str, Any] = {
        "name": decision.check,
        "state": decision.state,
        "message": decision.message[:32768],
        "lastTransitionTime": rfc3339(now),
    }
    if decision.state == "Ready":
        updates = [
            {"name": need.name, "annotations": {contract.ANN_LENT_ONLY: "true"}}
            for need in decision.workload.needs
            # Kueue refuses an update of a key the template already has.
            if need.name not in decision.workload.lent_only_set
        ]
        if updates:
            entry["podSetUpdates"] = updates[:8]
    return entry


class KueueCheck:
    """The watched AdmissionChecks and Workloads, and one reconcile of them all."""

    def __init__(
        self,
        kube: KubeClient,
        view: DemandView | None,
        metrics: KueueMetrics,
        *,
        resource: str = contract.DEFAULT_GPU_RESOURCE,
        names: Collection[str] = DEFAULT_CHECKS,
        reclaiming: Callable[[], Collection[JobKey]] = frozenset,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._kube, self._view, self._metrics = kube, view, metrics
        self._resource, self._clock, self._reclaiming = resource, clock, reclaiming
        self._names = frozenset(names)
        self.checks: dict[str, dict[str, Any]] = {}  # AdmissionCheck name -> object
        # Workloads parsed once per event (namespace/name -> Workload), and those tidelease
        # cannot read (-> the object and its problems); the problems written, by key.
        self.workloads: dict[str, Workload] = {}
        self._unreadable: dict[str, tuple[dict[str, Any], str]] = {}
        self._rejected: dict[str, str] = {}
        self._lost_since: Mapping[str, float] = {}
        self._written: dict[NodeName, tuple[KeptMark, float]] = {}  # mark, when written
        # Workloads whose check this controller set Ready: key -> (UID, check, when written)
        self._ready: dict[str, tuple[str, str, float]] = {}

    def on_check(self, event: str, obj: dict[str, Any]) -> None:
        name = str((obj.get("metadata") or {}).get("name") or "")
        if event == "DELETED":
            self.checks.pop(name, None)
        else:
            self.checks[name] = obj

    def on_workload(self, event: str, obj: dict[str, Any]) -> None:
        key = object_key(obj)
        self.workloads.pop(key, None)
        self._unreadable.pop(key, None)
        if event == "DELETED":
            self._rejected.pop(key, None)
            self._ready.pop(key, None)
            return
        try:
            self.workloads[key] = parse_workload(obj, resource=self._resource)
        except InvalidInput as e:
            self._unreadable[key] = (obj, "; ".join(e.problems))

    def named_ours(self) -> frozenset[str]:
        """The AdmissionChecks that name this controller (``spec.controllerName``)."""
        return frozenset(
            name
            for name, ac in self.checks.items()
            if (ac.get("spec") or {}).get("controllerName") == CONTROLLER_NAME
        )

    def ours(self) -> frozenset[str]:
        """The AdmissionChecks this controller decides for: those naming it, of the names it
        was given (the only entries of a Workload's status the chart's policy lets it write)."""
        return self.named_ours() & self._names

    async def reconcile(self, _key: str) -> Result:
        view = self._view
        if view is not None and view.active and not view.synced.is_set():
            return Requeue(0.5)  # the view's first list: what is lent is not known yet
        now = self._clock()
        ours = self.ours()
        for name in sorted(self.named_ours()):
            await self._activate(name, now, name in ours)
        for key, (obj, problems) in sorted(self._unreadable.items()):
            await self._reject(key, obj, ours, problems, now)
        free = (
            {node: st.free for node, st in view.cluster.nodes.items()}
            if view is not None and view.active
            else {}
        )
        capacity = lent_capacity(free, self._reclaiming())
        pods = pods_by_owner(view.pods.raw_pods()) if view is not None and view.active else {}
        decisions = decide(
            self._as_written(now), ours, capacity, pods, now=now, lost_since=self._lost_since
        )
        self._lost_since = decisions.lost_since
        self._metrics.lent.set(sum(sum(c.values()) for c in capacity.values()))
        self._metrics.kept.set(sum(r.gpus for r in decisions.reservations))
        if view is not None and view.active:
            await self._keep(decisions.reservations, view, now)
        for d in decisions.writes:
            await self._write(d.workload, check_entry(d, now))
            if d.state == "Ready":
                self._ready[d.workload.key] = (d.workload.uid, d.check, now)
            else:
                self._ready.pop(d.workload.key, None)
            self._metrics.decisions.labels(d.state).inc()
            log.info(
                "kueue: workload %s: check %s %s: %s",
                d.workload.key,
                d.check,
                d.state,
                d.message,
                extra={"object": d.workload.key},
            )
        if decisions.next_at is not None:
            return Requeue(max(0.0, decisions.next_at - now) + 0.1)
        return None

    def _as_written(self, now: float) -> list[Workload]:
        """The watched workloads, those whose check this controller set Ready in the last
        :data:`ECHO_S` seconds read as Ready until the watch shows it: judged from the stale
        copy (its check still Pending), such a workload would count as waiting, not holding,
        and the GPUs it was let through on could be let to another workload as well."""
        out = []
        for key, w in self.workloads.items():
            written = self._ready.get(key)
            if written is not None:
                uid, check, at = written
                if w.uid != uid or w.checks.get(check) == "Ready" or now - at > ECHO_S:
                    del self._ready[key]
                else:
                    w = replace(w, checks={**w.checks, check: "Ready"})
            out.append(w)
        return out

    async def _keep(
        self, reservations: Collection[Reservation], view: DemandView, now: float
    ) -> None:
        """Mark on each GpuNode the lent devices kept for the workloads let through and not
        placed yet (common/keptmarks.py), so that the extender gives them to no other
        borrower; renewed before they lapse, removed once nothing is kept there."""
        owners = {key: w.kept_key for key, w in self.workloads.items()}
        pairs = [(o, r) for r in reservations if (o := owners.get(r.workload)) is not None]
        nodes = view.cluster.nodes
        current: dict[NodeName, KeptMark] = {}
        for node, state in nodes.items():
            written = self._written.get(node)
            # What was written a moment ago, until the watch brings it back.
            mark = written[0] if written is not None and now - written[1] < ECHO_S else state.kept
            if mark.devices:
                current[node] = mark
        free: dict[NodeName, list[Device]] = {}
        for r in reservations:
            for node in {p.node for p in r.pods if p.gpus}:
                at = nodes.get(node)
                if at is not None and node not in free:
                    held = {u for a in at.allocations.values() for u in a.devices}
                    free[node] = [d for d in at.devices if d.uuid not in held]
        want = kept_devices(pairs, free, {n: m.devices for n, m in current.items()})
        for node in sorted(want.keys() | current.keys()):
            devices = want.get(node, {})
            mark = current.get(node, NO_MARK)
            if devices == dict(mark.devices) and (not devices or mark.until - now > KEEP_FOR_S / 2):
                continue
            new = KeptMark(devices, now + KEEP_FOR_S) if devices else NO_MARK
            value = encode(new.devices, new.until) if devices else None
            try:
                await self._kube.json(
                    "PATCH",
                    f"{_GPU_NODES}/{node}",
                    body={"metadata": {"annotations": {contract.ANN_KEPT_FOR_KUEUE: value}}},
                    content_type="application/merge-patch+json",
                )
            except NotFound:
                continue
            self._written[node] = (new, now)
            if dict(mark.devices) != devices:
                log.info(
                    "kueue: GpuNode %s: %d lent GPU(s) kept for %s",
                    node,
                    len(devices),
                    ", ".join(sorted(set(devices.values()))) or "no workload",
                    extra={"object": node},
                )

    async def _write(self, workload: Workload, entry: dict[str, Any]) -> None:
        body = {
            "apiVersion": API_VERSION,
            "kind": "Workload",
            "metadata": {
                "namespace": workload.namespace,
                "name": workload.name,
                "uid": workload.uid,
            },
            "status": {"admissionChecks": [entry]},
        }
        path = (
            f"/apis/{API_VERSION}/namespaces/{workload.namespace}/{PLURAL}/{workload.name}/status"
        )
        try:
            await self._kube.json(
                "PATCH",
                path,
                body=body,
                query={"fieldManager": FIELD_MANAGER, "force": "true"},
                content_type="application/apply-patch+yaml",
            )
        except NotFound:
            log.debug("kueue: workload %s is gone", workload.key)

    async def _reject(
        self, key: str, obj: dict[str, Any], ours: frozenset[str], problems: str, now: float
    ) -> None:
        """A workload whose pods tidelease cannot read: Rejected (Kueue deactivates it), once."""
        if self._rejected.get(key) == problems:
            return
        self._rejected[key] = problems
        meta = obj.get("metadata") or {}
        status = obj.get("status") or {}
        for entry in status.get("admissionChecks") or []:
            if isinstance(entry, dict) and entry.get("name") in ours:
                if entry.get("state") != "Pending":
                    return
                namespace, name = key.split("/", 1)
                workload = Workload(
                    namespace, name, str(meta.get("uid") or ""), (), False, False, False, False, {}
                )
                await self._write(
                    workload,
                    {
                        "name": entry["name"],
                        "state": "Rejected",
                        "message": f"tidelease: its pods cannot be read: {problems}"[:32768],
                        "lastTransitionTime": rfc3339(now),
                    },
                )
                self._metrics.decisions.labels("Rejected").inc()
                log.warning("kueue: workload %s rejected: %s", key, problems)
                return

    async def _activate(self, name: str, now: float, active: bool) -> None:
        """Mark an AdmissionCheck naming this controller Active (once: Kueue holds back its
        ClusterQueues until then), or, one not among its names, not Active, with why."""
        ac = self.checks.get(name) or {}
        want = "True" if active else "False"
        for c in (ac.get("status") or {}).get("conditions") or []:
            if isinstance(c, dict) and c.get("type") == "Active" and c.get("status") == want:
                return
        message = (
            "tidelease's controllers run the check of lent GPUs"
            if active
            else f"tidelease decides only for the AdmissionChecks named in its settings "
            f"(kueue_checks; the chart's extender.controllers.kueueChecks: "
            f"{', '.join(sorted(self._names)) or 'none'}), not {name}"
        )
        body = {
            "apiVersion": API_VERSION,
            "kind": "AdmissionCheck",
            "metadata": {"name": name},
            "status": {
                "conditions": [
                    {
                        "type": "Active",
                        "status": want,
                        "reason": "Active" if active else "NotListed",
                        "message": message,
                        "lastTransitionTime": rfc3339(now),
                        "observedGeneration": (ac.get("metadata") or {}).get("generation") or 0,
                    }
                ]
            },
        }
        try:
            await self._kube.json(
                "PATCH",
                f"/apis/{API_VERSION}/admissionchecks/{name}/status",
                body=body,
                query={"fieldManager": FIELD_MANAGER, "force": "true"},
                content_type="application/apply-patch+yaml",
            )
        except NotFound:
            return
        if active:
            log.info("kueue: admission check %s is Active", name, extra={"object": name})
        else:
            log.warning("kueue: admission check %s: %s", name, message, extra={"object": name})


async def wait_for_api(kube: KubeClient, poll_s: float = API_POLL_S) -> None:
    """Until the API server serves Kueue's API version (said once while it does not)."""
    said = False
    while True:
        try:
            await kube.json("GET", f"/apis/{API_VERSION}")
            return
        except (NotFound, Unavailable) as e:
            if not said:
                log.warning(
                    "kueue: the API server does not serve %s (%s): is Kueue installed? "
                    "Checking every %.0f s",
                    API_VERSION,
                    e,
                    poll_s,
                )
                said = True
        await asyncio.sleep(poll_s)


async def run_kueue_check(
    *,
    kube: KubeClient,
    view: DemandView | None,
    metrics: KueueMetrics,
    resource: str = contract.DEFAULT_GPU_RESOURCE,
    names: Collection[str] = DEFAULT_CHECKS,
    reclaiming: Callable[[], Collection[JobKey]] = frozenset,
    registry: CollectorRegistry | None = None,
) -> None:
    """Watch AdmissionChecks and Workloads and decide on them all, until cancelled or a watch
    ends. Waits, first, until the API server serves Kueue's API (Kueue installed after
    tidelease, or its CRDs upgraded)."""
    await wait_for_api(kube)
    check = KueueCheck(kube, view, metrics, resource=resource, names=names, reclaiming=reclaiming)
    loop = ReconcileLoop(
        "kueue",
        check.reconcile,
        keys=lambda: [KEY],
        settings=ReconcileSettings(resync_s=RESYNC_S, min_interval_s=0.2),
        registry=registry,
    )

    def on_check(event: str, obj: dict[str, Any]) -> None:
        check.on_check(event, obj)
        loop.add(KEY)

    def on_workload(event: str, obj: dict[str, Any]) -> None:
        check.on_workload(event, obj)
        loop.add(KEY)

    async with Watches(kube, "kueue-admission-check") as watches:
        watches.add("admissionchecks", f"/apis/{API_VERSION}/admissionchecks", on_check)
        watches.add("workloads", f"/apis/{API_VERSION}/{PLURAL}", on_workload)
        await watches.wait_synced()
        await run_checked(loop, watches.check)
