"""Greedy allocation of free GPUs, interactive jobs first. Pure.

Jobs are visited in priority order (queue 1, 2, 3; first come first within a queue). An interactive
job gets its whole remaining request when it fits, else every free GPU (partial execution; a
non-elastic job waits until its whole request fits). Batch jobs get one GPU at a time, each to the
job of its queue whose current scaling factor (the throughput its next GPU adds, relative to what
its second added) is largest, until no GPU is left. Two choices the paper leaves open, written
down here:

* a job with no GPU has no throughput: its first GPU comes before any job's next one (scaling
  factor +inf), so that waiting jobs start before running ones grow;
* an elastic job grows at most to twice its request, the range the ramp-up profiler measured;
  a non-elastic job gets exactly its request, at once, or nothing.

Reference: cornucopia 4.4, Algorithm 2, eq. 1 (docs/references.md).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from common.jobclasses import JobClass, JobKind
from extender.queues.mlfq import Queue
from extender.queues.profiling import Profile


@dataclass(frozen=True, slots=True)
class JobView:
    """What the allocator and the preemption policy know of a job."""

    key: str
    cls: JobClass
    queue: Queue
    request: int  # GPUs the user asked for
    held: int = 0  # GPUs held now (cluster-wide)
    arrival: float = 0.0  # first come, first served within a queue
    profile: Profile = field(default_factory=Profile)

    @property
    def cap(self) -> int:
        """The most GPUs the allocator gives this job."""
        if not self.cls.elastic or self.cls.kind is JobKind.INTERACTIVE:
            return self.request
        return max(self.request, 2 * self.request)

    def factor_of_next(self, held: int) -> float:
        """Scaling factor of one more GPU at ``held`` (+inf for the first)."""
        if held <= 0:
            return math.inf
        if not self.cls.elastic:
            return 1.0
        return self.profile.scaling_factor(held)


@dataclass(frozen=True, slots=True)
class Grant:
    key: str
    gpus: int  # added to what the job holds
    reason: str


def priority_order(jobs: Sequence[JobView]) -> list[JobView]:
    return sorted(jobs, key=lambda j: (int(j.queue), j.arrival, j.key))


def allocate(jobs: Sequence[JobView], free: int) -> tuple[Grant, ...]:
    """The greedy allocation (cornucopia Algorithm 2) over ``free`` GPUs; one grant per job
    that gets any."""
    ordered = priority_order(jobs)
    held = {j.key: j.held for j in ordered}
    granted: dict[str, int] = {}
    reasons: dict[str, str] = {}
    w = free

    def give(j: JobView, n: int, why: str) -> None:
        nonlocal w
        held[j.key] += n
        granted[j.key] = granted.get(j.key, 0) + n
        reasons.setdefault(j.key, why)
        w -= n

    active = [j for j in ordered if held[j.key] < j.cap]
    while w > 0 and active:
        progressed = False
        for j in list(active):
            if w == 0:
                break
            need = j.cap - held[j.key]
            if need <= 0:
                active.remove(j)
                continue
            if not j.cls.elastic:
                if held[j.key] == 0 and j.request <= w:
                    give(j, j.request, f"{j.cls.label}: whole request of {j.request}")
                    progressed = True
                active.remove(j)  # all or nothing, once per round
                continue
            if j.cls.kind is JobKind.INTERACTIVE:
                n = min(need, w)
                give(j, n, "interactive: request" if n == need else "interactive: partial")
                progressed = True
                if held[j.key] >= j.cap:
                    active.remove(j)
                continue
            peers = [p for p in active if p.queue == j.queue and p.cls.elastic]
            peers = [p for p in peers if p.cls.kind is JobKind.BATCH and held[p.key] < p.cap]
            best = max(p.factor_of_next(held[p.key]) for p in peers)
            if j.factor_of_next(held[j.key]) >= best:
                s = j.factor_of_next(held[j.key])
                give(j, 1, "batch: start" if math.isinf(s) else f"batch: largest S={s:.3f}")
                progressed = True
                if held[j.key] >= j.cap:
                    active.remove(j)
        if not progressed:
            break
    return tuple(Grant(k, n, reasons[k]) for k, n in granted.items())
