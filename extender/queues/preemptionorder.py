"""The order in which a job of a higher queue takes GPUs from jobs of lower queues (scaling-aware
partial preemption), on GPU counts. Pure.

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
jobs), :func:`eviction_cost` compares sets of victims; the preempt verb applies the same order
to one node's devices and ledger (:mod:`extender.scheduler.partialpreemption`); the default
choice of victims, by right of return, is :mod:`extender.scheduler.victims`.

Reference: cornucopia Algorithm 3 (docs/references.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from common.model import (
    Holder,
    JobKey,
    PodUid,
)
from extender.queues.allocation import JobView
from extender.queues.mlfq import Queue


def loss_factor(job: JobView, held: int, taking: int = 1) -> float:
    """Mean scaling factor of the ``taking`` GPUs a job holding ``held`` would lose."""
    if not job.cls.elastic:
        return 1.0
    factors = [job.profile.scaling_factor(h - 1) for h in range(held, held - taking, -1)]
    return sum(factors) / len(factors)


def order_key(job: JobView, held: int, taking: int, tie: str) -> tuple[int, bool, float, int, str]:
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
            return order_key(j, held[j.key], n, j.key)

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


def unknown_job(owner: str) -> JobView:
    # Pods of jobs the planner does not know: a batch job with no profile (S = 1).
    from common.jobclasses import JobClass

    return JobView(key=owner, cls=JobClass(), queue=Queue.BATCH, request=1)


def eviction_cost(
    victims: Sequence[Holder],
    gpus: Mapping[PodUid, int],
    jobs: Mapping[JobKey, JobView],
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
        job = jobs.get(JobKey(key)) or unknown_job(key)
        held = max(job.held, n)
        top = min(top, int(job.queue))
        halts += int(held - n <= 0 or not job.cls.elastic)
        worth += loss_factor(job, held, n) * n if n else 0.0
    return (-top, halts, worth)
