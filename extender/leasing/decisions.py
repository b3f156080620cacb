"""The leasing controller's decisions: given a GpuLease and what is observed, the next action.
Pure; :mod:`extender.leasing.controller` executes the actions.

One action per step, each idempotent, each decided afresh from the stored lease status and the
observed cluster: a controller killed between any two steps (or in the middle of one) decides
the same next step when it comes back, so nothing is lost and nothing is granted twice.

Scale-down (lend): record the devices to lend in the status, tag them with the owner, give the
standby devices the released replicas had on loan back to the pool, then scale the workload
down; its pods go and their tagged devices are free for borrowers.
Scale-up (reclaim): record the reclaim and its deadline (now + grace), give every borrower of a
lent device notice, evict those still there at the deadline, scale the workload up (the
extender sends the owner's pods back to their own lent devices, and to standby devices for
those that cannot come back), and once all its pods are placed, clear the tags of the lent
devices it holds again and mark the standby devices it holds as its loans.

Right of return per replica: each lent device is tagged with the owner and with the replica
that lent it (its group). Where the workload names its replicas (a StatefulSet,
:func:`~extender.rightofreturn.replicas.names_replicas`), the replica a scale-up brings back
takes back its own group, and only it: the extender lets a returning replica use no other
group's devices and sends it to the node holding its group. A group that cannot come back whole
(a device unhealthy, its node gone or silent, a device held by another job's high-priority pod)
is swapped, at the start of the reclaim, with a group of the owner that stays lent and can come
back (the replica takes that group instead, and the broken group stays lent under the other's
name); without one the replica takes what the node of its group offers, then standby devices. A
Deployment's pods have no stable names: its lent groups come back as a set.

Loans: a standby device a reclaim takes stands in for a lent device that could not come back
(failed, or on a node gone). It keeps its standby flag and is tagged with the owner while the
owner holds it, and goes back to the pool when the replica holding it is released; the lent
device it stands in for stays lent, and comes back at a later reclaim once it can. So the
devices the owner holds or has lent are always the devices it held before lending: the same
number, of the same types and tiers (so its share of high-availability devices stays what it
was), with nothing lent twice and nothing kept for good from the standby pool.

Reference: weflex 3.5, "the stable proportion of HA devices" (docs/references.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from common.model import Device, GpuUuid, Holder, JobKey, PodUid
from extender.rightofreturn.lease import (
    RECLAIM_OVERDUE,
    GpuLease,
    LeaseStatus,
    LentGroup,
    Notice,
    Trouble,
)
from extender.rightofreturn.replicas import (
    STATEFULSET,
    in_groups,
    incoming_replicas,
    indexer,
    member_name,
    names_replicas,
)
from extender.rightofreturn.rules import (
    devices_to_tag,
    group_can_return,
    ordinal,
    plan_reclaim,
    replica_unit,
    replicas_for,
    replicas_to_release,
    target_gpus,
)

RESYNC_S = 30.0
# Why a lease in balance waits: nothing to do until its inputs change or RESYNC_S passes.
STEADY = "steady"
POD_WAIT_S = 1.0
# A reclaim still under way this long after its borrowers' notice ended makes the lease
# Degraded (the extender's reclaim_overdue_s setting).
RECLAIM_OVERDUE_S = 120.0


@dataclass(frozen=True, slots=True)
class OwnerPod:
    name: str
    uid: str
    node: str  # "" while unbound
    devices: tuple[GpuUuid, ...]
    deletion_cost: str | None = None  # its controller.kubernetes.io/pod-deletion-cost


@dataclass(frozen=True, slots=True)
class View:
    """What the controller observes of the cluster (from the extender's watches)."""

    devices: Mapping[GpuUuid, Device]
    holders: Mapping[GpuUuid, Holder]
    offering: Mapping[str, bool]
    # How bad evicting these borrowers is (smaller is better): the shared queues' partial
    # preemption rule (queue hit, jobs halted, throughput lost; cornucopia Algorithm 3) when the
    # controller knows the jobs (extender.queues.preemptionorder.eviction_cost);
    # None: every borrower counts the same.
    eviction_cost: Callable[[Sequence[Holder]], tuple[int, int, float]] | None = None
    # Where the caller keeps the answer of stale_tags up to date as devices change (the cluster
    # simulator): asked instead of looking at every lent device, and it must answer exactly what
    # stale_tags(groups, view, owner) does. None (the controller): stale_tags itself.
    tag_check: Callable[[Sequence[LentGroup], View, JobKey], tuple[TagChange, ...]] | None = None


@dataclass(frozen=True, slots=True)
class TagChange:
    node: str
    uuid: GpuUuid
    owner: JobKey | None
    standby: bool
    replica: str | None = None  # the owner's replica that lent the device (its group)


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
class MarkRelease:
    """Set (a value) or remove (None) each pod's pod-deletion-cost, so that a ReplicaSet's
    scale-down removes exactly the pods whose devices are lent."""

    costs: tuple[tuple[OwnerPod, str | None], ...]
    why: str


# The cost of a Deployment's pod whose devices a scale-down lends: below every other pod's
# (Kubernetes' default is 0), so the ReplicaSet removes it first.
RELEASE_COST = "-1000"


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


Action = WriteStatus | SetTags | MarkRelease | ScaleTo | Notify | Evict | Wait


def _tag(dev: Device, owner: JobKey | None, standby: bool, replica: str | None = None) -> TagChange:
    return TagChange(dev.node, dev.uuid, owner, standby, replica)


def _retag(
    groups: Sequence[LentGroup], view: View, owner: JobKey, skip: set[GpuUuid] | None = None
) -> tuple[TagChange, ...]:
    """The tags that do not yet say what the status says: every lent device tagged with the
    owner and the replica whose group it is in (``skip``: devices whose tags are cleared);
    ``view.tag_check`` answers where the view has one (and nothing is skipped)."""
    if view.tag_check is not None and not skip:
        return view.tag_check(groups, view, owner)
    return stale_tags(groups, view, owner, skip)


def stale_tags(
    groups: Sequence[LentGroup], view: View, owner: JobKey, skip: set[GpuUuid] | None = None
) -> tuple[TagChange, ...]:
    """The tag of every lent device (in the groups' order) that is not yet the owner's with the
    replica whose group it is in, but for ``skip``; devices not in the view are left out."""
    out = []
    get = view.devices.get  # the leasing controller's hottest loop: every lent device, each pass
    for g in groups:
        replica = g.replica
        for u in g.devices:
            d = get(u)
            if d is None:
                continue
            cls = d.cls
            if (cls.owner != owner or cls.replica != replica) and not (skip and u in skip):
                out.append(_tag(d, owner, False, replica))
    return tuple(out)


def _loans(pods: Sequence[OwnerPod], view: View, lent: set[GpuUuid]) -> set[GpuUuid]:
    """The devices the owner holds on loan: standby devices, and every other device of a pod
    that holds one, but its own lent devices (a stand-in replica holds all it took beside its
    own devices on loan, so that none of them is lent later as if it were the owner's)."""
    out: set[GpuUuid] = set()
    get = view.devices.get
    for p in pods:
        if not p.node:
            continue
        for u in p.devices:
            d = get(u)
            if d is not None and d.cls.standby:
                out.update(u for u in p.devices if get(u) is not None and u not in lent)
                break
    return out


def _on_loan(dev: Device, owner: JobKey) -> bool:
    """A standby device the owner holds as a stand-in (marked when its reclaim completed)."""
    return dev.cls.standby and dev.cls.owner == owner


def choose_groups(groups: Sequence[LentGroup], count: int, view: View) -> list[LentGroup]:
    """The lent groups a scale-up by ``count`` replicas takes back: those whose devices are all
    healthy and free first (nobody to evict), then those that break the fewest borrower gangs
    (a gang goes whole: common.gangs), then those whose borrowers lose least by eviction
    (``view.eviction_cost``), then those with the fewest borrowers, gangs' members counted."""
    members: dict[str, dict[PodUid, Holder]] = {}
    for h in view.holders.values():
        if h.gang is not None:
            members.setdefault(h.gang, {})[h.pod_uid] = h

    def cost(g: LentGroup) -> tuple[int, int, tuple[int, int, float], int, int, str]:
        broken = sum(
            1 for u in g.devices if u not in view.devices or not view.devices[u].cls.healthy
        )
        victims = {view.holders[u].pod_uid: view.holders[u] for u in g.devices if u in view.holders}
        gangs = {h.gang for h in victims.values() if h.gang is not None}
        for gang in gangs:
            victims.update(members[gang])
        loss = view.eviction_cost(list(victims.values())) if view.eviction_cost else (0, 0, 0.0)
        return (broken, len(gangs), loss, len(victims), ordinal(g.replica), g.replica)

    return sorted(groups, key=cost)[: max(0, count)]


def scale_up_groups(
    lease: GpuLease, have: int, target: int, view: View
) -> tuple[tuple[LentGroup, ...], tuple[LentGroup, ...]]:
    """The lent groups as a scale-up from ``have`` to ``target`` replicas takes them back:
    (every lent group, renamed where one stands in for another; the groups taken back).

    Where the workload names its replicas, each incoming replica takes back its own group. One
    whose group cannot come back whole (:func:`~extender.rightofreturn.rules.group_can_return`)
    takes, instead, a group that stays lent and can (the cheapest by :func:`choose_groups`): the
    two swap names, so the broken group stays lent for the replica still down. A replica with no
    such group takes its own anyway (its healthy devices come back, standby for the rest).
    Elsewhere: :func:`choose_groups` picks ``target - have`` groups, any replica any group.
    """
    spec, groups = lease.spec, lease.status.groups
    incoming = incoming_replicas(
        spec.workload.kind, spec.workload.name, have, target, (g.replica for g in groups)
    )
    if incoming is None:
        return groups, tuple(choose_groups(groups, target - have, view))

    def whole(g: LentGroup) -> bool:
        return group_can_return(spec.owner, g.devices, view.devices, view.holders, view.offering)

    names = set(incoming)
    # The substitutes, cheapest first; looked for only once an incoming replica needs one (a
    # reclaim whose groups all come back whole, the common case, never judges the others).
    spare: list[LentGroup] | None = None
    by_name = {g.replica: g for g in groups}
    for name in incoming:
        own = by_name.get(name)
        if own is not None and whole(own):
            continue
        if spare is None:
            spare = choose_groups(
                [g for g in groups if g.replica not in names and whole(g)], len(groups), view
            )
        # Of as many devices as the replica's own (a LeaderWorkerSet's leader and workers may
        # differ): a pod takes back no group it could not use whole.
        size = len(own.devices) if own is not None else None
        sub = next((g for g in spare if size is None or len(g.devices) == size), None)
        if sub is None:
            continue
        spare.remove(sub)
        by_name[name] = LentGroup(name, sub.devices)
        if own is None:
            del by_name[sub.replica]
        else:
            by_name[sub.replica] = LentGroup(sub.replica, own.devices)
    # In their recorded order, a substitute's new name where the name it left was.
    order = [g.replica for g in groups if g.replica in by_name]
    index = indexer(spec.workload.kind, spec.workload.name)
    order += sorted(by_name.keys() - set(order), key=lambda n: (index(n), n))
    renamed = tuple(by_name[n] for n in order)
    if renamed == groups:  # nothing swapped: the status's own tuple, unchanged
        renamed = groups
    return renamed, tuple(g for g in renamed if g.replica in names)


def relabel(
    groups: Sequence[LentGroup], replicas: int, kind: str = STATEFULSET, workload: str = ""
) -> tuple[LentGroup, ...]:
    """Give the groups still lent the names of the replicas still down (indices from
    ``replicas`` on; a LeaderWorkerSet's group member keeps its place in the group): which
    replica lent which group no longer matters once one is back."""
    index = indexer(kind, workload)
    ordered = sorted(groups, key=lambda g: (index(g.replica), g.replica))
    names = [g.replica for g in ordered]
    taken = {n for n in names if index(n) >= replicas}
    stem = workload if in_groups(kind) else _stem(names)
    out = []
    for g in ordered:
        if index(g.replica) >= replicas:
            out.append(g)
            continue
        free = (
            member_name(kind, stem, g.replica, i)
            for i in range(replicas, replicas + 10 * len(names) + 1)
        )
        name = next(n for n in free if n not in taken)
        taken.add(name)
        out.append(LentGroup(name, g.devices))
    return tuple(out)


def _stem(names: Sequence[str]) -> str:
    for n in names:
        if ordinal(n) >= 0:
            return n.rsplit("-", 1)[0]
    return "replica"


def legacy_tags(lease: GpuLease, pods: Sequence[OwnerPod], view: View) -> tuple[TagChange, ...]:
    """Tags written before owners were namespaced (the job's name alone) on devices this
    lease answers for, the devices it lent and those its replicas hold (standby on loan),
    rewritten with its job key, standby flag and replica kept. An upgrade step: what no
    lease names keeps its old tag, which matches no pod's owner and so is no one's own."""
    owner = lease.spec.owner
    job = owner.partition("/")[2]
    get = view.devices.get
    out: dict[GpuUuid, TagChange] = {}
    for u in (*lease.status.lent, *(u for p in pods for u in p.devices)):
        d = get(u)
        if d is not None and d.cls.owner == job and u not in out:
            out[u] = _tag(d, owner, d.cls.standby, d.cls.replica)
    return tuple(out.values())


def decide(
    lease: GpuLease, replicas: int, pods: Sequence[OwnerPod], view: View, now: float
) -> Action:
    spec, status = lease.spec, lease.status
    if status.phase == "Reclaiming":
        return _reclaim(lease, replicas, pods, view, now)
    target = replicas_for(target_gpus(spec.desired_gpus, spec.schedule, now), spec.gpus_per_replica)
    if target > replicas:
        groups, chosen = scale_up_groups(lease, replicas, target, view)
        swapped = [g.replica for g in chosen if g not in status.groups]
        return WriteStatus(
            replace(
                status,
                phase="Reclaiming",
                target_replicas=target,
                groups=groups,
                reclaim_started=now,
                reclaim_deadline=now + spec.grace_s,
                noticed=(),
                reclaiming=tuple(g.replica for g in chosen),
                finalizing=False,
            ),
            f"scale up {replicas} -> {target} replicas: reclaim {len(chosen)} lent group(s)"
            + (
                f"; {', '.join(swapped)} take(s) another group, theirs cannot come back"
                if swapped
                else ""
            ),
        )
    if target < replicas:
        index = indexer(spec.workload.kind, spec.workload.name)
        released = set(replicas_to_release([p.name for p in pods], target, index))
        have = {g.replica for g in status.groups}
        new = tuple(
            LentGroup(
                p.name,
                tuple(
                    d.uuid
                    for d in devices_to_tag(view.devices[u] for u in p.devices if u in view.devices)
                ),
            )
            for p in sorted(pods, key=lambda p: (index(p.name), p.name))
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
        untagged = _retag(status.groups, view, spec.owner)
        if untagged:
            return SetTags(untagged, f"tag {len(untagged)} lent device(s) with owner {spec.owner}")
        loans = [
            view.devices[u]
            for p in pods
            if p.name in released
            for u in p.devices
            if u in view.devices and _on_loan(view.devices[u], spec.owner)
        ]
        if loans:
            return SetTags(
                tuple(_tag(d, None, True) for d in loans),
                f"give {len(loans)} standby device(s) on loan back to the pool",
            )
        if not names_replicas(spec.workload.kind):
            # Its pods are named at random: the ReplicaSet must remove those that lent.
            costs = tuple(
                (p, RELEASE_COST if p.name in released else None)
                for p in pods
                if (p.deletion_cost == RELEASE_COST) != (p.name in released)
            )
            if costs:
                marked = sum(1 for _, c in costs if c is not None)
                return MarkRelease(
                    costs,
                    f"mark {marked} pod(s) whose devices are lent to go first at the scale-down "
                    f"(pod-deletion-cost {RELEASE_COST})",
                )
        return ScaleTo(target)
    if status.phase == "Lending":
        return WriteStatus(replace(status, phase="Steady"), "scaled down; devices lent")
    stale = _retag(status.groups, view, spec.owner)
    if stale:
        return SetTags(stale, f"tag {len(stale)} lent device(s) with the replica that lent them")
    return Wait(now + RESYNC_S, STEADY)


def _replicas_placed(
    pods: Sequence[OwnerPod], index: Callable[[str], int], members: Iterable[str] = ()
) -> int:
    """How many replicas are placed: every pod of theirs bound with its devices (a
    StatefulSet's replica is one pod; a LeaderWorkerSet's, the pods of its group). A replica
    one of whose ``members`` (pods named to come back) does not exist yet is not placed: a
    group's worker is created after its leader, and the group is placed with both."""
    placed: dict[tuple[int, str], bool] = {}
    for p in pods:
        key = replica_unit(p.name, index)
        placed[key] = placed.get(key, True) and bool(p.node and p.devices)
    present = {p.name for p in pods}
    for name in members:
        if name not in present:
            placed[replica_unit(name, index)] = False
    return sum(placed.values())


def overdue(
    lease: GpuLease, pods: Sequence[OwnerPod], now: float, after_s: float
) -> Trouble | None:
    """Why the lease is Degraded, or None: a reclaim ``after_s`` or more past its borrowers'
    notice, with how many of the owner's pods are placed (what it is waiting for)."""
    status = lease.status
    if status.phase != "Reclaiming" or status.reclaim_deadline is None:
        return None
    late = now - status.reclaim_deadline
    if late < after_s:
        return None
    target = status.target_replicas if status.target_replicas is not None else len(pods)
    placed = sum(1 for p in pods if p.node and p.devices)
    return Trouble(
        RECLAIM_OVERDUE,
        f"the reclaim of {', '.join(status.reclaiming) or 'the lent GPUs'} is {late:.0f} s past "
        f"the borrowers' notice; {placed} of {target} owner pod(s) placed",
    )


def _reclaim(
    lease: GpuLease, replicas: int, pods: Sequence[OwnerPod], view: View, now: float
) -> Action:
    spec, status = lease.spec, lease.status
    target = status.target_replicas if status.target_replicas is not None else replicas
    deadline = status.reclaim_deadline if status.reclaim_deadline is not None else now
    started = status.reclaim_started if status.reclaim_started is not None else now
    back = tuple(g for g in status.groups if g.replica in status.reclaiming)
    reclaimed = tuple(u for g in back for u in g.devices)
    if not status.finalizing:
        stale = _retag(status.groups, view, spec.owner)
        if stale:
            return SetTags(stale, f"tag {len(stale)} lent device(s) with the replica taking them")
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
        index = indexer(spec.workload.kind, spec.workload.name)
        returning = (
            [n for n in status.reclaiming if 0 <= index(n) < target]
            if names_replicas(spec.workload.kind)
            else []
        )
        up = _replicas_placed(pods, index, returning)
        if up < target:
            return Wait(now + POD_WAIT_S, f"{up} of {target} replicas placed")
        held = {u for p in placed for u in p.devices}
        lent = set(status.lent)
        backfilled = 0  # standby devices held, but those already on loan to the owner
        get = view.devices.get
        for u in held:
            d = get(u)
            if d is not None and d.cls.standby and d.cls.owner != spec.owner:
                backfilled += 1
        return WriteStatus(
            replace(
                status,
                finalizing=True,
                returned=status.returned + len(held & lent),
                backfilled=status.backfilled + backfilled,
            ),
            f"all {target} replicas placed: {len(held & lent)} lent device(s) came back, "
            f"{backfilled} from standby",
        )
    held = {u for p in pods if p.node for u in p.devices}
    # Back: what the owner holds again. Forgone: reclaimed devices on nodes that are gone. The
    # rest stays lent, even if a new replica took another group than the one reclaimed, or a
    # standby device on loan stands in for it (a failed device stays lent: it comes back once
    # repaired, and its stand-in goes back to the pool).
    gone = {u for u in reclaimed if u not in view.devices}
    lent = set(status.lent)
    done = (held & lent) | gone
    changes = [
        _tag(view.devices[u], None, False)
        for u in sorted(done)
        if u in view.devices and view.devices[u].cls.owner is not None
    ] + [
        _tag(view.devices[u], spec.owner, True)
        for u in sorted(_loans(pods, view, lent))
        if view.devices[u].cls.owner != spec.owner or not view.devices[u].cls.standby
    ]
    if changes:
        return SetTags(
            tuple(changes), "clear the tags of returned devices, mark standby devices on loan"
        )
    still = [
        g
        if done.isdisjoint(g.devices)
        else LentGroup(g.replica, tuple(u for u in g.devices if u not in done))
        for g in status.groups
    ]
    return WriteStatus(
        replace(
            status,
            phase="Steady",
            groups=relabel(
                [g for g in still if g.devices], target, spec.workload.kind, spec.workload.name
            ),
            reclaiming=(),
            reclaim_started=None,
            reclaim_deadline=None,
            noticed=(),
            finalizing=False,
            reclaims=status.reclaims + 1,
            last_reclaim_s=now - started,
        ),
        f"reclaim done in {now - started:.1f} s",
    )
