"""The online jobs, their workloads, and the leasing controller, under one of three policies.

An online job runs a StatefulSet of ``gpus_per_replica``-GPU pods named ``<job>-<ordinal>``
(high priority, pod priority ``tidelease-online``, its owner, type and tier annotations). Its
pods are scheduled like any other (:mod:`.scheduling`); a pod that cannot be placed stays pending
and is tried again at every step, preempting borrowers where that helps.

* **Right of return** (``right-of-return``): each job has a ``GpuLease`` (owner, workload, GPUs
  per replica, desired GPUs from the trace, or its schedule; grace 45 s) and the leasing
  controller's own decisions drive it: :func:`extender.lending.decide` is asked for the next
  action, the action is executed on the simulated world (write the lease status, tag devices,
  scale the StatefulSet, give borrowers notice, evict them), and again, until it waits past the
  end of the step. While a lease is ``Reclaiming`` the extender treats the owner's pods as
  reclaims (:meth:`~extender.clusterstate.ClusterState.with_reclaim`), as it does when fed the
  GpuLease by its watch. The standby pool is topped up every ``topup_every`` minutes exactly as
  the controller does it (:func:`~extender.leasing.standby_topup` over the same view).
* **No right of return** (``no-return``): the same targets (:func:`~extender.leasing.target_gpus`,
  :func:`~extender.leasing.replicas_for`), but the StatefulSet is scaled directly: released
  devices go back untagged, new pods go wherever placement puts them. No standby pool.
* **No elastic scaling** (``no-scaling``): the jobs keep their peak replicas.

Every job starts at its peak, its pods placed on the cluster's ``online`` nodes: the pre-lease
placement.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from common.errors import InvalidInput
from common.model import (
    Device,
    DeviceClass,
    GpuUuid,
    Holder,
    JobName,
    NodeName,
    PodRequest,
    PodUid,
    Priority,
    Tier,
)
from extender.leases import GpuLease, LeaseSpec, LeaseStatus, Workload
from extender.leasing import (
    LENDABLE_TIERS,
    TypeTier,
    ordinal,
    plan_reclaim,
    replicas_for,
    replicas_to_release,
    standby_topup,
    target_gpus,
)
from extender.lending import (
    Action,
    Evict,
    Notify,
    OwnerPod,
    ScaleTo,
    SetTags,
    View,
    Wait,
    WriteStatus,
    decide,
)
from extender.simulation.scenario import NodeSpec, OnlineJob, Role
from extender.simulation.scheduling import Scheduler
from extender.simulation.world import SimCluster

NAMESPACE = "online"
GRACE_S = 45  # the GpuLease default
MAX_ACTIONS = 200  # per lease and step: a guard, never reached in practice


class Policy(enum.Enum):
    RIGHT_OF_RETURN = "right-of-return"
    NO_RETURN = "no-return"
    NO_SCALING = "no-scaling"


@dataclass(frozen=True, slots=True)
class ReclaimRecord:
    """One reclaim of a lease: from ``Reclaiming`` to ``Steady`` again."""

    minute: int  # when it started
    job: str
    lent: int  # devices the lease had lent when it started
    due: int  # of those, as many as the new replicas can hold: what must come back
    returned: int  # lent devices the job holds when its pods are placed
    backfilled: int  # standby devices it holds then
    lost: int  # lent devices that could not come back (failed, or held by a protected pod)
    evicted: int  # borrower pods evicted
    forfeited: int  # healthy lent devices whose tag was cleared without their coming back
    duration_s: float  # the controller's own measure, decision to tags cleared

    @property
    def shortfall(self) -> int:
        return max(0, self.due - self.returned - self.backfilled)

    @property
    def full(self) -> bool:
        """Every device due came back, or a standby device stood in for it."""
        return self.shortfall == 0


@dataclass(slots=True)
class JobState:
    spec: OnlineJob
    lease: GpuLease
    peak_replicas: int
    replicas: int = 0  # the StatefulSet's spec.replicas
    pods: dict[int, PodUid] = field(default_factory=dict)  # by ordinal: created pods
    pending: set[int] = field(default_factory=set)  # ordinals not placed yet
    made: int = 0  # pods created, for unique UIDs
    clock: float = 0.0  # the controller's time for this lease (it may run ahead in a step)
    version: int = 0  # bumped whenever its pods or their devices change
    observed: tuple[int, list[OwnerPod]] | None = None  # its pods as last seen, at a version
    reclaim: dict[str, Any] | None = None  # the reclaim under way, for its record

    def name_of(self, o: int) -> str:
        return f"{self.spec.name}-{o}"  # the StatefulSet's pod names


def standby_targets(size: int, weights: Mapping[TypeTier, int]) -> dict[TypeTier, int]:
    """``size`` standby devices split over types and tiers in proportion to ``weights``
    (largest remainder, ties by type then higher tier first)."""
    total = sum(w for w in weights.values() if w > 0)
    if size <= 0 or total <= 0:
        return {k: 0 for k in weights}
    exact = {k: size * max(0, w) / total for k, w in weights.items()}
    out = {k: int(x) for k, x in exact.items()}
    left = size - sum(out.values())
    order = sorted(exact, key=lambda k: (-(exact[k] - int(exact[k])), k[0], -int(k[1])))
    for k in order[:left]:
        out[k] += 1
    return out


class OnlineJobs:
    def __init__(
        self,
        jobs: Sequence[OnlineJob],
        nodes: Sequence[NodeSpec],
        world: SimCluster,
        scheduler: Scheduler,
        *,
        policy: Policy,
        pod_priority: int,
        evict: Callable[[Holder], bool],
        grace_s: int = GRACE_S,
    ) -> None:
        self.world = world
        self.scheduler = scheduler
        self.policy = policy
        self.pod_priority = pod_priority
        self.evict = evict
        self.jobs = [
            JobState(
                j,
                GpuLease(
                    NAMESPACE,
                    j.name,
                    "1",
                    LeaseSpec(
                        owner=j.name,
                        workload=Workload("apps/v1", "StatefulSet", j.name),
                        gpus_per_replica=j.gpus_per_replica,
                        desired_gpus=j.peak,
                        schedule=j.schedule,
                        grace_s=grace_s,
                    ),
                ),
                replicas_for(j.peak, j.gpus_per_replica),
            )
            for j in jobs
            if j.peak > 0
        ]
        self._online_nodes = {n.name for n in nodes if n.role is Role.ONLINE}
        self.minute = 0
        self.reclaims: list[ReclaimRecord] = []
        self.held = 0
        self.held_tiers: Counter[Tier] = Counter()
        self.demand = 0  # GPUs the jobs' targets ask at this step (whatever the policy)
        self.standby_targets: dict[TypeTier, int] = {}
        self.notices = 0

    # --- what the metrics read ---
    @property
    def peak_gpus(self) -> int:
        return sum(j.peak_replicas * j.spec.gpus_per_replica for j in self.jobs)

    @property
    def wanted_gpus(self) -> int:
        return sum(j.replicas * j.spec.gpus_per_replica for j in self.jobs)

    @property
    def lent_devices(self) -> int:
        return sum(len(j.lease.status.lent) for j in self.jobs)

    def holdings(self) -> dict[str, tuple[Device, ...]]:
        """The devices each job holds now."""
        out: dict[str, tuple[Device, ...]] = {}
        for j in self.jobs:
            devs: list[Device] = []
            for pod in j.pods.values():
                alloc = self.world.allocation(pod)
                if alloc is not None:
                    devs.extend(self.world.devices[u] for u in alloc.devices)
            out[j.spec.name] = tuple(devs)
        return out

    def lendable_holdings(self) -> dict[TypeTier, int]:
        """HA and MA devices the jobs hold, per type and tier: what leases can lose."""
        counts: Counter[TypeTier] = Counter()
        for devs in self.holdings().values():
            for d in devs:
                if d.tier in LENDABLE_TIERS:
                    counts[(d.gpu_type, d.tier)] += 1
        return dict(counts)

    # --- start: the pre-lease placement ---
    def start(self) -> None:
        """Every job at its peak, on the ``online`` nodes where they fit (then anywhere)."""
        problems: list[str] = []
        for job in self.jobs:
            self._scale(job, job.peak_replicas)
            for o in sorted(job.pending):
                if not self._place(job, o, within=self._online_nodes or None, preempt=False):
                    self._place(job, o, preempt=False)
            if job.pending:
                problems.append(
                    f"online job {job.spec.name!r}: only {job.peak_replicas - len(job.pending)} "
                    f"of its {job.peak_replicas} replicas fit the cluster at its peak"
                )
        if problems:
            raise InvalidInput(problems)

    # --- every step ---
    def step(self, minute: int, now: float, step_s: float) -> None:
        self.minute = minute
        self.demand = 0
        for job in self.jobs:
            spec = job.spec
            desired = spec.demand_at(minute)
            self.demand += target_gpus(desired, spec.schedule, now)
            if desired != job.lease.spec.desired_gpus:  # the job's autoscaler writes its lease
                job.lease = replace(job.lease, spec=replace(job.lease.spec, desired_gpus=desired))
        if self.policy is Policy.RIGHT_OF_RETURN:
            for job in self.jobs:
                self._control(job, now, now + step_s)
            self._place_pending()
            for job in self.jobs:
                self._control(job, now, now + step_s)
        elif self.policy is Policy.NO_RETURN:
            for job in self.jobs:
                spec = job.spec
                target = target_gpus(spec.demand_at(minute), spec.schedule, now)
                want = replicas_for(target, spec.gpus_per_replica)
                if want < job.replicas:
                    self._scale(job, want)
            self._place_pending()
            for job in self.jobs:
                spec = job.spec
                target = target_gpus(spec.demand_at(minute), spec.schedule, now)
                want = replicas_for(target, spec.gpus_per_replica)
                if want > job.replicas:
                    self._scale(job, want)
            self._place_pending()
        else:
            self._place_pending()

    # --- the leasing controller, as it runs in the extender deployment ---
    def _control(self, job: JobState, start: float, end: float) -> None:
        """Step the lease until it waits past ``end``; it wakes up within the step at the time
        it asks for (a reclaim's grace period, the wait for pods) when something may have
        changed by then."""
        now = job.clock = max(start, job.clock)
        last: tuple[str, int] | None = None
        for _ in range(MAX_ACTIONS):
            action = decide(job.lease, job.replicas, self._owner_pods(job), self._view(), now)
            if isinstance(action, Wait):
                if action.until > end:
                    return
                seen = (action.why, self.world.changes)
                if seen == last:
                    return  # nothing changed meanwhile: the same answer again
                last = seen
                now = job.clock = max(now, action.until)
                continue
            self._execute(job, action, now)
        raise AssertionError(f"lease {job.lease.key}: no wait after {MAX_ACTIONS} actions")

    def _view(self) -> View:
        world = self.world
        return View(world.devices, world.holder_of, world.offering)

    def _owner_pods(self, job: JobState) -> list[OwnerPod]:
        if job.observed is not None and job.observed[0] == job.version:
            return job.observed[1]
        world = self.world
        out = []
        for o, uid in sorted(job.pods.items()):
            node = world.pod_node.get(uid)
            alloc = None if node is None else world.ledger[node].get(uid)
            out.append(OwnerPod(job.name_of(o), uid, node or "", alloc.devices if alloc else ()))
        job.observed = (job.version, out)
        return out

    def _execute(self, job: JobState, action: Action, now: float) -> None:
        if isinstance(action, WriteStatus):
            self._write_status(job, action.status, now)
        elif isinstance(action, SetTags):
            world = self.world
            changes: dict[GpuUuid, DeviceClass] = {}
            for c in action.changes:
                dev = world.devices.get(c.uuid)
                if dev is not None:
                    changes[c.uuid] = dev.cls._replace(owner=c.owner, standby=c.standby)
            world.set_classes(changes)
        elif isinstance(action, ScaleTo):
            self._scale(job, action.replicas)
        elif isinstance(action, Notify):
            self.notices += len(action.pods)
            self._write_status(job, action.then, now)
        elif isinstance(action, Evict):
            for pod in action.pods:
                if self.evict(pod) and job.reclaim is not None:
                    job.reclaim["evicted"] += 1
        else:  # pragma: no cover - Wait is handled by the caller
            raise AssertionError(action)

    def _write_status(self, job: JobState, status: LeaseStatus, now: float) -> None:
        old = job.lease.status
        if status.phase == "Reclaiming" and old.phase != "Reclaiming":
            lent = status.lent
            view = self._view()
            holders = {u: view.holders[u] for u in lent if u in view.holders}
            plan = plan_reclaim(job.spec.name, lent, view.devices, holders, view.offering)
            new = max(0, (status.target_replicas or 0) - job.replicas)
            job.reclaim = {
                "minute": self.minute,
                "lent": len(lent),
                "due": min(len(lent), new * job.spec.gpus_per_replica),
                "lost": sum(plan.backfill.values()),  # failed, or held by a protected pod
                "evicted": 0,
                "returned": status.returned,
                "backfilled": status.backfilled,
            }
        job.lease = replace(job.lease, status=status)
        if old.phase != status.phase:
            # what the extender's watch of GpuLease objects does
            self.world.state.apply_gpu_lease(
                "MODIFIED",
                {
                    "metadata": {"namespace": job.lease.namespace, "name": job.lease.name},
                    "spec": {"owner": job.spec.name},
                    "status": {"phase": status.phase},
                },
            )
        if old.phase == "Reclaiming" and status.phase == "Steady" and job.reclaim is not None:
            r = job.reclaim
            returned = status.returned - r["returned"]
            self.reclaims.append(
                ReclaimRecord(
                    minute=r["minute"],
                    job=job.spec.name,
                    lent=r["lent"],
                    due=r["due"],
                    returned=returned,
                    backfilled=status.backfilled - r["backfilled"],
                    lost=r["lost"],
                    evicted=r["evicted"],
                    forfeited=max(0, r["lent"] - returned - r["lost"]),
                    duration_s=status.last_reclaim_s or 0.0,
                )
            )
            job.reclaim = None

    # --- the StatefulSet and its pods ---
    def _scale(self, job: JobState, replicas: int) -> None:
        """What the StatefulSet controller does: highest ordinals go, lowest missing come."""
        job.version += 1
        if replicas < job.replicas:
            names = [job.name_of(o) for o in job.pods]
            for name in replicas_to_release(names, replicas):
                o = ordinal(name)
                uid = job.pods.pop(o)
                job.pending.discard(o)
                alloc = self.world.release(uid)
                if alloc is not None:
                    self._count([self.world.devices[u] for u in alloc.devices], -1)
        job.replicas = replicas
        for o in range(replicas):
            if o not in job.pods:
                job.made += 1
                uid = PodUid(f"{job.spec.name}/{job.made}")
                job.pods[o] = uid
                job.pending.add(o)

    def _place_pending(self) -> None:
        for job in self.jobs:
            for o in sorted(job.pending):
                self._place(job, o, preempt=True)

    def _place(
        self,
        job: JobState,
        o: int,
        *,
        within: set[NodeName] | None = None,
        preempt: bool,
    ) -> bool:
        spec = job.spec
        uid = job.pods[o]
        req = PodRequest(
            namespace=NAMESPACE,
            name=job.name_of(o),
            uid=uid,
            gpus=spec.gpus_per_replica,
            priority=Priority.HIGH,
            pod_priority=self.pod_priority,
            owner=JobName(spec.name),
            min_tier=spec.min_tier,
            gpu_type=spec.gpu_type,
        )
        evict: Callable[[Holder], object] | None = self.evict if preempt else None
        placed = self.scheduler.place(req, within=within, evict=evict)
        if placed is None:
            return False
        job.pending.discard(o)
        job.version += 1
        self._count(placed.devices, +1)
        return True

    def _count(self, devices: Sequence[Device], sign: int) -> None:
        self.held += sign * len(devices)
        for d in devices:
            self.held_tiers[d.tier] += sign

    # --- the standby pool ---
    def topup(self) -> None:
        """:meth:`extender.leasecontroller.LeaseController.top_up_standby` over the world: the
        pool (healthy standby devices) and the free devices, offered by their nodes, given to
        :func:`~extender.leasing.standby_topup`. Only nodes with a free healthy device can add
        one, so only they are looked at."""
        targets = self.standby_targets
        if not targets:
            return
        world = self.world
        pool: dict[TypeTier, int] = {}
        for u in world.standby:
            d = world.devices[u]
            if d.cls.healthy and world.offering.get(d.node, False):
                key = (d.gpu_type, d.tier)
                pool[key] = pool.get(key, 0) + 1
        if all(pool.get(k, 0) >= n for k, n in targets.items()):
            return  # standby_topup would choose nothing
        held = world.holder_of
        free = [
            d
            for name in world.with_free(1, None)
            if world.offering.get(name, False)
            for d in world.by_node[name]
            if d.uuid not in held and not (d.cls.standby and d.cls.healthy)
        ]
        chosen = standby_topup(free, pool, targets)
        if chosen:
            world.set_classes({d.uuid: d.cls._replace(standby=True) for d in chosen})
