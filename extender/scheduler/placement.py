"""Which of a node's free GPUs a pod may take, device by device. Pure functions.

The rule: a device must be healthy, of the pod's GPU type and at least its reliability tier;
untagged devices are open to every pod; a device an online job lent (tagged with that job) is
open to borrowers (low priority) until the job takes it back, and to the job's own pods (a
returning replica: its own lent group only), but not to other high-priority pods; standby
devices are kept for a reclaim whose lent devices cannot come back.

A pod's GPUs all come from one node, so kube-scheduler asks, node by node, whether the pod fits;
the answer here is a :class:`NodePlan`: which classes of devices the pod would take, or why it
cannot. The rule for a single device is :func:`verdict`; :func:`plan_node` applies it to a
node's free devices, summarised as counts per :class:`~common.model.DeviceClass`;
:func:`pick_devices` turns a plan into concrete devices at bind time. Filter, prioritize,
preempt and bind all go through :func:`plan_node`, so they can never disagree.

Topology is a tie-break inside those rules, never a rule of its own: the plan fixes how many
devices of each class a pod takes (type, tier, tags, right of return, standby); where the node
publishes its topology (``GpuNode.status.topology``), the devices of each class are the tightest
group that takes exactly those counts (:func:`common.topology.choose`), and otherwise, as for a
single device, the lowest indexes. A pod's ``tidelease.io/gpu-topology`` narrows where it goes
(:func:`topology_refusal`): it grants nothing.

Where a pod does not fit, handing it the devices there are (a partial allocation, as the
paper's scheduler does for a job) has no meaning for a single pod: the node is rejected with the
reason, and the job-level planner decides what to do with fewer GPUs.

Reference: weflex 3.5, Algorithm 1 (lines 5-13, 19-23, "return Usable") (docs/references.md).
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Hashable, Iterable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any

from common import topology as topo
from common.model import Device, DeviceClass, GpuUuid, PodRequest, Priority
from common.topology import NodeTopology


class Verdict(enum.Enum):
    """What one free device is to one pod. Values are the reasons shown to pod authors."""

    USABLE = "usable"
    STANDBY = "standby (only to backfill a reclaim)"
    UNHEALTHY = "unhealthy"
    WRONG_TYPE = "of another GPU type"
    BELOW_TIER = "below the required reliability tier"
    TAGGED_OTHER = "tagged for another job's right of return"
    TAGGED_REPLICA = "lent by another replica of the job, which takes them back"
    STANDBY_RESERVED = "reserved for reclaims (standby pool)"
    BEING_RECLAIMED = "being taken back by the job that lent them (its reclaim is under way)"
    NOT_LENT = "not lent by an online job (the pod takes lent GPUs only: tidelease.io/lent-only)"


def verdict(cls: DeviceClass, req: PodRequest) -> Verdict:
    """What one device class is to the pod: usable, or why not (the rule in the module's
    docstring; weflex Algorithm 1, lines 5-13, and lines 19-23 for standby devices)."""
    if not cls.healthy:
        return Verdict.UNHEALTHY  # unhealthy devices are never offered
    if req.gpu_type is not None and cls.gpu_type != req.gpu_type:
        return Verdict.WRONG_TYPE
    if cls.tier < req.min_tier:  # line 6: RelMap[g] < ReqRel
        return Verdict.BELOW_TIER
    if cls.standby:  # FETCHSTANDBY: reclaims only, type and tier already matched
        return Verdict.STANDBY if req.reclaim else Verdict.STANDBY_RESERVED
    if cls.owner is None:  # line 8: untagged devices are open to all ...
        return Verdict.NOT_LENT if req.lent_only else Verdict.USABLE  # ... who take them
    if req.priority is Priority.LOW:  # line 10: borrowers may use tagged devices ...
        if cls.owner in req.reclaiming_owners:  # ... but not while their owner takes them back
            return Verdict.BEING_RECLAIMED
        return Verdict.USABLE
    if req.owner == cls.owner:  # line 12: high priority only on its own tags ...
        if not _takes_back(cls.replica, req):
            return Verdict.TAGGED_REPLICA  # ... and a returning pod only on what it takes back
        return Verdict.USABLE
    return Verdict.TAGGED_OTHER


def _takes_back(replica: str | None, req: PodRequest) -> bool:
    """Whether a device of the owner's tagged for ``replica`` is the pod's to take: untagged
    for a replica, or of its own lent group (a StatefulSet replica), or of a group its lease
    takes back (a Deployment's pod); any of the owner's when the pod takes back none."""
    if replica is None:
        return True
    if req.lent_group is not None:
        return replica == req.lent_group
    return not req.lent_groups or replica in req.lent_groups


def own_tag(cls: DeviceClass, req: PodRequest) -> bool:
    """Whether a device of this class is the pod's own to take back: tagged with its job and,
    for a replica returning to its lent group, with that replica (or with no replica)."""
    return cls.owner is not None and cls.owner == req.owner and _takes_back(cls.replica, req)


def placement_shape(req: PodRequest) -> tuple[object, ...]:
    """Everything of a request that :func:`plan_node` depends on, as a cheap hashable key."""
    return (
        req.gpus,
        req.priority.value,
        req.owner,
        int(req.min_tier),
        req.gpu_type,
        req.reclaim,
        req.lent_group,
        req.lent_groups,
        req.reclaiming_owners,
        req.lent_only,
        req.gpu_topology,
    )


def remembered_plans(
    memo: MutableMapping[Hashable, dict[Any, Any]], req: PodRequest
) -> dict[int, NodePlan]:
    """The plans made for this request's placement shape, by free-device state key
    (``NodeState.free_key``): a plan depends on nothing else, so filter and prioritize share
    them, across requests, in the cluster view's memo."""
    return memo.setdefault(("plan", *placement_shape(req)), {})


def preference(cls: DeviceClass, req: PodRequest) -> tuple[int, int, str, str]:
    """Order in which a pod takes usable devices of one type (smaller first).

    The owner takes its own tagged devices first (right of return: the same devices back);
    borrowers take untagged devices before lent ones (fewer evictions at reclaim); then the
    lowest tier that satisfies the requirement (higher tiers stay free for pods that need them);
    standby devices come last, only for a reclaim's shortfall.
    """
    if cls.standby:
        rank = 3
    elif req.priority is Priority.HIGH and own_tag(cls, req):
        rank = 0
    elif cls.owner is None:
        rank = 1
    else:
        rank = 2
    return (rank, int(cls.tier), cls.owner or "", cls.replica or "")


@dataclass(frozen=True, slots=True)
class NodePlan:
    """Whether a pod fits a node's free devices, and which device classes it would take."""

    fits: bool
    take: tuple[tuple[DeviceClass, int], ...] = ()
    usable: int = 0  # usable devices of the chosen (or best) type, standby excluded
    standby_used: int = 0
    reason: str = ""

    @property
    def taken(self) -> int:
        return sum(n for _, n in self.take)


def _reason(req: PodRequest, best_usable: int, blocked: Mapping[Verdict, int]) -> str:
    if not blocked:
        return f"tidelease: node has {best_usable} free GPU(s), pod needs {req.gpus}"
    main = max(blocked.items(), key=lambda kv: (kv[1], kv[0].value))[0]
    return f"tidelease: not enough usable GPUs, free ones are {main.value}"


def plan_node(
    free: Mapping[DeviceClass, int],
    req: PodRequest,
    verdicts: dict[DeviceClass, Verdict] | None = None,
) -> NodePlan:
    """Whether the pod fits on one node's free devices (counts per class), and which it would
    take (weflex Algorithm 1 over one node).

    All devices of a pod come from one GPU type. Among types that fit, the owner prefers the
    type holding its own tagged devices, then the type with the fewest usable devices (packing).
    ``verdicts`` memoises :func:`verdict` across the nodes of one request.
    """
    if req.gpus <= 0:
        return NodePlan(fits=True)
    usable: dict[str, list[DeviceClass]] = {}
    standby: dict[str, list[DeviceClass]] = {}
    blocked: dict[Verdict, int] = {}  # a plain dict: a Counter is slow to build
    for cls, n in free.items():
        if n <= 0:
            continue
        if verdicts is None:
            v = verdict(cls, req)
        else:
            v = verdicts.get(cls)  # type: ignore[assignment]
            if v is None:
                v = verdicts[cls] = verdict(cls, req)
        if v is Verdict.USABLE:
            usable.setdefault(cls.gpu_type, []).append(cls)
        elif v is Verdict.STANDBY:
            standby.setdefault(cls.gpu_type, []).append(cls)
        else:
            blocked[v] = blocked.get(v, 0) + n

    def count(classes: Iterable[DeviceClass]) -> int:
        return sum(free[c] for c in classes)

    best: tuple[tuple[int, int, int, str], str] | None = None
    best_usable = 0
    for gpu_type in usable.keys() | standby.keys():
        n_usable = count(usable.get(gpu_type, ()))
        best_usable = max(best_usable, n_usable)
        n_standby = count(standby.get(gpu_type, ()))
        if n_usable + n_standby < req.gpus:
            continue
        own = sum(free[c] for c in usable.get(gpu_type, ()) if own_tag(c, req))
        shortfall = max(0, req.gpus - n_usable)
        key = (shortfall, -own, n_usable, gpu_type)
        if best is None or key < best[0]:
            best = (key, gpu_type)
    if best is None:
        return NodePlan(fits=False, usable=best_usable, reason=_reason(req, best_usable, blocked))

    gpu_type = best[1]
    classes = sorted(
        usable.get(gpu_type, []) + standby.get(gpu_type, []), key=lambda c: preference(c, req)
    )
    take: list[tuple[DeviceClass, int]] = []
    remaining = req.gpus
    for cls in classes:
        if remaining == 0:
            break
        n = min(free[cls], remaining)
        take.append((cls, n))
        remaining -= n
    standby_used = sum(n for c, n in take if c.standby)
    return NodePlan(
        fits=True,
        take=tuple(take),
        usable=count(usable.get(gpu_type, ())),
        standby_used=standby_used,
    )


def free_counts(devices: Iterable[Device], allocated: Iterable[GpuUuid]) -> Counter[DeviceClass]:
    taken = set(allocated)
    return Counter(d.cls for d in devices if d.uuid not in taken)


def pick_devices(
    devices: Sequence[Device],
    allocated: Iterable[GpuUuid],
    req: PodRequest,
    topology: NodeTopology | None = None,
) -> tuple[NodePlan, tuple[Device, ...]]:
    """The concrete devices for a plan at bind time (PICKGPUS of weflex Algorithm 1): per
    class of the plan, the tightest group on the node's ``topology``, else the lowest indexes
    (:func:`devices_for`). A plan whose devices miss the pod's ``tidelease.io/gpu-topology``
    comes back not fitting, with the reason."""
    taken = set(allocated)
    free = [d for d in devices if d.uuid not in taken]
    plan = plan_node(Counter(d.cls for d in free), req)
    if not plan.fits:
        return plan, ()
    chosen = devices_for(plan, free, topology)
    refusal = topology_refusal(req, [d.index for d in chosen], topology)
    if refusal:
        return NodePlan(fits=False, usable=plan.usable, reason=refusal), ()
    return plan, chosen


def pick_planned(
    plan: NodePlan,
    devices: Sequence[Device],
    allocated: Iterable[GpuUuid],
    topology: NodeTopology | None = None,
) -> tuple[Device, ...]:
    """The concrete devices of a plan that fits, made for these free devices (``devices`` less
    ``allocated``; a plan remembered by free-device state, :func:`remembered_plans`): what
    :func:`pick_devices` picks, without planning again."""
    taken = set(allocated)
    return devices_for(plan, [d for d in devices if d.uuid not in taken], topology)


def devices_for(
    plan: NodePlan, free: Sequence[Device], topology: NodeTopology | None = None
) -> tuple[Device, ...]:
    """The devices of a plan among these free ones: the counts of each class the plan takes,
    the tightest group on ``topology`` (:func:`common.topology.choose`; None: the lowest
    indexes of each class, as for one device), class by class in the plan's order."""
    by_class = [
        (sorted((d for d in free if d.cls == cls), key=lambda d: d.index), n)
        for cls, n in plan.take
    ]
    if topology is None or plan.taken <= 1:
        return tuple(d for devs, n in by_class for d in devs[:n])
    picked = topo.choose(topology, [([d.index for d in devs], n) for devs, n in by_class])
    chosen: list[Device] = []
    for (devs, _), indexes in zip(by_class, picked, strict=True):
        keep = set(indexes)
        chosen.extend(d for d in devs if d.index in keep)
    return tuple(chosen)


def group_for(
    plan: NodePlan, free: Iterable[tuple[int, DeviceClass]], topology: NodeTopology
) -> tuple[int, ...]:
    """The indexes :func:`devices_for` picks, from free devices given as (index, class)
    (``NodeState.free_devices``)."""
    free = list(free)
    wants = [(sorted(i for i, c in free if c == cls), n) for cls, n in plan.take]
    return tuple(i for indexes in topo.choose(topology, wants) for i in indexes)


def topology_refusal(req: PodRequest, chosen: Sequence[int], topology: NodeTopology | None) -> str:
    """Why ``chosen`` (indexes), the tightest devices a plan takes on a node, miss the pod's
    ``tidelease.io/gpu-topology``; "" where they meet it (or the pod asks nothing). The
    tightest group has the tightest loosest link, so no other group of the plan's classes
    meets it (past :data:`common.topology.MAX_GROUPS`, the lowest indexes are what is judged);
    a group of other classes is not looked for: topology never trades a tier or a tag."""
    need = req.gpu_topology
    if need is None or len(chosen) <= 1:
        return ""
    name = topo.REQUIREMENT_NAMES[need]
    if topology is None:
        return f"tidelease: node publishes no GPU topology, the pod requires {name}"
    if topo.within(topology, chosen, need):
        return ""
    return (
        f"tidelease: no {len(chosen)} free GPUs joined by {topo.REQUIREMENT_WORDS[need]} or "
        f"closer on this node (tidelease.io/gpu-topology: {name})"
    )
