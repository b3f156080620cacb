"""Victims by gang: break as few gangs as possible, then lose as little work as possible. Pure.

A gang's pods are useful only together (common.gangs), so evicting one of them evicts the gang:
every member, on this node and elsewhere, loses its work. On one node the choice is therefore
among *units*: a gang's members here (taken together) or a pod alone. Among the sets of units
whose eviction makes the preemptor fit, the chosen one is the least by, in order:

1. the worst borrower rank among its pods (extender.scheduler.victims: the borrowers of the
   preemptor's own lent devices first, then other borrowers, then the rest; right of return
   comes before everything else);
2. the gangs it breaks;
3. the work it loses: per gang, the work of all its members (wherever they run), per lone pod
   its own (since its last checkpoint, common.gangs.work_lost_s);
4. the pods it evicts, gangs' members elsewhere included;
5. the sum of their pod priorities; then their names, so that the answer is one.

Every component only grows as units are added, so no set containing a fitting set is better
than it: the search looks at sets by size and never extends one that fits. A node holds a few
allocations (eight GPUs: at most eight), so the search is exact; past :data:`EXACT_UNITS` units it
takes the cheapest units one by one, then spares what it can, as the per-pod choice does.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from common.gangs import gang_of, work_lost_s
from common.model import Allocation, Device, DeviceClass, Holder, PodRequest, PodUid
from extender.scheduler.placement import Verdict, free_counts, plan_node
from extender.scheduler.victims import borrower_rank, classes_of, eviction_candidates, may_evict

EXACT_UNITS = 12


@dataclass(frozen=True, slots=True)
class EvictionCosts:
    """What evicting pods costs beyond this node's view: per pod, the work it loses (seconds);
    per gang, its members in the cluster and the work they lose together."""

    lost_s: Mapping[PodUid, float]
    gang_members: Mapping[str, int]
    gang_lost_s: Mapping[str, float]


@dataclass(frozen=True, slots=True)
class Unit:
    """Pods of this node evicted together: a gang's members here, or one pod alone."""

    holders: tuple[Holder, ...]
    classes: tuple[DeviceClass, ...]  # of all their devices here
    rank: int
    gang: str | None
    lost_s: float
    pods: int  # evicted with it, in the whole cluster
    priority: int

    @property
    def name(self) -> str:
        return self.gang or self.holders[0].key


Cost = tuple[int, int, float, int, int, tuple[str, ...]]
Fits = Callable[[Sequence["Unit"]], bool]


def cost_of(units: Sequence[Unit]) -> Cost:
    """The order of the module docstring (smaller is better)."""
    return (
        max((u.rank for u in units), default=0),
        sum(1 for u in units if u.gang is not None),
        sum(u.lost_s for u in units),
        sum(u.pods for u in units),
        sum(u.priority for u in units),
        tuple(sorted(u.name for u in units)),
    )


def units_of(
    devices: Sequence[Device],
    allocations: Sequence[Allocation],
    req: PodRequest,
    costs: EvictionCosts,
    verdicts: dict[DeviceClass, Verdict] | None = None,
) -> list[Unit]:
    """The node's candidate units: a gang is one when every member here may be evicted and one
    of them holds devices the preemptor could use; a lone pod as the per-pod choice has it."""
    by_uuid, helpful = eviction_candidates(devices, allocations, req, verdicts)
    helpful_uids = {a.holder.pod_uid for a in helpful}
    evictable = {a.holder.pod_uid for a in allocations if may_evict(a.holder, req)}
    groups: dict[str, list[Allocation]] = {}
    out: list[Unit] = []
    for a in allocations:
        if a.holder.gang is not None and a.holder.pod_uid != req.uid:
            groups.setdefault(a.holder.gang, []).append(a)
    for gang, members in sorted(groups.items()):
        if not any(a.holder.pod_uid in helpful_uids for a in members):
            continue
        if not all(a.holder.pod_uid in evictable for a in members):
            continue
        out.append(
            Unit(
                holders=tuple(a.holder for a in members),
                classes=tuple(c for a in members for c in classes_of(a, by_uuid)),
                rank=max(borrower_rank(a, by_uuid, req) for a in members),
                gang=gang,
                lost_s=costs.gang_lost_s.get(
                    gang, sum(costs.lost_s.get(a.holder.pod_uid, 0.0) for a in members)
                ),
                pods=max(costs.gang_members.get(gang, 0), len(members)),
                priority=sum(a.holder.pod_priority for a in members),
            )
        )
    for a in helpful:
        if a.holder.gang is None:
            out.append(
                Unit(
                    holders=(a.holder,),
                    classes=tuple(classes_of(a, by_uuid)),
                    rank=borrower_rank(a, by_uuid, req),
                    gang=None,
                    lost_s=costs.lost_s.get(a.holder.pod_uid, 0.0),
                    pods=1,
                    priority=a.holder.pod_priority,
                )
            )
    return out


def eviction_costs(pods: Iterable[Mapping[str, Any]], now: float) -> EvictionCosts:
    """Every pod's work lost if evicted ``now``, and every gang's members and work lost
    together, from the pods (finished ones left out: they lose nothing, and are no member)."""
    lost: dict[PodUid, float] = {}
    members: Counter[str] = Counter()
    gang_lost: dict[str, float] = {}
    for pod in pods:
        uid = (pod.get("metadata") or {}).get("uid")
        if not isinstance(uid, str) or (pod.get("status") or {}).get("phase") in _FINISHED:
            continue
        seconds = work_lost_s(pod, now)
        lost[PodUid(uid)] = seconds
        gang = gang_of(pod)
        if gang is not None:
            members[gang] += 1
            gang_lost[gang] = gang_lost.get(gang, 0.0) + seconds
    return EvictionCosts(lost, members, gang_lost)


_FINISHED = ("Succeeded", "Failed")


def choose_gang_victims(
    devices: Sequence[Device],
    allocations: Sequence[Allocation],
    req: PodRequest,
    costs: EvictionCosts,
) -> tuple[Holder, ...] | None:
    """Pods to evict on this node (every member here of each gang chosen): ``()`` if none is
    needed, ``None`` if eviction cannot help. Members elsewhere go with them: the caller's."""
    allocated = [u for a in allocations if a.holder.pod_uid != req.uid for u in a.devices]
    base = free_counts(devices, allocated)
    verdicts: dict[DeviceClass, Verdict] = {}
    if plan_node(base, req, verdicts).fits:
        return ()
    units = units_of(devices, allocations, req, costs, verdicts)

    def fits(chosen: Sequence[Unit]) -> bool:
        counts = Counter(base)
        for u in chosen:
            counts.update(u.classes)
        return plan_node(counts, req, verdicts).fits

    if not fits(units):
        return None
    best = _exact(units, fits) if len(units) <= EXACT_UNITS else _greedy(units, fits)
    return tuple(h for u in best for h in u.holders)


def _exact(units: Sequence[Unit], fits: Fits) -> list[Unit]:
    fitting: list[int] = []  # bit masks of the sets found to fit
    best: list[Unit] | None = None
    best_cost: Cost | None = None
    n = len(units)
    for size in range(1, n + 1):
        for combo in itertools.combinations(range(n), size):
            mask = sum(1 << i for i in combo)
            if any(f & mask == f for f in fitting):
                continue  # contains a fitting set: never better than it
            chosen = [units[i] for i in combo]
            if not fits(chosen):
                continue
            fitting.append(mask)
            c = cost_of(chosen)
            if best_cost is None or c < best_cost:
                best, best_cost = chosen, c
    assert best is not None  # every unit together fits
    return best


def _greedy(units: Sequence[Unit], fits: Fits) -> list[Unit]:
    ordered = sorted(units, key=lambda u: cost_of([u]))
    chosen: list[Unit] = []
    for u in ordered:
        chosen.append(u)
        if fits(chosen):
            break
    for u in reversed(chosen[:]):
        rest = [v for v in chosen if v is not u]
        if fits(rest):
            chosen = rest
    return chosen
