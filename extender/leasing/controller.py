"""The leasing controller: executes :mod:`extender.leasing.decisions`'s decisions against the API
server (:mod:`extender.leasing.kubeworld`), through :func:`extender.leasing.execution.execute`.

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
:class:`~extender.leasing.metrics.LeasingMetrics` keeps only what lending itself does.

In DRA mode (docs/dra.md) a lease's step first takes its claim step
(:class:`~extender.leasing.claimstep.ClaimPinner`): the ``reclaiming`` marks, a returning
replica's claim pinned, a gated pod let go.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from common import contract
from common.errors import InvalidInput, TideleaseError
from common.model import Device, Holder
from common.objects import object_key
from common.reconcile import ReconcileLoop, ReconcileSettings, Requeue, Result
from common.tenancy import granted, online_refusal
from common.timefmt import epoch, microtime
from extender.cluster.store import Kind
from extender.cluster.watching import ClusterView
from extender.leasing import claimpinning
from extender.leasing.claimstep import ClaimPinner, ClaimWrites
from extender.leasing.decisions import (
    RECLAIM_OVERDUE_S,
    Action,
    Evict,
    MarkRelease,
    Notify,
    OwnerPod,
    ScaleTo,
    SetTags,
    TagChange,
    Wait,
    WriteStatus,
    decide,
    legacy_tags,
    overdue,
)
from extender.leasing.execution import execute
from extender.leasing.metrics import LeasingMetrics
from extender.leasing.observation import observe
from extender.rightofreturn.lease import (
    GpuLease,
    LeaseStatus,
    Trouble,
    Workload,
    parse_gpu_lease,
)
from extender.rightofreturn.rules import TypeTier, standby_changes

log = logging.getLogger(__name__)


# The reconcile key of the standby pool's top-up: no GpuLease key is without a "/".
STANDBY_KEY = "standby-pool"
# After an action, the lease is stepped again this soon (its watch event usually comes first).
STEP_AGAIN_S = 0.1
# A Wait whose time has come is stepped again no sooner than this (never a busy loop).
MIN_WAIT_S = 0.05
RESYNC_S = 30.0  # every lease (and the standby key) is reconciled at least this often
# The first retry after an error (the old loop's fixed 2 s), doubling to the resync period.
RETRY_BASE_S = 2.0
# A borrower evicted this recently is not evicted again: the watch has not yet shown it
# terminating. Its lease waits instead, and steps as soon as the pod's event comes (at most
# EVICTED_RECHECK_S later): an eviction repeated costs the API server two writes.
EVICTED_RECENTLY_S = 10.0
EVICTED_RECHECK_S = 1.0
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
        # (namespace, spec.owner) -> the keys of its leases: a pod's event finds its owner's
        # leases without a look at every lease.
        self._owned: dict[tuple[str, str], set[str]] = {}

    def apply(self, event: str, obj: dict[str, Any]) -> None:
        key = object_key(obj)
        old = self.raw.pop(key, None)
        if old is not None:
            self._index(key, old, add=False)
        if event != "DELETED":
            self.raw[key] = obj
            self._index(key, obj, add=True)
        if self.on_change is not None:
            self.on_change(key)

    def of_owner(self, namespace: str, owner: str) -> tuple[str, ...]:
        """The keys of the leases of the job ``owner`` of ``namespace``."""
        return tuple(self._owned.get((namespace, owner), ()))

    def _index(self, key: str, obj: Mapping[str, Any], *, add: bool) -> None:
        owner = (obj.get("spec") or {}).get("owner")
        if not isinstance(owner, str):
            return
        at = (key.partition("/")[0], owner)
        if add:
            self._owned.setdefault(at, set()).add(key)
        elif at in self._owned:
            self._owned[at].discard(key)
            if not self._owned[at]:
                del self._owned[at]

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


class World(ClaimWrites, Protocol):
    """The writes the controller makes (and the one read the watches do not give it): on the
    API server, :class:`extender.leasing.kubeworld.KubeWorld`."""

    async def replicas(self, namespace: str, workload: Workload) -> int: ...

    async def scale(self, namespace: str, workload: Workload, replicas: int) -> None: ...

    async def set_deletion_cost(self, namespace: str, pod: OwnerPod, cost: str | None) -> None: ...

    async def set_tags(self, changes: Iterable[TagChange]) -> None: ...

    async def write_status(
        self, lease: GpuLease, status: LeaseStatus, degraded: Trouble | None = None
    ) -> None: ...

    async def notify(self, pod: Holder, lease: GpuLease, deadline: float) -> None: ...

    async def evict(self, pod: Holder, lease: GpuLease) -> None: ...


# The Degraded reason of a lease whose namespace an admin has not granted online jobs.
NOT_GRANTED = "NotGranted"


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
        workers: int = 16,
    ) -> None:
        self.view, self.leases = view, leases
        # DRA mode (docs/dra.md): devices held through ResourceClaims, owners' gated pods
        # pinned to their lent devices (the view must watch DRA_VIEW_KINDS); None otherwise.
        self.claims = ClaimPinner(view, leases.raw, world) if dra_mode else None
        self.world, self.metrics, self.clock = world, metrics, clock
        self.standby_targets = dict(standby_targets or {})
        self.standby_interval_s = standby_interval_s
        # extender.scheduler.settings' leasing_test_grace_s: every lease's notice, for test clusters
        self.test_grace_s = test_grace_s
        self.overdue_after_s = overdue_after_s
        self._next_topup = 0.0  # on self.clock: when the standby pool is next topped up
        # Borrowers this controller evicted: pod UID -> (lease key, when, on self.clock).
        self._evicted: dict[str, tuple[str, float]] = {}
        # The loop keeps its own monotonic clock: lease times (Wait.until) are wall time and
        # reach it only as "seconds from now".
        self.loop = ReconcileLoop(
            "leasing",
            self.reconcile,
            keys=self.keys,
            settings=ReconcileSettings(
                workers=workers, resync_s=RESYNC_S, retry_base_s=RETRY_BASE_S, retry_cap_s=RESYNC_S
            ),
            registry=metrics.registry,
        )
        leases.on_change = self._lease_changed
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
        """One of an owner's pods changed: step the owner's leases now, not at their next poll,
        where one waits for it: a reclaim for its replicas to be placed (at dawn each poll
        second is a second late), and in DRA mode for a gated pod (or its claim's name)."""
        meta = pod.get("metadata") or {}
        evicted = self._evicted.get(str(meta.get("uid", "")))
        if evicted is not None and meta.get("deletionTimestamp"):
            self.loop.add(evicted[0])  # a borrower it evicted is terminating: scale up now
        owner = (meta.get("annotations") or {}).get(contract.ANN_OWNER)
        if not owner:
            return
        gated = self.claims is not None and claimpinning.gated_pod(pod) is not None
        # The owner is a job of the pod's namespace.
        for key in self.leases.of_owner(str(meta.get("namespace", "")), owner):
            raw = self.leases.raw.get(key) or {}
            if gated or (raw.get("status") or {}).get("phase") == "Reclaiming":
                self.loop.add(key)

    async def step(
        self, lease: GpuLease
    ) -> Action | claimpinning.ClaimStep | claimpinning.MarkReclaiming:
        """Decide and execute one action for one lease. In DRA mode first its claim step, if it
        has one to take (:meth:`ClaimPinner.step <extender.leasing.claimstep.ClaimPinner.step>`:
        the ``reclaiming`` marks of the devices its reclaim takes back, so that no borrower's
        claim is allocated them again, then the next pin or gate lift of its gated pods)."""
        if self.test_grace_s is not None:
            lease = replace(lease, spec=replace(lease.spec, grace_s=self.test_grace_s))
        holdings = self._holdings()
        owner_pods, view = observe(
            self.view.cluster, self.view.pods, lease, holdings, self.leases.granted
        )
        if self.claims is not None:
            claim_step = await self.claims.step(lease, owner_pods, view, holdings)
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
        action = self._not_twice(lease, decide(lease, replicas, owner_pods, view, now), now)
        await execute(action, _LeaseWrites(self, lease, owner_pods, now))
        return action

    def _not_twice(self, lease: GpuLease, action: Action, now: float) -> Action:
        """An eviction of the borrowers not evicted in the last EVICTED_RECENTLY_S (the next
        step may come before the watch shows the last step's evictions); a wait when every one
        was. An eviction is recorded once it succeeded (:meth:`_LeaseWrites.evict`)."""
        if not isinstance(action, Evict):
            return action
        self._evicted = {
            uid: (key, when)
            for uid, (key, when) in self._evicted.items()
            if now - when < EVICTED_RECENTLY_S
        }
        fresh = tuple(p for p in action.pods if p.pod_uid not in self._evicted)
        if not fresh:
            return Wait(now + EVICTED_RECHECK_S, f"{len(action.pods)} evicted borrower(s) leaving")
        return replace(action, pods=fresh)

    def evicted(self, lease: GpuLease, pod: Holder, now: float) -> None:
        """``pod`` was evicted for ``lease``: not evicted again for EVICTED_RECENTLY_S, and its
        terminating pod's event steps the lease."""
        self._evicted[pod.pod_uid] = (lease.key, now)

    def _holdings(self) -> tuple[claimpinning.ClaimHolding, ...]:
        """DRA mode: who holds which device through the claims the view shows; none otherwise."""
        return self.claims.holdings() if self.claims is not None else ()

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
        """Keep the standby pool at its targets: the changes
        :func:`~extender.rightofreturn.rules.standby_changes` decides over the offering nodes'
        devices (free standby devices beyond a target leave the pool, free untagged devices join
        it where it is short), written as tags; how many devices changed. The simulator's top-up
        decides through the same function."""
        if not self.standby_targets:
            return 0
        pool: dict[TypeTier, int] = {}
        free: list[Device] = []
        free_standby: list[Device] = []
        standby: list[Device] = []
        # Held by a pod (in DRA mode also through a claim, or pinned a moment ago): not free.
        held = {u for h in self._holdings() for u in h.devices}
        if self.claims is not None:
            held.update(self.claims.pinned())
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
        changes = standby_changes(pool, self.standby_targets, free_standby, free, standby)
        extra, chosen = changes.leave, changes.join
        if extra:
            log.info("standby pool: giving %d device(s) above its targets back", len(extra))
            await self.world.set_tags(TagChange(d.node, d.uuid, None, False) for d in extra)
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
        if self.claims is not None:
            self.claims.forget()
        await self.loop.run(ready=ready)


@dataclass(frozen=True, slots=True)
class _LeaseWrites:
    """One step's action carried out for one lease (:func:`~extender.leasing.execution.execute`):
    the controller's world writes it, its log and metrics say it. Each status written carries
    the lease's Degraded condition as that status makes it."""

    controller: LeaseController
    lease: GpuLease
    owner_pods: Sequence[OwnerPod]
    now: float

    def _trouble(self, status: LeaseStatus) -> Trouble | None:
        """Degraded or not, as the status about to be stored says (a reclaim just done is not
        overdue, whatever the one it ends was)."""
        lease = replace(self.lease, status=status)
        return overdue(lease, self.owner_pods, self.now, self.controller.overdue_after_s)

    async def write_status(self, action: WriteStatus) -> None:
        lease, world, metrics = self.lease, self.controller.world, self.controller.metrics
        log.info("lease %s: %s", lease.key, action.why)
        await world.write_status(lease, action.status, self._trouble(action.status))
        metrics.lent.labels(lease.key).set(len(action.status.lent))
        if action.status.phase == "Steady" and lease.status.phase == "Reclaiming":
            metrics.reclaims.labels(lease.key).inc()
            metrics.latency.observe(action.status.last_reclaim_s or 0.0)
            metrics.backfills.inc(action.status.backfilled - lease.status.backfilled)

    async def set_tags(self, action: SetTags) -> None:
        log.info("lease %s: %s", self.lease.key, action.why)
        await self.controller.world.set_tags(action.changes)

    async def mark_release(self, action: MarkRelease) -> None:
        lease = self.lease
        log.info("lease %s: %s", lease.key, action.why)
        for pod, cost in action.costs:
            await self.controller.world.set_deletion_cost(lease.namespace, pod, cost)

    async def scale(self, action: ScaleTo) -> None:
        lease = self.lease
        workload = lease.spec.workload
        log.info("lease %s: scale %s to %d replicas", lease.key, workload.name, action.replicas)
        await self.controller.world.scale(lease.namespace, workload, action.replicas)

    async def notify(self, action: Notify) -> None:
        """Every borrower's notice at once (each its own writes), then the status recording
        them; one that fails fails the step, which gives notice again to those not recorded."""
        lease, world = self.lease, self.controller.world

        async def one(pod: Holder) -> None:
            log.info(
                "lease %s: notice to borrower %s: evicted at %s",
                lease.key,
                pod.key,
                microtime(action.deadline),
            )
            await world.notify(pod, lease, action.deadline)

        await _each(action.pods, one)
        await world.write_status(lease, action.then, self._trouble(action.then))

    async def evict(self, action: Evict) -> None:
        """Every borrower evicted at once: at dawn a lease's borrowers all reach the end of
        their notice together, and each eviction is a few API writes."""
        lease, world = self.lease, self.controller.world

        async def one(pod: Holder) -> None:
            log.info("lease %s: evicting borrower %s", lease.key, pod.key)
            await world.evict(pod, lease)
            self.controller.evicted(lease, pod, self.now)
            self.controller.metrics.evictions.inc()

        await _each(action.pods, one)

    async def wait(self, action: Wait) -> None:
        """Waiting: if the lease's Degraded condition is not what it is, say so."""
        lease = self.lease
        trouble = self._trouble(lease.status)
        if (trouble.reason if trouble else None) == lease.degraded:
            return
        if trouble is not None:
            log.warning("lease %s: degraded: %s", lease.key, trouble.message)
        else:
            log.info("lease %s: no longer degraded", lease.key)
        await self.controller.world.write_status(lease, lease.status, trouble)


async def _each(pods: Sequence[Holder], act: Callable[[Holder], Awaitable[None]]) -> None:
    """``act`` on every pod concurrently; every one is tried, and the first error (in the pods'
    order) is raised once all are done."""
    results = await asyncio.gather(*(act(p) for p in pods), return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
