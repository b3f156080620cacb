"""The three-queue multi-level feedback queue (MLFQ) of the shared queues, with adaptive
thresholds. Pure.

Queue 1 holds interactive jobs, queue 2 batch jobs, queue 3 long-running jobs (against
starvation of the rest). Three thresholds move jobs:

* demote 1 → 2 when an interactive job has run longer than twice the mean interactive
  duration (a batch job mislabelled interactive);
* demote 2 → 3 when a job's executed time in queue 2 reaches twice the mean runtime-to-failure
  (RTTF);
* promote 3 → 2 when a job in queue 3 has waited, stripped of every GPU, twice the mean batch
  duration.

Executed and starved times count from the job's entry into its current queue, so that a
promoted job is not demoted again at once. The thresholds start from the admin's estimates and
are recomputed from the means of the jobs seen, every ``every`` completions (1000 in the paper).
Preemption only ever takes from a lower queue: queue 1 is never preempted.

Reference: cornucopia 4.2 (docs/references.md).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace

from common.jobclasses import JobClass, JobKind


class Queue(enum.IntEnum):
    INTERACTIVE = 1
    BATCH = 2
    LONG = 3


@dataclass(frozen=True, slots=True)
class Thresholds:
    demote_1_s: float  # twice the mean interactive duration
    demote_2_s: float  # twice the mean RTTF
    promote_3_s: float  # twice the mean batch duration

    @classmethod
    def from_means(cls, interactive_s: float, rttf_s: float, batch_s: float) -> Thresholds:
        return cls(2.0 * interactive_s, 2.0 * rttf_s, 2.0 * batch_s)


@dataclass(frozen=True, slots=True)
class Means:
    """Running sums behind the adaptive thresholds."""

    interactive_sum: float = 0.0
    interactive_n: int = 0
    batch_sum: float = 0.0
    batch_n: int = 0
    rttf_sum: float = 0.0
    rttf_n: int = 0
    since_update: int = 0

    def completed(self, cls: JobClass, duration_s: float) -> Means:
        if cls.kind is JobKind.INTERACTIVE:
            return replace(
                self,
                interactive_sum=self.interactive_sum + duration_s,
                interactive_n=self.interactive_n + 1,
                since_update=self.since_update + 1,
            )
        return replace(
            self,
            batch_sum=self.batch_sum + duration_s,
            batch_n=self.batch_n + 1,
            since_update=self.since_update + 1,
        )

    def failed(self, runtime_s: float) -> Means:
        return replace(self, rttf_sum=self.rttf_sum + runtime_s, rttf_n=self.rttf_n + 1)


def adapt(thresholds: Thresholds, means: Means, every: int = 1000) -> tuple[Thresholds, Means]:
    """Recompute the thresholds from the means once ``every`` jobs have completed since the
    last update; a mean with no sample keeps its threshold."""
    if means.since_update < every:
        return thresholds, means
    t = thresholds
    if means.interactive_n:
        t = replace(t, demote_1_s=2.0 * means.interactive_sum / means.interactive_n)
    if means.rttf_n:
        t = replace(t, demote_2_s=2.0 * means.rttf_sum / means.rttf_n)
    if means.batch_n:
        t = replace(t, promote_3_s=2.0 * means.batch_sum / means.batch_n)
    return t, replace(means, since_update=0)


def initial_queue(cls: JobClass) -> Queue:
    return Queue.INTERACTIVE if cls.kind is JobKind.INTERACTIVE else Queue.BATCH


@dataclass(frozen=True, slots=True)
class Move:
    queue: Queue
    reason: str  # "" when the job stays


def requeue(queue: Queue, executed_s: float, starved_s: float, t: Thresholds) -> Move:
    """Where a job goes given its executed time and stripped waiting time in its queue."""
    if queue is Queue.INTERACTIVE and executed_s > t.demote_1_s:
        return Move(Queue.BATCH, f"ran {executed_s:.0f}s > {t.demote_1_s:.0f}s as interactive")
    if queue is Queue.BATCH and executed_s >= t.demote_2_s:
        return Move(Queue.LONG, f"ran {executed_s:.0f}s >= {t.demote_2_s:.0f}s in queue 2")
    if queue is Queue.LONG and starved_s >= t.promote_3_s:
        return Move(Queue.BATCH, f"starved {starved_s:.0f}s >= {t.promote_3_s:.0f}s")
    return Move(queue, "")
