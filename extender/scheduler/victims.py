"""Which pods to evict so a preemptor fits a node: borrowers first, then the fewest. Pure.

Only low-priority tidelease pods with a lower pod priority than the preemptor are ever victims
(high-priority pods are protected, weflex 3.5), and only pods whose devices the preemptor could
use: evicting anyone else frees nothing it may take. Among those, pods borrowing the preemptor's
own lent devices go first (right of return), then other borrowers of lent devices, then the rest
by ascending pod priority; a final pass spares every victim that is not needed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from common.model import (
    Allocation,
    Device,
    DeviceClass,
    GpuUuid,
    Holder,
    PodRequest,
    PodUid,
    Priority,
)
from extender.cluster.state import ClusterState
from extender.scheduler.placement import Verdict, free_counts, own_tag, plan_node, verdict
from extender.scheduler.returning import return_homes

_HELPFUL = (Verdict.USABLE, Verdict.STANDBY)


def may_evict(holder: Holder, req: PodRequest) -> bool:
    """Whether the preemptor may take this holder's devices by eviction."""
    return (
        holder.priority is Priority.LOW
        and holder.pod_priority < req.pod_priority
        and holder.pod_uid != req.uid
    )


def classes_of(alloc: Allocation, by_uuid: dict[GpuUuid, Device]) -> list[DeviceClass]:
    return [by_uuid[u].cls for u in alloc.devices if u in by_uuid]


def borrower_rank(alloc: Allocation, by_uuid: dict[GpuUuid, Device], req: PodRequest) -> int:
    classes = classes_of(alloc, by_uuid)
    if any(own_tag(c, req) for c in classes):
        return 0  # borrowing the preemptor's own lent devices
    return 1 if any(c.owner is not None for c in classes) else 2


def eviction_candidates(
    devices: Sequence[Device],
    allocations: Iterable[Allocation],
    req: PodRequest,
    verdicts: dict[DeviceClass, Verdict] | None = None,
) -> tuple[dict[GpuUuid, Device], list[Allocation]]:
    by_uuid = {d.uuid: d for d in devices}
    known: dict[DeviceClass, Verdict] = {} if verdicts is None else verdicts

    def helps(c: DeviceClass) -> bool:
        v = known.get(c)
        if v is None:
            v = known[c] = verdict(c, req)
        return v in _HELPFUL

    helpful = [
        a
        for a in allocations
        if may_evict(a.holder, req) and any(helps(c) for c in classes_of(a, by_uuid))
    ]
    helpful.sort(
        key=lambda a: (
            borrower_rank(a, by_uuid, req),
            a.holder.pod_priority,
            -len(a.devices),
            a.holder.key,
        )
    )
    return by_uuid, helpful


def choose_victims(
    devices: Sequence[Device], allocations: Sequence[Allocation], req: PodRequest
) -> tuple[Holder, ...] | None:
    """Pods to evict on this node: ``()`` if none is needed, ``None`` if eviction cannot help.
    The preemptor's own reservation here (a bind of it cut off after its ledger write) is its
    own, as the filter counts it."""
    allocated = [u for a in allocations if a.holder.pod_uid != req.uid for u in a.devices]
    base = free_counts(devices, allocated)
    verdicts: dict[DeviceClass, Verdict] = {}  # verdict() is pure in the class, for this pod
    if plan_node(base, req, verdicts).fits:
        return ()
    by_uuid, candidates = eviction_candidates(devices, allocations, req, verdicts)
    classes = [classes_of(a, by_uuid) for a in candidates]
    chosen: list[int] = []  # of the candidates, by position
    counts = Counter(base)  # free once the chosen are gone, kept as they are added
    for i, held in enumerate(classes):
        chosen.append(i)
        counts.update(held)
        if plan_node(counts, req, verdicts).fits:
            break
    else:
        return None
    # Spare every victim the preemptor can do without, least preferred victims first.
    for i in reversed(chosen[:]):
        rest = [j for j in chosen if j != i]
        trial = Counter(base)
        for j in rest:
            trial.update(classes[j])
        if plan_node(trial, req, verdicts).fits:
            chosen = rest
    return tuple(candidates[j].holder for j in chosen)


def freeable(
    allocations: Iterable[Allocation],
    held_classes: Mapping[PodUid, Sequence[DeviceClass]],
    req: PodRequest,
) -> frozenset[tuple[DeviceClass, int]]:
    """Classes of the devices the preemptor could free by eviction, with their counts."""
    counts: Counter[DeviceClass] = Counter()
    for a in allocations:
        if may_evict(a.holder, req):
            counts.update(held_classes.get(a.holder.pod_uid, ()))
    return frozenset(counts.items())


def resolvable_counts(
    free: Mapping[DeviceClass, int],
    freeable: Iterable[tuple[DeviceClass, int]],
    req: PodRequest,
    verdicts: dict[DeviceClass, Verdict] | None = None,
) -> bool:
    """Whether the preemptor fits once every evictable pod is gone (filter's hint)."""
    counts = Counter(free)
    for cls, n in freeable:
        counts[cls] += n
    return plan_node(counts, req, verdicts).fits


def resolvable(
    devices: Sequence[Device], allocations: Sequence[Allocation], req: PodRequest
) -> bool:
    """:func:`resolvable_counts` for a node given as devices and allocations."""
    by_uuid = {d.uuid: d.cls for d in devices}
    held = {a.holder.pod_uid: [by_uuid[u] for u in a.devices if u in by_uuid] for a in allocations}
    allocated = [u for a in allocations for u in a.devices]
    return resolvable_counts(free_counts(devices, allocated), freeable(allocations, held, req), req)


@dataclass(frozen=True, slots=True)
class Proposal:
    """kube-scheduler's proposed victims on one node (their UIDs) and its PDB violation count."""

    victims: tuple[str, ...]
    pdb_violations: int = 0


def victims_cost(
    devices: Sequence[Device],
    allocations: Sequence[Allocation],
    req: PodRequest,
    victims: Sequence[Holder],
) -> tuple[int, int, int]:
    """How bad evicting these victims is (smaller is better): the worst borrower rank among
    them (borrowers of the preemptor's own lent devices first), their number, their priority."""
    by_uuid = {d.uuid: d for d in devices}
    chosen = {h.pod_uid for h in victims}
    ranks = [borrower_rank(a, by_uuid, req) for a in allocations if a.holder.pod_uid in chosen]
    return (max(ranks, default=0), len(victims), sum(h.pod_priority for h in victims))


Chooser = Callable[[Sequence[Device], Sequence[Allocation], PodRequest], tuple[Holder, ...] | None]


def noticed_only(choose: Chooser, noticed: Callable[[Holder], bool]) -> Chooser:
    """``choose``, but no eviction on a node where its victims include a borrower of devices
    that the preemptor's own job lent and that has no reclaim notice (``noticed``): a borrower
    of lent devices goes only after its notice (docs/leasing.md). The leasing controller gives
    the notice to every borrower of a group it takes back before it scales up; a borrower
    without one holds a group the controller is not taking back (its view judged the group
    unable to come back, say its node's agent silent, where the extender's view, a moment
    behind, did not yet): the returning pod then waits, as the filter makes it wait for a group
    still held, instead of evicting the borrower unwarned."""

    def guarded(
        devices: Sequence[Device], allocations: Sequence[Allocation], req: PodRequest
    ) -> tuple[Holder, ...] | None:
        victims = choose(devices, allocations, req)
        if not victims or req.owner is None:
            return victims
        lent = {d.uuid for d in devices if d.cls.owner == req.owner and not d.cls.standby}
        if not lent:
            return victims
        held = {a.holder.pod_uid: a.devices for a in allocations}
        unwarned = (
            v
            for v in victims
            if v.priority is Priority.LOW
            and not lent.isdisjoint(held.get(v.pod_uid, ()))
            and not noticed(v)
        )
        return None if next(unwarned, None) is not None else victims

    return guarded


def preempt_nodes(
    cluster: ClusterState,
    req: PodRequest,
    proposals: Mapping[str, Proposal],
    choose: Chooser = choose_victims,
) -> dict[str, Proposal]:
    """The one candidate node where eviction costs least, with our victims there; ``{}`` when
    eviction cannot help anywhere, or is not needed (no node is returned without victims).

    Only one node is proposed: kube-scheduler picks among the nodes an extender returns by its
    own criteria, which know nothing of lent devices, and would evict elsewhere than the
    borrowers of the preemptor's own devices. The PDB count is kube-scheduler's own when our
    victims are a subset of its proposal (the extender cannot evaluate PodDisruptionBudgets);
    otherwise it is 0. ``choose`` picks the victims on one node (cornucopia's partial
    preemption for pods that opt into it, see extender.queues.preemptionorder).
    """
    answer: dict[str, Proposal] = {}
    costs: dict[str, tuple[int, int, int]] = {}
    homes = return_homes(cluster, req)
    if homes & proposals.keys():
        # A pod taking back lent devices evicts where they are (.returning). Where the filter
        # held it there, kube-scheduler proposes no other node; where it did not (its own
        # filters rejected those nodes), the pod falls back as any reclaim.
        proposals = {n: p for n, p in proposals.items() if n in homes}
    for name, proposal in proposals.items():
        state = cluster.get(name)
        if state is None or not state.offering:
            continue
        allocations = list(state.allocations.values())
        victims = None
        if req.reclaim:
            # As the filter does: a reclaim evicts borrowers before it touches the standby pool.
            victims = choose(state.devices, allocations, replace(req, reclaim=False))
        if victims is None:
            victims = choose(state.devices, allocations, req)
        if not victims:
            # None: eviction cannot help here. Empty: the pod fits our view of the node as it
            # is (a pod kube-scheduler still counts is gone from the ledger, or is being
            # deleted): nothing to evict, and kube-scheduler refuses a node an extender returns
            # without victims ("expected at least one victim pod"), failing the whole
            # preemption; it schedules the pod once its own view has caught up.
            continue
        uids = tuple(h.pod_uid for h in victims)
        pdb = proposal.pdb_violations if set(uids) <= set(proposal.victims) else 0
        answer[name] = Proposal(uids, pdb)
        costs[name] = victims_cost(state.devices, allocations, req, victims)
    if not answer:
        return answer
    best = min(answer, key=lambda n: (answer[n].pdb_violations, costs[n], n))
    return {best: answer[best]}
