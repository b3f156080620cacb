"""A shared GPU pool with interactive, batch and non-elastic jobs, under three policies. Pure.

* ``cornucopia`` (the shared queues' own policy, named after the paper it follows) — the
  multi-level feedback queue (:mod:`mlfq`: interactive jobs first, long runners demoted,
  starved jobs promoted), greedy allocation (:mod:`allocation`: free GPUs one at a time to the
  job that speeds up most) and scaling-aware partial preemption
  (:mod:`extender.queues.preemptionorder`: GPUs taken one at a time from the job that slows down
  least), with scaling factors from a noisy ramp-up
  profile (:mod:`profiling`); GPUs a job holds beyond its request are the first to go back
  when a job of its queue or a higher one waits;
* ``fifo`` — first come, first served, exactly the GPUs asked for, no backfill, no preemption;
* ``strict priority`` — interactive jobs first, each batch job gets exactly its request (with
  backfill), an interactive job that does not fit evicts whole batch jobs, the latest started
  first; an evicted job queues again and keeps its progress.

Time advances in steps of ``dt_s``; a job with ``g`` GPUs progresses at its true throughput
``T(g)``. A running job whose count changes pauses ``rescale_s``; a job (re)started pauses
``start_s``. Queuing time counts only time without any GPU.

Reference: cornucopia 4.2, Algorithm 2, Algorithm 3, 5.1 (docs/references.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from common.jobclasses import JobClass, JobKind
from extender.queues.allocation import JobView, allocate
from extender.queues.mlfq import Means, Queue, Thresholds, adapt, initial_queue, requeue
from extender.queues.preemptionorder import preempt_counts
from extender.queues.profiling import Profile, profile_from_batches, ramp_up_counts


@dataclass(frozen=True, slots=True)
class JobSpec:
    key: str
    cls: JobClass
    arrival_s: float
    request: int
    duration_s: float  # at its request
    serial: float  # Amdahl serial fraction: 0 is linear scaling

    def throughput(self, gpus: int) -> float:
        if gpus <= 0:
            return 0.0
        return gpus / (1.0 + self.serial * (gpus - 1))

    @property
    def work(self) -> float:
        return self.duration_s * self.throughput(self.request)


def workload(seed: int, *, hours: float = 36.0, rate_per_hour: float = 8.0) -> tuple[JobSpec, ...]:
    """Interactive jobs (short, 1-4 GPUs), batch jobs (hours, 2-16 GPUs, linear or sub-linear),
    one batch job in ten non-elastic; arrivals follow a day-time tide."""
    rng = np.random.default_rng(seed + 11)
    jobs: list[JobSpec] = []
    t = 0.0
    i = 0
    while t < hours * 3600.0:
        hour = (t / 3600.0) % 24
        day = 0.6 + 0.4 * np.sin(np.pi * (hour - 6) / 12) if 6 <= hour <= 18 else 0.6
        t += float(rng.exponential(3600.0 / (rate_per_hour * day)))
        interactive = rng.random() < 0.6
        if interactive:
            cls = JobClass(JobKind.INTERACTIVE)
            request = int(rng.choice([1, 1, 2, 4]))
            duration = float(np.clip(rng.lognormal(np.log(600), 0.7), 60, 3600))
            serial = 0.0
        else:
            cls = JobClass(JobKind.BATCH, elastic=rng.random() >= 0.1)
            request = int(rng.choice([2, 4, 8, 8, 16]))
            duration = float(np.clip(rng.lognormal(np.log(2.5 * 3600), 0.6), 1800, 10 * 3600))
            serial = 0.0 if rng.random() < 0.5 else float(rng.uniform(0.03, 0.25))
        jobs.append(JobSpec(f"j{i:04d}", cls, t, request, duration, serial))
        i += 1
    return tuple(jobs)


def ramp_up_profile(job: JobSpec, rng: np.random.Generator) -> Profile:
    """What the ramp-up profiler measures: 5 batches per count, 1 % noise."""
    if not job.cls.elastic:
        return Profile()
    timed = {
        g: [g / job.throughput(g) * float(rng.normal(1.0, 0.01)) for _ in range(5)]
        for g in ramp_up_counts(job.request)
    }
    return profile_from_batches(timed, per_gpu_batch=1.0)


@dataclass(slots=True)
class _Run:
    spec: JobSpec
    profile: Profile
    queue: Queue
    held: int = 0
    done: float = 0.0
    paused_until: float = 0.0
    queued_s: float = 0.0
    executed_in_queue_s: float = 0.0
    starved_in_queue_s: float = 0.0
    executed_s: float = 0.0
    started_at: float = -1.0
    finished_at: float = -1.0

    def view(self) -> JobView:
        return JobView(
            key=self.spec.key,
            cls=self.spec.cls,
            queue=self.queue,
            request=self.spec.request,
            held=self.held,
            arrival=self.spec.arrival_s,
            profile=self.profile,
        )


@dataclass(frozen=True, slots=True)
class QueueResult:
    policy: str
    interactive_queue_s: float  # mean
    interactive_queue_p95_s: float
    jct_s: float  # mean over all jobs
    batch_jct_s: float
    interactive_jct_s: float
    preemptions: int  # GPU takes (the cornucopia policy) or evictions (strict priority)
    finished: int
    jobs: int
    utilisation: float
    busy: list[float] = field(default_factory=list)  # GPUs in use per sample (every 10 min)


@dataclass(frozen=True, slots=True)
class QueueSettings:
    gpus: int = 64
    dt_s: float = 10.0
    rescale_s: float = 10.0
    start_s: float = 30.0
    horizon_s: float = 6 * 86400.0
    adapt_every: int = 100
    thresholds: Thresholds = field(
        default_factory=lambda: Thresholds(
            demote_1_s=1800.0, demote_2_s=8 * 3600.0, promote_3_s=6 * 3600.0
        )
    )


def simulate_queue(
    policy: str, jobs: tuple[JobSpec, ...], s: QueueSettings, seed: int
) -> QueueResult:
    rng = np.random.default_rng(seed + 23)
    profiles = {j.key: ramp_up_profile(j, rng) for j in jobs}
    pending = list(jobs)
    active: list[_Run] = []
    finished: list[_Run] = []
    thresholds, means = s.thresholds, Means()
    now = 0.0
    takes = 0
    busy: list[float] = []
    used_gpu_s = 0.0
    dirty = False
    while (pending or active) and now < s.horizon_s:
        while pending and pending[0].arrival_s <= now:
            spec = pending.pop(0)
            active.append(_Run(spec, profiles[spec.key], initial_queue(spec.cls)))
            dirty = True
        if policy == "cornucopia":
            for r in active:
                move = requeue(r.queue, r.executed_in_queue_s, r.starved_in_queue_s, thresholds)
                if move.queue is not r.queue:
                    r.queue = move.queue
                    r.executed_in_queue_s = r.starved_in_queue_s = 0.0
                    dirty = True
        if dirty:
            before = {r.spec.key: r.held for r in active}
            takes += _decide(policy, active, s)
            for r in active:
                old = before[r.spec.key]
                if r.held != old and r.held > 0:
                    r.paused_until = now + (s.start_s if old == 0 else s.rescale_s)
                    if r.started_at < 0:
                        r.started_at = now
            dirty = False
        in_use = 0
        for r in list(active):
            in_use += r.held
            if r.held == 0:
                r.queued_s += s.dt_s
                if r.queue is Queue.LONG:
                    r.starved_in_queue_s += s.dt_s
                continue
            r.executed_s += s.dt_s
            r.executed_in_queue_s += s.dt_s
            run_for = max(0.0, min(s.dt_s, now + s.dt_s - r.paused_until))
            r.done += r.spec.throughput(r.held) * run_for
            if r.done >= r.spec.work:
                r.finished_at = now + s.dt_s
                r.held = 0
                active.remove(r)
                finished.append(r)
                means = means.completed(r.spec.cls, r.executed_s)
                thresholds, means = adapt(thresholds, means, s.adapt_every)
                dirty = True
        used_gpu_s += in_use * s.dt_s
        if int(now) % 600 == 0:
            busy.append(float(in_use))
        now += s.dt_s
    inter = [r for r in finished if r.spec.cls.kind is JobKind.INTERACTIVE]
    batch = [r for r in finished if r.spec.cls.kind is JobKind.BATCH]

    def mean(xs: list[float]) -> float:
        return float(np.mean(xs)) if xs else float("nan")

    return QueueResult(
        policy=policy,
        interactive_queue_s=mean([r.queued_s for r in inter]),
        interactive_queue_p95_s=float(np.percentile([r.queued_s for r in inter], 95))
        if inter
        else float("nan"),
        jct_s=mean([r.finished_at - r.spec.arrival_s for r in finished]),
        batch_jct_s=mean([r.finished_at - r.spec.arrival_s for r in batch]),
        interactive_jct_s=mean([r.finished_at - r.spec.arrival_s for r in inter]),
        preemptions=takes,
        finished=len(finished),
        jobs=len(jobs),
        utilisation=used_gpu_s / (s.gpus * max(now, 1.0)),
        busy=busy,
    )


def _decide(policy: str, active: list[_Run], s: QueueSettings) -> int:
    free = s.gpus - sum(r.held for r in active)
    if policy == "fifo":
        for r in sorted(active, key=lambda r: r.spec.arrival_s):
            if r.held:
                continue
            if r.spec.request > free:
                break  # head of line blocks
            r.held = r.spec.request
            free -= r.held
        return 0
    if policy == "strict priority":
        return _strict(active, free)
    return _mlfq_policy(active, free)


def _strict(active: list[_Run], free: int) -> int:
    evictions = 0
    order = sorted(
        active, key=lambda r: (r.spec.cls.kind is not JobKind.INTERACTIVE, r.spec.arrival_s)
    )
    for r in order:
        if r.held:
            continue
        if r.spec.request > free and r.spec.cls.kind is JobKind.INTERACTIVE:
            running = [b for b in active if b.held and b.spec.cls.kind is JobKind.BATCH]
            running.sort(key=lambda b: -b.started_at)
            for b in running:
                if r.spec.request <= free:
                    break
                free += b.held
                b.held = 0
                evictions += 1
        if r.spec.request <= free:
            r.held = r.spec.request
            free -= r.held
    return evictions


def _mlfq_policy(active: list[_Run], free: int) -> int:
    by_key = {r.spec.key: r for r in active}
    taken = 0
    for r in sorted(active, key=lambda r: (int(r.queue), r.spec.arrival_s)):
        need = r.spec.request - r.held
        if need <= 0 or need <= free:
            continue
        if not r.spec.cls.elastic and r.held == 0:
            need = r.spec.request
        short = need - free
        # GPUs held beyond a request go back first (to any job of the same or a higher queue).
        extras = [
            JobView(
                o.spec.key,
                o.spec.cls,
                o.queue,
                o.spec.request,
                o.held - o.spec.request,
                o.spec.arrival_s,
                o.profile,
            )
            for o in active
            if o.queue >= r.queue and o.held > o.spec.request and o is not r
        ]
        for t in preempt_counts(short, Queue.INTERACTIVE, extras):
            by_key[t.key].held -= t.gpus
            free += t.gpus
            short -= t.gpus
            taken += t.gpus
        if short > 0:
            lower = [o.view() for o in active if o.queue > r.queue and o.held > 0]
            for t in preempt_counts(short, r.queue, lower):
                by_key[t.key].held -= t.gpus
                free += t.gpus
                taken += t.gpus
    for g in allocate([r.view() for r in active], free):
        by_key[g.key].held += g.gpus
    return taken


def run_all(seed: int, s: QueueSettings | None = None) -> tuple[QueueResult, ...]:
    settings = s or QueueSettings()
    jobs = workload(seed)
    return tuple(
        simulate_queue(p, jobs, settings, seed) for p in ("cornucopia", "fifo", "strict priority")
    )
