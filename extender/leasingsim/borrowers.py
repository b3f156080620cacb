"""Low-priority jobs (borrowers): their queue, placement, completion, eviction and giving up. Pure.

A borrower is one pod of ``gpus`` GPUs, priority low, pod priority ``tidelease-borrower``. Pending
pods are tried in the order kube-scheduler's queue would (equal priority: the oldest first); a
pod that does not fit does not block smaller ones behind it (each shape of request is tried
until one of it fails). A borrower never preempts (all borrowers have the same pod priority).

An evicted borrower (its devices reclaimed, taken by a preemptor, or failed under it) queues
again with the running time it still needs; a pending borrower gives up after its patience.
"""

from __future__ import annotations

import enum
import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field

from common.model import Holder, PodRequest, PodUid, Priority
from extender.leasingsim.clock import EventQueue, Kind
from extender.leasingsim.scenario import BorrowerJob
from extender.leasingsim.scheduling import Scheduler
from extender.leasingsim.world import SimCluster

NAMESPACE = "borrowers"

Shape = tuple[int, str, int]  # gpus, GPU type ("" for any), min tier


class State(enum.Enum):
    WAITING = 0  # not arrived yet
    PENDING = 1
    RUNNING = 2
    DONE = 3
    GAVE_UP = 4


@dataclass(slots=True)
class Job:
    spec: BorrowerJob
    remaining: int  # minutes of running still needed
    state: State = State.WAITING
    queued_at: int = 0
    started: int = 0
    generation: int = 0  # bumped on every start, eviction and requeue: stale events are ignored
    pod: PodUid = field(default_factory=lambda: PodUid(""))
    on_lent: int = 0  # of its devices, how many carry an owner tag (lent by an online job)


@dataclass(slots=True)
class BorrowerStats:
    arrived: int = 0
    started: int = 0
    finished: int = 0
    gave_up: int = 0
    evicted: int = 0  # pods evicted by reclaims and preemptions
    failed: int = 0  # pods whose device failed under them
    evicted_gpus: int = 0  # GPUs freed by those evictions


class Borrowers:
    def __init__(
        self,
        jobs: Sequence[BorrowerJob],
        world: SimCluster,
        scheduler: Scheduler,
        events: EventQueue,
        pod_priority: int,
    ) -> None:
        self.world = world
        self.scheduler = scheduler
        self.events = events
        self.pod_priority = pod_priority
        order = sorted(range(len(jobs)), key=lambda i: (jobs[i].arrival, i))
        self.jobs = [Job(jobs[i], max(1, jobs[i].duration)) for i in order]
        self._next_arrival = 0
        self._pending: dict[Shape, list[tuple[int, int, int]]] = {}  # heap of (arrival, id, gen)
        self._by_pod: dict[PodUid, int] = {}
        self.stats = BorrowerStats()
        self.requested = 0  # GPUs asked by pending and running borrowers
        self.running = 0  # GPUs held by running borrowers
        self.on_lent = 0  # of those, devices lent by online jobs (owner-tagged)

    # --- arrivals and the queue ---
    def arrive_until(self, minute: int) -> None:
        jobs = self.jobs
        while self._next_arrival < len(jobs) and jobs[self._next_arrival].spec.arrival <= minute:
            job_id = self._next_arrival
            self._next_arrival += 1
            self.stats.arrived += 1
            self.requested += jobs[job_id].spec.gpus
            self._enqueue(job_id, minute)

    def _enqueue(self, job_id: int, minute: int) -> None:
        job = self.jobs[job_id]
        job.state = State.PENDING
        job.queued_at = minute
        job.generation += 1
        s = job.spec
        shape = (s.gpus, s.gpu_type or "", int(s.min_tier))
        heapq.heappush(self._pending.setdefault(shape, []), (s.arrival, job_id, job.generation))
        self.events.push(minute + max(0, s.patience), Kind.ABANDON, job_id, job.generation)

    def schedule(self, minute: int) -> None:
        """One pass over the pending pods, oldest first; a shape that fails is not tried again
        in this pass (nothing frees devices during a pass)."""
        heads: list[tuple[int, int, Shape]] = []
        for shape, heap in self._pending.items():
            self._drop_stale(heap)
            if heap:
                heads.append((heap[0][0], heap[0][1], shape))
        heapq.heapify(heads)
        while heads:
            _, job_id, shape = heapq.heappop(heads)
            heap = self._pending[shape]
            if not self._start(job_id, minute):
                continue  # this shape fits nowhere now
            heapq.heappop(heap)
            self._drop_stale(heap)
            if heap:
                heapq.heappush(heads, (heap[0][0], heap[0][1], shape))

    def _drop_stale(self, heap: list[tuple[int, int, int]]) -> None:
        jobs = self.jobs
        while heap:
            _, job_id, gen = heap[0]
            job = jobs[job_id]
            if job.state is State.PENDING and job.generation == gen:
                return
            heapq.heappop(heap)

    def _start(self, job_id: int, minute: int) -> bool:
        job = self.jobs[job_id]
        s = job.spec
        pod = PodUid(f"b{job_id}-{job.generation}")
        req = PodRequest(
            namespace=NAMESPACE,
            name=f"{s.name}-{job.generation}",
            uid=pod,
            gpus=s.gpus,
            priority=Priority.LOW,
            pod_priority=self.pod_priority,
            min_tier=s.min_tier,
            gpu_type=s.gpu_type,
        )
        placed = self.scheduler.place(req)
        if placed is None:
            return False
        job.state = State.RUNNING
        job.started = minute
        job.generation += 1
        job.pod = pod
        job.on_lent = sum(1 for d in placed.devices if d.cls.owner is not None)
        self._by_pod[pod] = job_id
        self.running += s.gpus
        self.on_lent += job.on_lent
        self.stats.started += 1
        self.events.push(minute + job.remaining, Kind.COMPLETION, job_id, job.generation)
        return True

    # --- events ---
    def complete(self, job_id: int, token: int) -> None:
        job = self.jobs[job_id]
        if job.state is not State.RUNNING or job.generation != token:
            return
        self._stop(job)
        job.state = State.DONE
        self.requested -= job.spec.gpus
        self.stats.finished += 1

    def give_up(self, job_id: int, token: int) -> None:
        job = self.jobs[job_id]
        if job.state is not State.PENDING or job.generation != token:
            return
        job.state = State.GAVE_UP
        self.requested -= job.spec.gpus
        self.stats.gave_up += 1

    def evict(self, holder: Holder, minute: int, *, failed: bool = False) -> None:
        """The pod of a running borrower is gone (evicted, or a device failed under it)."""
        job_id = self._by_pod.get(holder.pod_uid)
        if job_id is None:
            raise KeyError(f"not a running borrower: {holder.key}")
        job = self.jobs[job_id]
        ran = max(0, minute - job.started)
        job.remaining = max(1, job.remaining - ran)
        self._stop(job)
        if failed:
            self.stats.failed += 1
        else:
            self.stats.evicted += 1
            self.stats.evicted_gpus += job.spec.gpus
        self._enqueue(job_id, minute)

    def owns(self, pod: PodUid) -> bool:
        return pod in self._by_pod

    def _stop(self, job: Job) -> None:
        self.world.release(job.pod)
        del self._by_pod[job.pod]
        self.running -= job.spec.gpus
        self.on_lent -= job.on_lent
        job.on_lent = 0
