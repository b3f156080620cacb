"""The online jobs, their workloads, and the leasing controller, under one of four policies. Pure.

An online job runs a StatefulSet of ``gpus_per_replica``-GPU pods named ``<job>-<ordinal>``
(high priority, pod priority ``tidelease-online``, its owner, type and tier annotations). Its
pods are scheduled like any other (:mod:`.scheduling`); a pod that cannot be placed stays pending
and is tried again at every step, preempting borrowers where that helps.

* **Right of return** (``right-of-return``): each job has a ``GpuLease`` (owner, workload, GPUs
  per replica, desired GPUs from the trace, or its schedule; grace 45 s) and the leasing
  controller's own decisions drive it: :func:`extender.leasing.decisions.decide` is asked for the
  next action, the action is executed on the simulated world as the controller dispatches it
  (:func:`extender.leasing.execution.execute`: write the lease status, tag devices, scale the
  StatefulSet, give borrowers notice, evict them), and again, until it waits past the end of
  the step. While a lease is ``Reclaiming`` the extender treats the owner's pods as
  reclaims (:meth:`~extender.cluster.state.ClusterState.with_reclaim`), as it does when fed the
  GpuLease by its watch. The standby pool is topped up every ``topup_every`` minutes exactly as
  the controller does it (:func:`~extender.rightofreturn.rules.standby_changes` over the same
  view).
* **No right of return** (``no-return``): what a cluster runs without tidelease, Kubernetes-native
  leasing: the same targets (:func:`~extender.rightofreturn.rules.target_gpus`,
  :func:`~extender.rightofreturn.rules.replicas_for`), the StatefulSet scaled directly (as an
  autoscaler scales it), every pod placed by the plain kube-scheduler with the NVIDIA device
  plugin (:attr:`~extender.leasingsim.scheduling.Profile.PLAIN`: GPUs interchangeable, no tiers,
  tags or standby pool). weflex 4.7: "When leasing GPUs without a Right-of-Return guarantee,
  the share of high-availability GPUs gradually diminished until it aligned with the cluster
  average".
* **Tiers without tags** (``tiers-no-tags``, an ablation): scaled as ``no-return``, but placed
  by tidelease's tier-aware scheduler, without leases, tags or standby pool: what the
  scheduler's tiers alone preserve.
* **No elastic scaling** (``no-scaling``): the jobs keep their peak replicas (placed by
  tidelease's scheduler; they never move).

Every job starts at its peak, its pods placed on the cluster's ``online`` nodes: the pre-lease
placement.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from common.errors import InvalidInput
from common.model import (
    Device,
    DeviceClass,
    GpuUuid,
    Holder,
    NodeName,
    PodRequest,
    PodUid,
    Priority,
    Tier,
)
from common.tenancy import job_key
from extender.leasing.decisions import (
    RESYNC_S,
    STEADY,
    Action,
    Evict,
    MarkRelease,
    Notify,
    OwnerPod,
    ScaleTo,
    SetTags,
    View,
    Wait,
    WriteStatus,
    decide,
)
from extender.leasing.execution import execute
from extender.leasingsim.scenario import NodeSpec, OnlineJob, Role
from extender.leasingsim.scheduling import Profile, Scheduler
from extender.leasingsim.tagging import TagChecks
from extender.leasingsim.world import SimCluster
from extender.rightofreturn.lease import GpuLease, LeaseSpec, LeaseStatus, Workload
from extender.rightofreturn.rules import (
    TypeTier,
    ordinal,
    replicas_for,
    replicas_to_release,
    standby_changes,
    target_gpus,
)

NAMESPACE = "online"
GRACE_S = 45  # the GpuLease default
MAX_ACTIONS = 200  # per lease and step: a guard, never reached in practice


class Policy(enum.Enum):
    RIGHT_OF_RETURN = "right-of-return"
    NO_RETURN = "no-return"
    TIERS_NO_TAGS = "tiers-no-tags"
    NO_SCALING = "no-scaling"

    @property
    def profile(self) -> Profile:
        """The scheduler that places every pod under this policy."""
        return Profile.PLAIN if self is Policy.NO_RETURN else Profile.TIDELEASE

    @property
    def scales_directly(self) -> bool:
        """Whether the jobs' StatefulSets are scaled to their targets without leases."""
        return self in (Policy.NO_RETURN, Policy.TIERS_NO_TAGS)


# the policies compared by default (the ablation only when asked for), in the report's order
DEFAULT_POLICIES = (Policy.RIGHT_OF_RETURN, Policy.NO_RETURN, Policy.NO_SCALING)


@dataclass(frozen=True, slots=True)
class ReclaimRecord:
    """One reclaim of a lease: from ``Reclaiming`` back to ``Steady``.

    *Due*: the devices of the lent groups the reclaim takes back (``status.reclaiming`` when it
    starts): what the owner asks back. *Got*: the devices the pods it created hold when it
    completes, by kind: the owner's own lent devices (*returned*, the same devices back, from
    any of its lent groups), standby devices on loan (*backfilled*), and anything else
    (*foreign*: free or preempted devices, what placement found). A due device is *matched* by
    a got device of any kind of the same GPU type and an equal or better tier (a stand-in is at
    least as reliable as what it replaces: FETCHSTANDBY(k, r) of weflex Algorithm 1,
    reliability >= r; the owner gets its GPUs back in kind, wherever they come from), each
    device matching one due device, best tiers first. The reclaim is
    *full* when every due device is matched and the reclaim completed within the grace period
    plus 10 s.
    """

    minute: int  # when it started
    job: str
    due: int
    returned: int
    backfilled: int
    foreign: int
    matched: int
    lost: int  # due devices that could not come back: unhealthy, or their node gone, at the end
    forfeited: int  # due devices neither back nor still lent to the owner at the end
    evicted: int  # borrower pods evicted by its notice
    duration_s: float  # the controller's own measure, decision to Steady
    grace_s: float

    @property
    def shortfall(self) -> int:
        """Due devices without a match."""
        return self.due - self.matched

    @property
    def timely(self) -> bool:
        return self.duration_s <= self.grace_s + TIMELY_SLACK_S

    @property
    def full(self) -> bool:
        return self.shortfall == 0 and self.timely


TIMELY_SLACK_S = 10.0


def matched(due: Mapping[TypeTier, int], got: Mapping[TypeTier, int]) -> int:
    """How many due devices the got ones match: same type, equal or better tier, one each.
    Per type, the best due tiers take the best got devices first (greedy is optimal here: a
    device that matches a tier matches every tier below it)."""
    total = 0
    for gpu_type in {t for t, _ in due}:
        supply = sorted(
            ((int(tier), n) for (t, tier), n in got.items() if t == gpu_type and n > 0),
            reverse=True,
        )
        left = [list(x) for x in supply]
        for tier, n in sorted(
            ((int(tier), n) for (t, tier), n in due.items() if t == gpu_type), reverse=True
        ):
            need = n
            for slot in left:
                if need == 0:
                    break
                if slot[0] < tier or slot[1] == 0:
                    continue
                use = min(need, slot[1])
                slot[1] -= use
                need -= use
            total += n - need
    return total


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
    # Each pod as last seen, by ordinal: a pod's node and devices change only when it is bound
    # (OnlineJobs._place) or released (OnlineJobs._scale), which drop its entry (online pods
    # are never evicted: only borrowers are victims), so an entry of the pod's UID is current.
    seen: dict[int, OwnerPod] = field(default_factory=dict)
    reclaim: ReclaimStart | None = None  # the reclaim under way, for its record
    lent_tiers: Counter[Tier] = field(default_factory=Counter)  # of the lease's lent devices
    # The inputs of the last decision that found the lease steady (see OnlineJobs._decide).
    steady: tuple[LeaseStatus, int, int, int] | None = None

    def name_of(self, o: int) -> str:
        return f"{self.spec.name}-{o}"  # the StatefulSet's pod names


@dataclass(slots=True)
class ReclaimStart:
    minute: int
    due: tuple[GpuUuid, ...]  # the devices of the groups it takes back
    lent: frozenset[GpuUuid]  # every device the lease had lent
    pods: frozenset[PodUid]  # the job's pods before it
    evicted: int = 0


def standby_targets(
    size: int, weights: Mapping[TypeTier, int], node_gpus: int = 1
) -> dict[TypeTier, int]:
    """``size`` standby devices split over GPU types in whole nodes of ``node_gpus`` (a
    replica stands in on one node), then over each type's tiers, in proportion to ``weights``
    (largest remainder; ties by type, then higher tier first)."""
    unit = max(1, node_gpus)
    by_type: dict[str, int] = {}
    for (t, _), w in weights.items():
        by_type[t] = by_type.get(t, 0) + max(0, w)
    nodes = _apportion(size // unit, by_type, lambda t: (t,))
    out: dict[TypeTier, int] = {}
    for t in by_type:
        share = {k: w for k, w in weights.items() if k[0] == t}
        out.update(_apportion(nodes.get(t, 0) * unit, share, lambda k: (k[0], -int(k[1]))))
    if size % unit and weights:  # a remainder smaller than a node: split it too
        rest = _apportion(size % unit, dict(weights), lambda k: (k[0], -int(k[1])))
        for k, n in rest.items():
            out[k] = out.get(k, 0) + n
    return out


def _apportion(
    size: int, weights: Mapping[Any, int], tie: Callable[[Any], tuple[object, ...]]
) -> dict[Any, int]:
    total = sum(w for w in weights.values() if w > 0)
    if size <= 0 or total <= 0:
        return {k: 0 for k in weights}
    exact = {k: size * max(0, w) / total for k, w in weights.items()}
    out = {k: int(x) for k, x in exact.items()}
    left = size - sum(out.values())
    order = sorted(exact, key=lambda k: (-(exact[k] - int(exact[k])), *tie(k)))
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
                        owner=job_key(NAMESPACE, j.name),
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
        # every device's tier: fixed (tags, standby flags and health change, tiers never do)
        self._tiers: dict[GpuUuid, Tier] = {u: d.tier for u, d in world.devices.items()}
        self._names = {j.lease.spec.owner for j in self.jobs}
        self.minute = 0
        self.reclaims: list[ReclaimRecord] = []
        self.held = 0
        self.held_tiers: Counter[Tier] = Counter()
        self.demand = 0  # GPUs the jobs' targets ask at this step (whatever the policy)
        self.standby_targets: dict[TypeTier, int] = {}
        self.notices = 0
        # What the controller observes: the world's own mappings, live (one view serves every
        # decision), and the leases' tag checks, kept up to date as devices change.
        self._view = View(
            world.devices, world.holder_of, world.offering, tag_check=TagChecks(world)
        )

    # --- what the metrics read ---
    @property
    def peak_gpus(self) -> int:
        return sum(j.peak_replicas * j.spec.gpus_per_replica for j in self.jobs)

    @property
    def wanted_gpus(self) -> int:
        return sum(j.replicas * j.spec.gpus_per_replica for j in self.jobs)

    @property
    def lent_devices(self) -> int:
        """Devices lent by the jobs' leases (``lent_tiers`` counts each of them once)."""
        return sum(j.lent_tiers.total() for j in self.jobs)

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

    def held_by_type_tier(self) -> dict[TypeTier, int]:
        """The devices the jobs hold, per type and tier: what leases can lend and lose."""
        counts: Counter[TypeTier] = Counter()
        for devs in self.holdings().values():
            for d in devs:
                counts[(d.gpu_type, d.tier)] += 1
        return dict(counts)

    def own_tiers(self) -> Counter[Tier]:
        """Tiers of the online jobs' own GPUs: the devices they hold, but standby devices on
        loan (those are the pool's), and the devices they have lent with right of return,
        each device once."""
        tiers = Counter(self.held_tiers)
        world = self.world
        names = self._names
        for u in world.standby:  # loans: standby devices an online job holds
            holder = world.holder_of.get(u)
            if holder is not None and holder.owner in names:
                tiers[world.devices[u].tier] -= 1
        for j in self.jobs:
            tiers.update(j.lent_tiers)
            if j.lease.status.phase == "Reclaiming":  # lent devices held again, not yet untagged
                for u in j.lease.status.lent:
                    holder = world.holder_of.get(u)
                    if holder is not None and holder.owner == j.lease.spec.owner:
                        tiers[world.devices[u].tier] -= 1
        return tiers

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
    def step(
        self,
        minute: int,
        now: float,
        step_s: float,
        released: Callable[[], None] = lambda: None,
    ) -> None:
        """One step of every job. Without right of return, ``released`` runs between the
        scale-downs and the scale-ups: the platform (pending borrowers) takes what was released
        before another job scales up, as kube-scheduler would within seconds."""
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
        elif self.policy.scales_directly:
            for job in self.jobs:
                spec = job.spec
                target = target_gpus(spec.demand_at(minute), spec.schedule, now)
                want = replicas_for(target, spec.gpus_per_replica)
                if want < job.replicas:
                    self._scale(job, want)
            self._place_pending()
            released()
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
            action = self._decide(job, now)
            if isinstance(action, Wait):
                if action.until > end:
                    return
                seen = (action.why, self.world.changes)
                if seen == last:
                    return  # nothing changed meanwhile: the same answer again
                last = seen
                now = job.clock = max(now, action.until)
                continue
            execute(action, _Executing(self, job, now))
        raise AssertionError(f"lease {job.lease.key}: no wait after {MAX_ACTIONS} actions")

    def _decide(self, job: JobState, now: float) -> Action:
        """:func:`decide`, but a lease found steady is not judged again while what that
        judgement read stays the same. Without a schedule, a steady judgement reads the status
        (the same object: statuses are replaced, never changed), the target (the spec's
        desired GPUs in whole replicas), the replicas and the tags of the lent devices (their
        owner's ``world.tag_changes``), not the pods nor the time (but for its wake-up), so the
        answer is the one ``decide`` would give, at a fraction of the cost."""
        lease, world = job.lease, self.world
        spec = lease.spec
        key = None
        if not spec.schedule:
            target = replicas_for(spec.desired_gpus, spec.gpus_per_replica)
            key = (target, job.replicas, world.tag_changes[spec.owner])
            memo = job.steady
            if memo is not None and memo[0] is lease.status and memo[1:] == key:
                return Wait(now + RESYNC_S, STEADY)
        action = decide(lease, job.replicas, self._owner_pods(job), self._view, now)
        steady = key is not None and isinstance(action, Wait) and action.why == STEADY
        job.steady = (lease.status, *key) if steady and key is not None else None
        return action

    def _owner_pods(self, job: JobState) -> list[OwnerPod]:
        if job.observed is not None and job.observed[0] == job.version:
            return job.observed[1]
        world = self.world
        seen = job.seen
        out = []
        for o, uid in sorted(job.pods.items()):
            pod = seen.get(o)
            if pod is None or pod.uid != uid:
                node = world.pod_node.get(uid)
                alloc = None if node is None else world.ledger[node].get(uid)
                devices = alloc.devices if alloc else ()
                pod = seen[o] = OwnerPod(job.name_of(o), uid, node or "", devices)
            out.append(pod)
        job.observed = (job.version, out)
        return out

    def _write_status(self, job: JobState, status: LeaseStatus, now: float) -> None:
        old = job.lease.status
        if status.phase == "Reclaiming" and old.phase != "Reclaiming":
            back = [g for g in status.groups if g.replica in status.reclaiming]
            job.reclaim = ReclaimStart(
                minute=self.minute,
                due=tuple(u for g in back for u in g.devices),
                lent=frozenset(status.lent),
                pods=frozenset(job.pods.values()),
            )
        job.lease = replace(job.lease, status=status)
        groups, before = status.groups, old.groups
        if groups != before:  # every lent device is the world's: none ever goes
            if len(groups) > len(before) and groups[: len(before)] == before:  # lent more
                added = (u for g in groups[len(before) :] for u in g.devices)
                job.lent_tiers.update(map(self._tiers.__getitem__, added))
            else:
                job.lent_tiers = Counter(map(self._tiers.__getitem__, status.lent))
        if old.phase != status.phase:
            # what the extender's watch of GpuLease objects does
            self.world.state.apply_gpu_lease(
                "MODIFIED",
                {
                    "metadata": {"namespace": job.lease.namespace, "name": job.lease.name},
                    "spec": {
                        "owner": job.spec.name,
                        "workload": {"kind": "StatefulSet", "name": job.spec.name},
                    },
                    "status": {"phase": status.phase},
                },
            )
        if old.phase == "Reclaiming" and status.phase == "Steady" and job.reclaim is not None:
            self.reclaims.append(self._record(job, job.reclaim, status))
            job.reclaim = None

    def _record(self, job: JobState, start: ReclaimStart, status: LeaseStatus) -> ReclaimRecord:
        world = self.world
        owner = job.lease.spec.owner
        got: Counter[TypeTier] = Counter()
        returned = backfilled = foreign = 0
        for uid in job.pods.values():
            if uid in start.pods:
                continue
            alloc = world.allocation(uid)
            for u in alloc.devices if alloc is not None else ():
                d = world.devices[u]
                if u in start.lent:
                    returned += 1
                elif d.cls.standby:
                    backfilled += 1
                else:
                    foreign += 1
                got[(d.gpu_type, d.tier)] += 1
        due: Counter[TypeTier] = Counter()
        lost = forfeited = 0
        for u in start.due:
            d = world.devices[u]
            due[(d.gpu_type, d.tier)] += 1
            if not d.cls.healthy or not world.offering.get(d.node, False):
                lost += 1
            holder = world.holder_of.get(u)
            if (holder is None or holder.owner != owner) and d.cls.owner != owner:
                forfeited += 1
        return ReclaimRecord(
            minute=start.minute,
            job=job.spec.name,
            due=len(start.due),
            returned=returned,
            backfilled=backfilled,
            foreign=foreign,
            matched=matched(due, got),
            lost=lost,
            forfeited=forfeited,
            evicted=start.evicted,
            duration_s=status.last_reclaim_s or 0.0,
            grace_s=float(job.lease.spec.grace_s),
        )

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
                job.seen.pop(o, None)
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
            owner=job.lease.spec.owner,
            min_tier=spec.min_tier,
            gpu_type=spec.gpu_type,
            controller=("StatefulSet", spec.name),
        )
        evict: Callable[[Holder], object] | None = self.evict if preempt else None
        placed = self.scheduler.place(req, within=within, evict=evict)
        if placed is None:
            return False
        job.pending.discard(o)
        job.seen.pop(o, None)
        job.version += 1
        self._count(placed.devices, +1)
        return True

    def _count(self, devices: Sequence[Device], sign: int) -> None:
        self.held += sign * len(devices)
        for d in devices:
            self.held_tiers[d.tier] += sign

    # --- the standby pool ---
    def topup(self) -> None:
        """The leasing controller's top-up
        (:meth:`extender.leasing.controller.LeaseController.top_up_standby`) over the world:
        :func:`~extender.rightofreturn.rules.standby_changes` decides on the pool (healthy
        standby devices, those on loan included; its counts are the world's,
        :meth:`~.world.SimCluster.standby_pool`, kept as devices change) and the free devices,
        offered by their nodes; free standby devices beyond the targets (loans given back) leave
        the pool, free untagged devices join it where it is short. Only nodes with a free healthy
        device can add one, so only they are looked at, and only when the pool is short."""
        targets = self.standby_targets
        if not targets:
            return
        world = self.world
        changes = standby_changes(
            world.standby_pool(),
            targets,
            self._free_standby(),
            self._free_devices(),
            (world.devices[u] for u in world.standby),
        )
        if changes.leave:
            world.set_classes({d.uuid: d.cls._replace(standby=False) for d in changes.leave})
        if changes.join:
            world.set_classes({d.uuid: d.cls._replace(standby=True) for d in changes.join})

    def _free_standby(self) -> Iterator[Device]:
        """Free healthy standby devices (gathered when read)."""
        world = self.world
        for u in world.standby:
            d = world.devices[u]
            if u not in world.holder_of and d.cls.healthy:
                yield d

    def _free_devices(self) -> Iterator[Device]:
        """Free devices outside the pool on the nodes with a free healthy device (gathered when
        read)."""
        world = self.world
        held = world.holder_of
        for name in world.with_free(1, None):
            if world.offering.get(name, False):
                for d in world.by_node[name]:
                    if d.uuid not in held and not (d.cls.standby and d.cls.healthy):
                        yield d


@dataclass(frozen=True, slots=True)
class _Executing:
    """An action of the leasing controller's decisions carried out on the simulated world, for
    one job's lease at ``now`` (:func:`~extender.leasing.execution.execute`)."""

    jobs: OnlineJobs
    job: JobState
    now: float

    def write_status(self, action: WriteStatus) -> None:
        self.jobs._write_status(self.job, action.status, self.now)

    def set_tags(self, action: SetTags) -> None:
        world = self.jobs.world
        changes: dict[GpuUuid, DeviceClass] = {}
        for c in action.changes:
            dev = world.devices.get(c.uuid)
            if dev is not None:
                changes[c.uuid] = dev.cls._replace(
                    owner=c.owner, standby=c.standby, replica=c.replica
                )
        world.set_classes(changes)

    def mark_release(self, action: MarkRelease) -> None:
        """Nothing to mark: the simulated scale-down removes the pods the decision released."""

    def scale(self, action: ScaleTo) -> None:
        self.jobs._scale(self.job, action.replicas)

    def notify(self, action: Notify) -> None:
        self.jobs.notices += len(action.pods)
        self.jobs._write_status(self.job, action.then, self.now)

    def evict(self, action: Evict) -> None:
        reclaim = self.job.reclaim
        for pod in action.pods:
            if self.jobs.evict(pod) and reclaim is not None:
                reclaim.evicted += 1

    def wait(self, action: Wait) -> None:  # pragma: no cover - OnlineJobs._control waits
        raise AssertionError(action)
