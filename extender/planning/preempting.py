"""Cornucopia Algorithm 3: scaling-aware partial preemption, and the preempt-verb hook. Pure.

A job of a higher queue that does not fit takes GPUs one at a time from jobs of lower queues,
each time from the job whose GPU is worth least: the smallest scaling factor of the GPU taken
(sub-linear jobs before linear ones); among equals, the job holding the most GPUs (the paper's
rule for linear jobs). Choices written down here:

* lower queues are emptied first (queue 3 before queue 2), the scaling factor decides within a
  queue; queue 1 is never preempted;
* the factor of a GPU taken from a job holding ``h`` is ``S^(h-1)``, the gain that GPU brought
  (eq. 1); a job's last GPU goes after every other GPU of its queue (taking it halts the job);
* a non-elastic job (S = 1) loses all its GPUs at once.

:func:`preempt_counts` works on GPU counts (the simulator, the leasing controller's view of
jobs); :func:`choose_preemption` works on one node's devices and ledger, with the inputs of
:func:`extender.preemption.choose_victims` plus the planner's view of the jobs, and returns
victims the same way: pods whose eviction lets the preemptor fit, ``()`` when it fits already,
``None`` when eviction cannot help.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from common.model import (
    Allocation,
    Device,
    DeviceClass,
    GpuUuid,
    Holder,
    JobName,
    PodRequest,
    PodUid,
)
from extender.placement import Verdict, free_counts, plan_node, verdict
from extender.planning.allocation import JobView
from extender.planning.mlfq import Queue
from extender.preemption import may_evict


def loss_factor(job: JobView, held: int, taking: int = 1) -> float:
    """Mean scaling factor of the ``taking`` GPUs a job holding ``held`` would lose."""
    if not job.cls.elastic:
        return 1.0
    factors = [job.profile.scaling_factor(h - 1) for h in range(held, held - taking, -1)]
    return sum(factors) / len(factors)


def _order_key(job: JobView, held: int, taking: int, tie: str) -> tuple[int, bool, float, int, str]:
    last = job.cls.elastic and held - taking <= 0
    return (-int(job.queue), last, loss_factor(job, held, taking), -held, tie)


@dataclass(frozen=True, slots=True)
class Take:
    key: str
    gpus: int
    reason: str


def preempt_counts(need: int, preemptor: Queue, jobs: Sequence[JobView]) -> tuple[Take, ...]:
    """Algorithm 3 on counts: GPUs to take, from whom, until ``need`` are freed (or nothing
    more may be taken)."""
    held = {j.key: j.held for j in jobs}
    victims = [j for j in jobs if j.queue > preemptor and j.queue is not Queue.INTERACTIVE]
    taken: dict[str, int] = {}
    reasons: dict[str, str] = {}
    while need > 0:
        able = [j for j in victims if held[j.key] > 0]
        if not able:
            break

        def key(j: JobView) -> tuple[int, bool, float, int, str]:
            n = held[j.key] if not j.cls.elastic else 1
            return _order_key(j, held[j.key], n, j.key)

        j = min(able, key=key)
        n = held[j.key] if not j.cls.elastic else 1
        reasons.setdefault(
            j.key,
            f"queue {int(j.queue)}, {j.cls.label}, S={loss_factor(j, held[j.key], n):.3f}",
        )
        held[j.key] -= n
        taken[j.key] = taken.get(j.key, 0) + n
        need -= n
    return tuple(Take(k, n, reasons[k]) for k, n in taken.items())


@dataclass(frozen=True, slots=True)
class PreemptionDecision:
    victims: tuple[Holder, ...]
    reasons: tuple[str, ...]


def _unknown_job(owner: str) -> JobView:
    # Pods of jobs the planner does not know: a batch job with no profile (S = 1).
    from common.jobclasses import JobClass

    return JobView(key=owner, cls=JobClass(), queue=Queue.BATCH, request=1)


def plan_preemption(
    devices: Sequence[Device],
    allocations: Sequence[Allocation],
    req: PodRequest,
    jobs: Mapping[JobName, JobView],
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
        return known if known is not None else _unknown_job(owner or a.holder.key)

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

    while candidates and not fits(chosen):

        def key(a: Allocation) -> tuple[int, bool, float, int, str]:
            j = job_of(a)
            return _order_key(j, held[j.key], min(len(a.devices), held[j.key]), a.holder.key)

        pick = min(candidates, key=key)
        job = job_of(pick)
        group = (
            [a for a in candidates if job_of(a).key == job.key] if not job.cls.elastic else [pick]
        )
        for a in group:
            n = min(len(a.devices), held[job.key])
            reasons.append(
                f"{a.holder.key}: job {job.key} (queue {int(job.queue)}, {job.cls.label}) "
                f"loses {len(a.devices)} GPU(s) at S={loss_factor(job, held[job.key], n):.3f}"
            )
            held[job.key] -= n
            candidates.remove(a)
            chosen.append(a)
    if not fits(chosen):
        return None
    # Spare victims not needed, the last chosen (most valuable) first; a non-elastic job's pods
    # go together or not at all, so they are spared only as a whole.
    for a in reversed(chosen[:]):
        if a not in chosen:
            continue
        job = job_of(a)
        together = [b for b in chosen if job_of(b).key == job.key] if not job.cls.elastic else [a]
        rest = [b for b in chosen if b not in together]
        if fits(rest):
            chosen = rest
            names = {b.holder.key for b in together}
            reasons = [r for r in reasons if r.split(":", 1)[0] not in names]
    return PreemptionDecision(tuple(a.holder for a in chosen), tuple(reasons))


def choose_preemption(
    devices: Sequence[Device],
    allocations: Sequence[Allocation],
    req: PodRequest,
    jobs: Mapping[JobName, JobView],
    *,
    preemptor: Queue | None = None,
) -> tuple[Holder, ...] | None:
    """The preempt verb's hook: :func:`plan_preemption`'s victims, shaped like
    :func:`extender.preemption.choose_victims`'s answer."""
    decision = plan_preemption(devices, allocations, req, jobs, preemptor=preemptor)
    return None if decision is None else decision.victims


__all__ = [
    "GpuUuid",
    "PreemptionDecision",
    "Take",
    "choose_preemption",
    "eviction_cost",
    "loss_factor",
    "plan_preemption",
    "preempt_counts",
]


def eviction_cost(
    victims: Sequence[Holder],
    gpus: Mapping[PodUid, int],
    jobs: Mapping[JobName, JobView],
) -> tuple[int, int, float]:
    """How bad evicting these pods is, by cornucopia's rule, for comparing choices (smaller is
    better): the most important queue hit (an interactive victim is worse than any number of
    batch ones), then how many jobs it halts (takes their last GPU), then the GPUs' worth
    (their scaling factors summed). ``gpus``: each victim's GPU count."""
    taken: dict[str, int] = {}
    for h in victims:
        key = h.owner or h.key
        taken[key] = taken.get(key, 0) + gpus.get(h.pod_uid, 0)
    top = int(Queue.LONG) + 1
    halts = 0
    worth = 0.0
    for key, n in taken.items():
        job = jobs.get(JobName(key)) or _unknown_job(key)
        held = max(job.held, n)
        top = min(top, int(job.queue))
        halts += int(held - n <= 0 or not job.cls.elastic)
        worth += loss_factor(job, held, n) * n if n else 0.0
    return (-top, halts, worth)
