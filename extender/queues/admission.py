"""The shared queues' multi-level feedback queue (MLFQ) as live admission: which gated pods to
release, and how jobs move between queues as they run, starve and complete. Pure;
extender.queues.controller does the I/O.

A GPU pod that declares ``tidelease.io/job-class`` is created with the scheduling gate
``tidelease.io/queue`` (docs/planner.md, "Shared queues live"): kube-scheduler leaves it alone
until the queues controller removes the gate. The controller keeps a book of the jobs it has
seen (:class:`Book`, stored in a ConfigMap so that a restart keeps it):

* a job enters the queue of its class (interactive: 1, batch: 2);
* every pass adds the time since the last to the job's *executed* time while it holds GPUs,
  and to its *starved* time while it holds none and has pods waiting (queuing time counts only
  when a job is stripped of every GPU);
* :func:`extender.queues.mlfq.requeue` moves it: demoted 1 -> 2 and 2 -> 3 by executed time,
  promoted 3 -> 2 by starved time; both counters restart in the new queue;
* a job whose pods all ended, one at least successfully, completed: its duration (first start
  to last end) joins the means by its class; a failed pod's running time joins the runtime to
  failure; every ``adapt_every`` completions the thresholds are recomputed from the means
  (:func:`extender.queues.mlfq.adapt`).

Release order (:func:`release`): queue 1, 2, 3; within a queue, the job that entered it first, then
the pod created first. Interactive pods are released at once: when they do not fit, kube-scheduler's
preemption through the extender's preempt verb takes GPUs from the batch job worth least (the one
whose throughput suffers least). Pods of queues 2 and 3 are released only when they fit
(extender.queues.fitting: one node they may use with their GPUs free, less those of pods released
and not yet placed), in order; one that does not fit keeps the nodes it may use from every later
pod, so a large job at the head is not overtaken by smaller ones forever: starvation is bounded by
the head of line and by the promotion from queue 3.

Reference: cornucopia 4.2, Algorithm 3 (docs/references.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from common import contract
from common.jobclasses import JobClass, JobKind, job_class
from common.podrequest import gpu_count
from common.queuerelease import release_problem
from common.timefmt import epoch
from extender.queues.fitting import Capacity, Constraints, constraints
from extender.queues.jobviews import job_key
from extender.queues.mlfq import Means, Queue, Thresholds, adapt, initial_queue, requeue


@dataclass(frozen=True, slots=True)
class Entry:
    """A job in the book: its queue, when it entered it, and its counters there."""

    kind: JobKind
    queue: Queue
    since: float
    executed_s: float = 0.0
    starved_s: float = 0.0
    done: bool = False  # completed and counted; dropped once its pods are gone
    seen: float | None = None  # when a pod of it was last there (None: at ``since``)


@dataclass(frozen=True, slots=True)
class Book:
    jobs: Mapping[str, Entry]
    thresholds: Thresholds
    means: Means = field(default_factory=Means)
    failures: frozenset[str] = frozenset()  # UIDs of failed pods already counted
    updated: float | None = None  # when the counters were last advanced

    def queue_of(self, job: str, cls: JobClass) -> Queue:
        entry = self.jobs.get(job)
        return entry.queue if entry is not None else initial_queue(cls)


@dataclass(frozen=True, slots=True)
class PodObs:
    """One GPU pod of a job that declared its class, as observed."""

    namespace: str
    name: str
    uid: str
    gpus: int
    created: float
    # Waits for the queues: carries the queue gate or, with a release key, has no valid release
    # proof (its gate removed by another, or never set: the extender does not place it).
    gated: bool
    bound: bool  # placed on a node
    phase: str  # Pending | Running | Succeeded | Failed
    started: float | None = None
    finished: float | None = None
    constraints: Constraints = field(default_factory=Constraints)


@dataclass(frozen=True, slots=True)
class JobObs:
    key: str
    cls: JobClass
    pods: tuple[PodObs, ...]

    @property
    def holding(self) -> bool:
        return any(p.bound and p.phase not in ("Succeeded", "Failed") for p in self.pods)

    @property
    def waiting(self) -> bool:
        return any(not p.bound and p.phase == "Pending" for p in self.pods)

    @property
    def completed(self) -> bool:
        phases = {p.phase for p in self.pods}
        return bool(self.pods) and phases <= {"Succeeded", "Failed"} and "Succeeded" in phases


@dataclass(frozen=True, slots=True)
class Move:
    job: str
    old: Queue
    new: Queue
    reason: str


# A job none of whose pods has been there for this long is forgotten. Until then its entry stays
# as it was: a workload re-creating its pods (an eviction, a rollout) finds its queue again.
FORGET_AFTER_S = 3600.0


def advance(
    book: Book, jobs: Mapping[str, JobObs], now: float, *, adapt_every: int
) -> tuple[Book, list[Move]]:
    """The book after a pass at ``now``: counters advanced by the time since the last pass,
    jobs moved, completions and failures counted, thresholds adapted; the moves made."""
    dt = max(0.0, now - book.updated) if book.updated is not None else 0.0
    means, failures, moves = book.means, set(), []
    entries: dict[str, Entry] = {
        key: e
        for key, e in book.jobs.items()
        if key not in jobs and not e.done and now - (e.seen or e.since) < FORGET_AFTER_S
    }
    for key, job in jobs.items():
        entry = book.jobs.get(key) or Entry(job.cls.kind, initial_queue(job.cls), now)
        entry = replace(entry, seen=now)
        for p in job.pods:
            if p.phase == "Failed":
                failures.add(p.uid)
                if p.uid not in book.failures and p.started is not None:
                    means = means.failed(max(0.0, (p.finished or now) - p.started))
        if entry.done:
            entries[key] = entry
            continue
        if job.completed:
            starts = [p.started for p in job.pods if p.started is not None]
            ends = [p.finished for p in job.pods if p.finished is not None]
            if starts:
                means = means.completed(job.cls, max(ends or [now]) - min(starts))
            entries[key] = replace(entry, done=True)
            continue
        if job.holding:
            entry = replace(entry, executed_s=entry.executed_s + dt)
        elif job.waiting:
            entry = replace(entry, starved_s=entry.starved_s + dt)
        move = requeue(entry.queue, entry.executed_s, entry.starved_s, book.thresholds)
        if move.queue is not entry.queue:
            moves.append(Move(key, entry.queue, move.queue, move.reason))
            entry = Entry(entry.kind, move.queue, now, seen=now)
        entries[key] = entry
    thresholds, means = adapt(book.thresholds, means, adapt_every)
    # Failed pods stay counted while they are there to see; gone, they are forgotten.
    return Book(entries, thresholds, means, frozenset(failures), now), moves


@dataclass(frozen=True, slots=True)
class Release:
    namespace: str
    name: str
    job: str
    queue: Queue
    gpus: int


def release(jobs: Mapping[str, JobObs], book: Book, capacity: Capacity) -> list[Release]:
    """The gated pods to release now, in order (module docstring): every interactive one;
    then those of queues 2 and 3 that fit in ``capacity`` (extender.queues.fitting: GPUs of
    released pods not yet in the ledgers already taken), each taking its GPUs. One that does not
    fit keeps the nodes it may use for itself: no later pod is fitted there (so a large pod at
    the head is not overtaken forever), while pods held to other nodes go on."""
    waiting = [
        (book.queue_of(key, job.cls), entry_since(book, key, pod), pod, key)
        for key, job in jobs.items()
        for pod in job.pods
        if pod.gated
    ]
    waiting.sort(key=lambda w: (int(w[0]), w[1], w[2].created, w[2].namespace, w[2].name))
    out = []
    reserved: set[str] = set()
    for queue, _, pod, key in waiting:
        if queue is Queue.INTERACTIVE:
            capacity.fit(pod.constraints, pod.gpus)
            out.append(Release(pod.namespace, pod.name, key, queue, pod.gpus))
            continue
        if capacity.fit(pod.constraints, pod.gpus, excluded=reserved) is None:
            reserved |= capacity.eligible_nodes(pod.constraints)
            continue
        out.append(Release(pod.namespace, pod.name, key, queue, pod.gpus))
    return out


def entry_since(book: Book, key: str, pod: PodObs) -> float:
    """When the pod's job entered its queue (a job not yet in the book: its pod's creation)."""
    entry = book.jobs.get(key)
    return entry.since if entry is not None else pod.created


# --- the book as stored (a ConfigMap's data) ---


def thresholds_to_json(t: Thresholds) -> dict[str, float]:
    return {
        "demote1Seconds": t.demote_1_s,
        "demote2Seconds": t.demote_2_s,
        "promote3Seconds": t.promote_3_s,
    }


def thresholds_from_json(t: Mapping[str, Any]) -> Thresholds:
    return Thresholds(
        float(t["demote1Seconds"]), float(t["demote2Seconds"]), float(t["promote3Seconds"])
    )


def book_to_json(book: Book, configured: Thresholds) -> dict[str, Any]:
    """The book as stored, with the thresholds the admin configured when it was written (so a
    later change of the setting is told from an adaptation: :func:`book_from_json`)."""
    m = book.means
    return {
        "thresholds": thresholds_to_json(book.thresholds),
        "configured": thresholds_to_json(configured),
        "means": {
            "interactiveSum": m.interactive_sum,
            "interactiveCount": m.interactive_n,
            "batchSum": m.batch_sum,
            "batchCount": m.batch_n,
            "rttfSum": m.rttf_sum,
            "rttfCount": m.rttf_n,
            "sinceUpdate": m.since_update,
        },
        "failures": sorted(book.failures),
        "updated": book.updated,
        "jobs": {
            key: {
                "kind": e.kind.value,
                "queue": int(e.queue),
                "since": e.since,
                "executedSeconds": e.executed_s,
                "starvedSeconds": e.starved_s,
                "done": e.done,
                "seen": e.seen,
            }
            for key, e in sorted(book.jobs.items())
        },
    }


def book_from_json(data: Mapping[str, Any], configured: Thresholds) -> Book:
    """The stored book; what cannot be read falls back to an empty book with ``configured``.

    Its thresholds are the stored ones (adapted from completions) while the admin's setting is
    the one it was written under; once the setting changed (or the book does not say under
    which it was written), the setting holds until the next adaptation: a changed setting takes
    effect on the controllers' restart, as a setting should. The jobs and means are kept."""
    try:
        m = data["means"]
        stored = thresholds_from_json(data["thresholds"])
        written_under = data.get("configured")
        same = isinstance(written_under, Mapping) and thresholds_from_json(written_under) == (
            configured
        )
        jobs = {
            str(k): Entry(
                JobKind(v["kind"]),
                Queue(int(v["queue"])),
                float(v["since"]),
                float(v["executedSeconds"]),
                float(v["starvedSeconds"]),
                bool(v.get("done", False)),
                float(v["seen"]) if v.get("seen") is not None else None,
            )
            for k, v in (data.get("jobs") or {}).items()
        }
        updated = data.get("updated")
        return Book(
            jobs,
            stored if same else configured,
            Means(
                float(m["interactiveSum"]),
                int(m["interactiveCount"]),
                float(m["batchSum"]),
                int(m["batchCount"]),
                float(m["rttfSum"]),
                int(m["rttfCount"]),
                int(m["sinceUpdate"]),
            ),
            frozenset(str(u) for u in data.get("failures") or []),
            float(updated) if updated is not None else None,
        )
    except (KeyError, TypeError, ValueError):
        return Book({}, configured)


# --- what the pods say ---


def gate_index(pod: Mapping[str, Any]) -> int | None:
    """Where the queue gate is in the pod's scheduling gates, or None."""
    gates = (pod.get("spec") or {}).get("schedulingGates") or []
    return next(
        (
            i
            for i, g in enumerate(gates)
            if isinstance(g, dict) and g.get("name") == contract.SCHEDULING_GATE
        ),
        None,
    )


def gated(pod: Mapping[str, Any]) -> bool:
    return gate_index(pod) is not None


def waits_for_proof(pod: Mapping[str, Any], key: bytes | None) -> bool:
    """Whether an ungated pod waits all the same: pending, unplaced, and without a valid release
    proof (its gate removed by someone else than the queues, or never set)."""
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    if spec.get("nodeName") or (status.get("phase") or "Pending") != "Pending":
        return False
    return release_problem(pod, key) is not None


def observe(
    pods: Iterable[Mapping[str, Any]], resource: str, release_key: bytes | None = None
) -> dict[str, JobObs]:
    """The jobs of the GPU pods that declare their class (others are not the queues' to
    order), by job (:func:`extender.queues.jobviews.job_key`). With ``release_key``
    (common/queuerelease.py) a pending pod without a valid proof waits as a gated one does."""
    grouped: dict[str, list[PodObs]] = {}
    classes: dict[str, JobClass] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        annotations = meta.get("annotations") or {}
        if contract.ANN_JOB_CLASS not in annotations:
            continue
        spec, status = pod.get("spec") or {}, pod.get("status") or {}
        key = job_key(pod)
        classes.setdefault(key, job_class(annotations)[0])
        ends = [
            epoch(((c.get("state") or {}).get("terminated") or {}).get("finishedAt"))
            for c in status.get("containerStatuses") or []
            if isinstance(c, dict)
        ]
        grouped.setdefault(key, []).append(
            PodObs(
                namespace=str(meta.get("namespace", "")),
                name=str(meta.get("name", "")),
                uid=str(meta.get("uid", "")),
                gpus=gpu_count(spec, resource, []),
                created=epoch(meta.get("creationTimestamp")) or 0.0,
                gated=gated(pod) or waits_for_proof(pod, release_key),
                bound=bool(spec.get("nodeName")),
                phase=str(status.get("phase") or "Pending"),
                started=epoch(status.get("startTime")),
                finished=max((e for e in ends if e is not None), default=None),
                constraints=constraints(spec),
            )
        )
    return {k: JobObs(k, classes[k], tuple(v)) for k, v in grouped.items()}
