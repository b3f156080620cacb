"""Right-of-return leasing decisions: an online job lends the GPUs it does not need now and
gets the same devices back when it needs them again. Pure: typed values in, plans out.

On a scale-down the released devices are tagged with the owner and borrowers may use them; on a
scale-up the owner takes them back (borrowers get notice, then are evicted), and where a lent
device cannot come back (failed, its node gone) the standby pool supplies one of the same type
and tier; then the workload is scaled up onto what it holds again.

The leasing controller and the cluster simulator both decide through these functions, so there
is one implementation of every rule:

* :func:`target_gpus` — how many GPUs an online job should hold now (its schedule, or a fixed
  desired count);
* :func:`replicas_to_release` — which replicas go on a scale-down (highest ordinals first, as a
  StatefulSet removes them);
* :func:`devices_to_tag` — the devices those replicas release are tagged with the owner (lent,
  to come back), every one of them but the standby devices they had on loan;
* :func:`can_return`, :func:`group_can_return` — whether a lent device, a lent group, can come
  back now (one rule for the controller, the extender's filter and prewarm);
* :func:`plan_reclaim` — on a scale-up: which lent devices can come back, which borrowers hold
  them (notice, then eviction after the grace period), and how many devices of which type and
  tier the standby pool must backfill for those that cannot;
* :func:`standby_topup` — which free untagged devices rejoin the standby pool so that it holds
  its target per GPU type and tier again; :func:`standby_excess` — which free standby devices
  leave it where it holds more (loans given back add to it); :func:`standby_changes` — both, the
  pool's periodic top-up.

Reference: weflex 3.2 (steps a-e), 3.5 (docs/references.md).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache

from common.model import Device, GpuUuid, Holder, JobKey, Priority, Tier

TypeTier = tuple[str, Tier]  # what a standby device must match: GPU type and tier


@dataclass(frozen=True, slots=True)
class ScheduleEntry:
    minute_of_day: int  # UTC, 0..1439
    gpus: int


def parse_schedule_time(text: str) -> int:
    """``"HH:MM"`` (UTC) as minutes of the day; ValueError when malformed."""
    m = re.fullmatch(r"([01]?\d|2[0-3]):([0-5]\d)", text.strip())
    if not m:
        raise ValueError(f"want HH:MM (UTC), got {text!r}")
    return int(m.group(1)) * 60 + int(m.group(2))


def target_gpus(desired: int, schedule: Sequence[ScheduleEntry], now: float) -> int:
    """The GPUs a job should hold at ``now``: the schedule entry in force (the latest at or
    before the time of day, wrapping to yesterday's last), or ``desired`` without a schedule."""
    if not schedule:
        return desired
    t = datetime.fromtimestamp(now, UTC)
    minute = t.hour * 60 + t.minute
    ordered = sorted(schedule, key=lambda e: e.minute_of_day)
    current = ordered[-1]
    for entry in ordered:
        if entry.minute_of_day <= minute:
            current = entry
    return current.gpus


def replicas_for(gpus: int, gpus_per_replica: int) -> int:
    """Replicas holding at most ``gpus`` GPUs (a partial replica cannot run)."""
    return max(0, gpus // max(1, gpus_per_replica))


_ORDINAL = re.compile(r"-(\d+)$")


@lru_cache(maxsize=8192)
def ordinal(pod_name: str) -> int:
    """The replica's ordinal in a StatefulSet pod's name (``web-3``: 3), -1 without one.
    Remembered for the names seen last: the controller and the simulator ask it of the same
    names again and again (sorting pods and lent groups)."""
    m = _ORDINAL.search(pod_name)
    return int(m.group(1)) if m else -1


def replicas_to_release(
    pod_names: Iterable[str], target_replicas: int, index: Callable[[str], int] = ordinal
) -> list[str]:
    """The pods a scale-down to ``target_replicas`` removes: those of the highest replicas, as
    a StatefulSet removes its highest ordinals (``index``: the replica a pod is part of, its
    ordinal by default; a LeaderWorkerSet's group, whose pods go together). Names without an
    index are each a replica of their own and sort first, by name."""
    names = sorted(pod_names, key=lambda n: (index(n), n))
    units = sorted({replica_unit(n, index) for n in names})
    released = set(units[max(0, target_replicas) :])
    return [n for n in names if replica_unit(n, index) in released]


def replica_unit(pod_name: str, index: Callable[[str], int] = ordinal) -> tuple[int, str]:
    """The replica a pod is part of, as a key: its index, or for a name without one the name
    itself (a replica of its own)."""
    i = index(pod_name)
    return (i, pod_name) if i < 0 else (i, "")


def devices_to_tag(released: Iterable[Device]) -> tuple[Device, ...]:
    """Released devices to tag with the owner: all of them, whatever their tier or health, except
    standby devices the replica had on loan from the pool (those go back to the pool).

    The paper's design (weflex 3.5) tags only high- and medium-availability (HA, MA) devices,
    because its pods take devices across nodes. A tidelease replica takes all its GPUs on one
    node, so an untagged device among those it released would be one that borrowers take first
    (they prefer untagged devices) and that nobody evicts at reclaim: the replica could not come
    back to its own devices and would go to whatever is free, of the cluster's average tier
    (with 8-GPU replicas and 6 % LA devices, four replicas in ten). A device that is unhealthy
    when released is tagged too: it comes back once repaired, instead of leaving such a hole.
    The owner keeps its tier mix exactly.
    """
    return tuple(d for d in released if not d.cls.standby)


def can_return(
    owner: JobKey | None,
    dev: Device | None,
    holder: Holder | None,
    offering: Mapping[str, bool],
) -> bool:
    """Whether a lent device can come back to its owner now: it is there (``dev``: None for a
    node gone), healthy, on a node that offers its devices, and free or held by a borrower (a
    low-priority pod, evicted by the reclaim) or by the owner itself. The one rule of the
    leasing controller (:func:`plan_reclaim`, :func:`assign_groups`), the extender's filter and
    prewarm."""
    if dev is None or not dev.cls.healthy or not offering.get(dev.node, False):
        return False
    return holder is None or holder.owner == owner or holder.priority is Priority.LOW


def group_can_return(
    owner: JobKey | None,
    uuids: Iterable[GpuUuid],
    devices: Mapping[GpuUuid, Device],
    holders: Mapping[GpuUuid, Holder],
    offering: Mapping[str, bool],
) -> bool:
    """Whether a lent group comes back whole: every one of its devices can return, all on one
    node (a replica takes all its GPUs on one node)."""
    node: str | None = None
    for u in uuids:
        dev = devices.get(u)
        if dev is None or (node is not None and dev.node != node):
            return False
        if not can_return(owner, dev, holders.get(u), offering):
            return False
        node = dev.node
    return node is not None  # not an empty group


@dataclass(frozen=True, slots=True)
class ReclaimPlan:
    returnable: tuple[Device, ...]  # lent devices that can come back
    lost: tuple[Device, ...]  # lent devices that cannot (unhealthy, node gone or silent)
    borrowers: tuple[Holder, ...]  # pods to notify, then evict after the grace period
    blocked_by: tuple[Holder, ...]  # non-borrowers holding lent devices (never evicted)
    backfill: Mapping[TypeTier, int]  # standby devices needed, by type and tier

    @property
    def complete(self) -> bool:
        """Whether every lent device comes back (no standby needed)."""
        return not self.lost and not self.blocked_by


def plan_reclaim(
    owner: JobKey,
    lent: Sequence[GpuUuid],
    devices: Mapping[GpuUuid, Device],
    holders: Mapping[GpuUuid, Holder],
    offering: Mapping[str, bool],
) -> ReclaimPlan:
    """What a scale-up of ``owner`` does with its lent devices.

    ``devices``: the current view of every device by UUID (a lent device missing from it is on
    a node that is gone); ``holders``: who holds each allocated device; ``offering``: whether
    each node's devices are offered at all (inventory present, agent alive).
    """
    returnable: list[Device] = []
    lost_types: Counter[TypeTier] = Counter()
    lost: list[Device] = []
    borrowers: dict[str, Holder] = {}
    blocked: dict[str, Holder] = {}
    for uuid in lent:
        dev = devices.get(uuid)
        if dev is None:
            continue  # node gone: its type and tier are unknown now; counted by the caller
        holder = holders.get(uuid)
        if can_return(owner, dev, holder, offering):
            if holder is not None and holder.owner != owner:
                borrowers[holder.key] = holder
            returnable.append(dev)
        elif holder is not None and holder.owner != owner and dev.cls.healthy:
            if offering.get(dev.node, False):
                blocked[holder.key] = holder
            else:
                lost.append(dev)
            lost_types[(dev.gpu_type, dev.tier)] += 1
        else:
            lost.append(dev)
            lost_types[(dev.gpu_type, dev.tier)] += 1
    # A borrower gang is evicted whole (common.gangs): its members elsewhere go with the one
    # on a lent device, with the same notice, or they would hold their GPUs doing nothing.
    gangs = {h.gang for h in borrowers.values() if h.gang is not None}
    if gangs:
        for holder in holders.values():
            if holder.gang in gangs and holder.owner != owner and holder.priority is Priority.LOW:
                borrowers.setdefault(holder.key, holder)
    return ReclaimPlan(
        returnable=tuple(returnable),
        lost=tuple(lost),
        borrowers=tuple(borrowers.values()),
        blocked_by=tuple(blocked.values()),
        backfill=dict(lost_types),
    )


def standby_topup(
    free_untagged: Iterable[Device],
    pool: Mapping[TypeTier, int],
    targets: Mapping[TypeTier, int],
    standby: Iterable[Device] = (),
) -> tuple[Device, ...]:
    """Free, healthy, untagged devices to add to the standby pool, per type and tier, until it
    holds its target again.

    Whole nodes first: a replica takes all its GPUs on one node, so standby devices scattered
    one per node could stand in for nothing larger than a one-GPU pod (and a standby node is
    easier to prewarm). Nodes are taken in order of how many of their devices would be standby
    with every free one added (``standby``: the pool's current devices), then by node and
    index, so the choice is deterministic.
    """
    by_key: dict[TypeTier, list[Device]] = {}
    per_node: Counter[str] = Counter(d.node for d in standby)
    for d in free_untagged:
        if d.cls.healthy and d.cls.owner is None and not d.cls.standby:
            by_key.setdefault((d.gpu_type, d.tier), []).append(d)
            per_node[d.node] += 1
    chosen: list[Device] = []
    for key, target in sorted(targets.items(), key=lambda kv: (kv[0][0], int(kv[0][1]))):
        missing = target - pool.get(key, 0)
        if missing <= 0:
            continue
        candidates = by_key.get(key, [])
        candidates.sort(key=lambda d: (-per_node[d.node], d.node, d.index))
        chosen.extend(candidates[:missing])
    return tuple(chosen)


def standby_excess(
    free_standby: Iterable[Device],
    pool: Mapping[TypeTier, int],
    targets: Mapping[TypeTier, int],
) -> tuple[Device, ...]:
    """Free standby devices to give back to the platform where the pool holds more than its
    target for their type and tier (devices a stand-in replica held on loan join the pool when
    it is released). Nodes with the fewest standby devices go first, keeping whole standby
    nodes; then by node and index."""
    by_key: dict[TypeTier, list[Device]] = {}
    per_node: Counter[str] = Counter()
    for d in free_standby:
        if d.cls.standby and d.cls.owner is None:
            by_key.setdefault((d.gpu_type, d.tier), []).append(d)
            per_node[d.node] += 1
    chosen: list[Device] = []
    for key in sorted(by_key, key=lambda k: (k[0], int(k[1]))):
        extra = pool.get(key, 0) - targets.get(key, 0)
        if extra <= 0:
            continue
        candidates = sorted(by_key[key], key=lambda d: (per_node[d.node], d.node, d.index))
        chosen.extend(candidates[:extra])
    return tuple(chosen)


@dataclass(frozen=True, slots=True)
class StandbyChanges:
    """What the standby pool's top-up changes."""

    leave: tuple[Device, ...]  # free standby devices beyond a target, given back to the platform
    join: tuple[Device, ...]  # free untagged devices added where the pool is short of a target


def standby_changes(
    pool: Mapping[TypeTier, int],
    targets: Mapping[TypeTier, int],
    free_standby: Iterable[Device],
    free: Iterable[Device],
    standby: Iterable[Device],
) -> StandbyChanges:
    """The standby pool's periodic top-up (released GPUs rejoin the pool; weflex 3.5): free
    standby devices beyond a target (loans given back) leave it (:func:`standby_excess`), free
    untagged devices join it where it is short (:func:`standby_topup`, whole nodes first), both
    judged on ``pool`` as it is (healthy standby devices, on loan or not, by type and tier).

    ``free_standby``: the free healthy standby devices; ``free``: the other free devices;
    ``standby``: every standby device. Each is read only when needed (``free_standby`` only
    where the pool holds more than a target, ``free`` and ``standby`` only where it holds less),
    so a caller may pass generators that gather them. The leasing controller's top-up and the
    cluster simulator's both decide here."""
    over = any(n > targets.get(key, 0) for key, n in pool.items())
    short = any(pool.get(key, 0) < n for key, n in targets.items())
    return StandbyChanges(
        leave=standby_excess(free_standby, pool, targets) if over else (),
        join=standby_topup(free, pool, targets, standby) if short else (),
    )
