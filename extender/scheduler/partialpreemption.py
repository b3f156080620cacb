"""The preempt verb's hook for cornucopia's partial preemption (Algorithm 3) on one node. Pure.

:func:`choose_preemption` works on one node's devices and ledger, with the inputs of
:func:`extender.scheduler.victims.choose_victims` plus the queues' view of the jobs
(:mod:`extender.queues.jobviews`), and returns victims the same way: pods whose eviction lets
the preemptor fit, ``()`` when it fits already, ``None`` when eviction cannot help. The order in
which GPUs are taken is :mod:`extender.queues.preemptionorder`'s, with one rule of tidelease's
within a queue: a gang (common.gangs) is broken last, and its members here go together (its
members on other nodes follow through the gang controller, extender.gangs).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from common.model import Allocation, Device, DeviceClass, Holder, JobKey, PodRequest
from extender.queues.allocation import JobView
from extender.queues.mlfq import Queue
from extender.queues.preemptionorder import loss_factor, order_key, unknown_job
from extender.scheduler.placement import Verdict, free_counts, plan_node, verdict
from extender.scheduler.victims import may_evict


@dataclass(frozen=True, slots=True)
class PreemptionDecision:
    victims: tuple[Holder, ...]
    reasons: tuple[str, ...]


def plan_preemption(
    devices: Sequence[Device],
    allocations: Sequence[Allocation],
    req: PodRequest,
    jobs: Mapping[JobKey, JobView],
    *,
    preemptor: Queue | None = None,
) -> PreemptionDecision | None:
    """Algorithm 3 on one node: victims with the reason each was chosen."""
    by_uuid = {d.uuid: d for d in devices}
    allocated = [u for a in allocations for u in a.devices]
    base = free_counts(devices, allocated)
    if plan_node(base, req).fits:
        return PreemptionDecision((), ())
    if preemptor is None:
        own = jobs.get(req.owner) if req.owner is not None else None
        preemptor = own.queue if own is not None else Queue.BATCH

    def classes(a: Allocation) -> list[DeviceClass]:
        return [by_uuid[u].cls for u in a.devices if u in by_uuid]

    def job_of(a: Allocation) -> JobView:
        owner = a.holder.owner
        known = jobs.get(owner) if owner is not None else None
        return known if known is not None else unknown_job(owner or a.holder.key)

    candidates = [
        a
        for a in allocations
        if may_evict(a.holder, req)
        and job_of(a).queue > preemptor
        and any(verdict(c, req) in (Verdict.USABLE, Verdict.STANDBY) for c in classes(a))
    ]
    held = {job_of(a).key: job_of(a).held or len(a.devices) for a in candidates}
    chosen: list[Allocation] = []
    reasons: list[str] = []

    def fits(victims: Sequence[Allocation]) -> bool:
        counts = Counter(base)
        for a in victims:
            counts.update(classes(a))
        return plan_node(counts, req).fits

    def together(a: Allocation, among: Sequence[Allocation]) -> list[Allocation]:
        """What goes with ``a``: a non-elastic job's pods, a gang's members (common.gangs: a
        gang is useful only whole), or ``a`` alone."""
        job = job_of(a)
        return [
            b
            for b in among
            if b is a
            or (not job.cls.elastic and job_of(b).key == job.key)
            or (a.holder.gang is not None and b.holder.gang == a.holder.gang)
        ]

    while candidates and not fits(chosen):

        def key(a: Allocation) -> tuple[int, bool, bool, float, int, str]:
            # Within a queue, a gang is broken last (issue 36: as few gangs as possible).
            j = job_of(a)
            rest = order_key(j, held[j.key], min(len(a.devices), held[j.key]), a.holder.key)
            return (rest[0], a.holder.gang is not None, *rest[1:])

        pick = min(candidates, key=key)
        group = together(pick, candidates)
        for a in group:
            job = job_of(a)
            n = min(len(a.devices), held[job.key])
            gang = f", gang {a.holder.gang}" if a.holder.gang is not None else ""
            reasons.append(
                f"{a.holder.key}: job {job.key} (queue {int(job.queue)}, {job.cls.label}{gang}) "
                f"loses {len(a.devices)} GPU(s) at S={loss_factor(job, held[job.key], n):.3f}"
            )
            held[job.key] -= n
            candidates.remove(a)
            chosen.append(a)
    if not fits(chosen):
        return None
    # Spare victims not needed, the last chosen (most valuable) first; a non-elastic job's pods
    # and a gang's members go together or not at all, so they are spared only as a whole.
    for a in reversed(chosen[:]):
        if a not in chosen:
            continue
        spared = together(a, chosen)
        rest = [b for b in chosen if b not in spared]
        if fits(rest):
            chosen = rest
            names = {b.holder.key for b in spared}
            reasons = [r for r in reasons if r.split(":", 1)[0] not in names]
    return PreemptionDecision(tuple(a.holder for a in chosen), tuple(reasons))


def choose_preemption(
    devices: Sequence[Device],
    allocations: Sequence[Allocation],
    req: PodRequest,
    jobs: Mapping[JobKey, JobView],
    *,
    preemptor: Queue | None = None,
) -> tuple[Holder, ...] | None:
    """The preempt verb's hook: :func:`plan_preemption`'s victims, shaped like
    :func:`extender.scheduler.victims.choose_victims`'s answer."""
    decision = plan_preemption(devices, allocations, req, jobs, preemptor=preemptor)
    return None if decision is None else decision.victims
