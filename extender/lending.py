"""The leasing controller's decisions: given a GpuLease and what is observed, the next action.
Pure; :mod:`extender.leasecontroller` executes the actions.

One action per step, each idempotent, each decided afresh from the stored lease status and the
observed cluster: a controller killed between any two steps (or in the middle of one) decides
the same next step when it comes back, so nothing is lost and nothing is granted twice.

Scale-down (lend): record the devices to lend in the status, tag them with the owner, then scale
the workload down; its pods go and their tagged devices are free for borrowers.
Scale-up (reclaim): record the reclaim and its deadline (now + grace), give every borrower of a
lent device notice, evict those still there at the deadline, scale the workload up (the
extender sends the owner's pods back to their own lent devices, and to standby devices of the
same type and tier for those that cannot come back), and once all its pods are placed, clear
the tags and the standby flags of the devices it now holds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from common.model import Device, GpuUuid, Holder, JobName
from extender.leases import GpuLease, LeaseStatus, LentGroup, Notice
from extender.leasing import (
    devices_to_tag,
    ordinal,
    plan_reclaim,
    replicas_for,
    replicas_to_release,
    target_gpus,
)

RESYNC_S = 30.0
POD_WAIT_S = 1.0


@dataclass(frozen=True, slots=True)
class OwnerPod:
    name: str
    uid: str
    node: str  # "" while unbound
    devices: tuple[GpuUuid, ...]


@dataclass(frozen=True, slots=True)
class View:
    """What the controller observes of the cluster (from the extender's watches)."""

    devices: Mapping[GpuUuid, Device]
    holders: Mapping[GpuUuid, Holder]
    offering: Mapping[str, bool]


@dataclass(frozen=True, slots=True)
class TagChange:
    node: str
    uuid: GpuUuid
    owner: JobName | None
    standby: bool


@dataclass(frozen=True, slots=True)
class WriteStatus:
    status: LeaseStatus
    why: str


@dataclass(frozen=True, slots=True)
class SetTags:
    changes: tuple[TagChange, ...]
    why: str


@dataclass(frozen=True, slots=True)
class ScaleTo:
    replicas: int


@dataclass(frozen=True, slots=True)
class Notify:
    pods: tuple[Holder, ...]
    deadline: float
    then: LeaseStatus  # the status recording the notices, written after notifying


@dataclass(frozen=True, slots=True)
class Evict:
    pods: tuple[Holder, ...]


@dataclass(frozen=True, slots=True)
class Wait:
    until: float
    why: str


Action = WriteStatus | SetTags | ScaleTo | Notify | Evict | Wait


def _tag(dev: Device, owner: JobName | None, standby: bool) -> TagChange:
    return TagChange(dev.node, dev.uuid, owner, standby)


def decide(
    lease: GpuLease, replicas: int, pods: Sequence[OwnerPod], view: View, now: float
) -> Action:
    spec, status = lease.spec, lease.status
    if status.phase == "Reclaiming":
        return _reclaim(lease, replicas, pods, view, now)
    target = replicas_for(target_gpus(spec.desired_gpus, spec.schedule, now), spec.gpus_per_replica)
    if target > replicas:
        return WriteStatus(
            replace(
                status,
                phase="Reclaiming",
                target_replicas=target,
                reclaim_started=now,
                reclaim_deadline=now + spec.grace_s,
                noticed=(),
                finalizing=False,
            ),
            f"scale up {replicas} -> {target} replicas: reclaim lent devices",
        )
    if target < replicas:
        released = set(replicas_to_release([p.name for p in pods], target))
        have = {g.replica for g in status.groups}
        new = tuple(
            LentGroup(
                p.name,
                tuple(
                    d.uuid
                    for d in devices_to_tag(view.devices[u] for u in p.devices if u in view.devices)
                ),
            )
            for p in sorted(pods, key=lambda p: (ordinal(p.name), p.name))
            if p.name in released and p.name not in have
        )
        new = tuple(g for g in new if g.devices)
        if new or status.phase != "Lending" or status.target_replicas != target:
            return WriteStatus(
                replace(
                    status, phase="Lending", target_replicas=target, groups=status.groups + new
                ),
                f"scale down {replicas} -> {target} replicas: lend "
                f"{sum(len(g.devices) for g in new)} device(s)",
            )
        untagged = [
            view.devices[u]
            for u in status.lent
            if u in view.devices and view.devices[u].cls.owner != spec.owner
        ]
        if untagged:
            return SetTags(
                tuple(_tag(d, spec.owner, False) for d in untagged),
                f"tag {len(untagged)} lent device(s) with owner {spec.owner}",
            )
        return ScaleTo(target)
    if status.phase == "Lending":
        return WriteStatus(replace(status, phase="Steady"), "scaled down; devices lent")
    return Wait(now + RESYNC_S, "steady")


def _reclaim(
    lease: GpuLease, replicas: int, pods: Sequence[OwnerPod], view: View, now: float
) -> Action:
    spec, status = lease.spec, lease.status
    target = status.target_replicas if status.target_replicas is not None else replicas
    deadline = status.reclaim_deadline if status.reclaim_deadline is not None else now
    started = status.reclaim_started if status.reclaim_started is not None else now
    # The replicas coming back (ordinals below the target) take back what they lent; the
    # groups of replicas that stay down remain lent.
    back = tuple(g for g in status.groups if ordinal(g.replica) < target)
    reclaimed = tuple(u for g in back for u in g.devices)
    if not status.finalizing:
        plan = plan_reclaim(spec.owner, reclaimed, view.devices, view.holders, view.offering)
        noticed = {n.uid for n in status.noticed}
        fresh = tuple(b for b in plan.borrowers if b.pod_uid not in noticed)
        if fresh:
            record = tuple(Notice(b.namespace, b.name, b.pod_uid) for b in fresh)
            return Notify(fresh, deadline, replace(status, noticed=status.noticed + record))
        if plan.borrowers:
            if now < deadline:
                return Wait(deadline, f"{len(plan.borrowers)} borrower(s) have notice")
            return Evict(plan.borrowers)
        if replicas < target:
            return ScaleTo(target)
        placed = [p for p in pods if p.node and p.devices]
        if len(placed) < target:
            return Wait(now + POD_WAIT_S, f"{len(placed)} of {target} pods placed")
        held = {u for p in placed for u in p.devices}
        lent = set(status.lent)
        backfilled = sum(1 for u in held if u in view.devices and view.devices[u].cls.standby)
        return WriteStatus(
            replace(
                status,
                finalizing=True,
                returned=status.returned + len(held & lent),
                backfilled=status.backfilled + backfilled,
            ),
            f"all {target} pods placed: {len(held & lent)} lent device(s) came back, "
            f"{backfilled} from standby",
        )
    held = {u for p in pods if p.node for u in p.devices}
    done = set(reclaimed) | (held & set(status.lent))
    changes = [
        _tag(view.devices[u], None, False)
        for u in sorted(done)
        if u in view.devices and view.devices[u].cls.owner is not None
    ] + [
        _tag(view.devices[u], None, False)
        for u in sorted(held)
        if u in view.devices and view.devices[u].cls.standby
    ]
    if changes:
        return SetTags(tuple(changes), "clear the tags of returned and backfilled devices")
    still = tuple(
        LentGroup(g.replica, tuple(u for u in g.devices if u not in done))
        for g in status.groups
        if g not in back
    )
    return WriteStatus(
        replace(
            status,
            phase="Steady",
            groups=tuple(g for g in still if g.devices),
            reclaim_started=None,
            reclaim_deadline=None,
            noticed=(),
            finalizing=False,
            reclaims=status.reclaims + 1,
            last_reclaim_s=now - started,
        ),
        f"reclaim done in {now - started:.1f} s",
    )
