"""Elastic growth and shrinking of live batch jobs: free GPUs go, one at a time, to the job that
scales best; an interactive arrival that does not fit takes GPUs from the jobs that lose least by
giving them up (partial preemption). On jobs whose replicas a workload with a scale subresource
owns. Pure.

A batch job opts in on its pods (their template):

* ``tidelease.io/workload: Deployment/<name>`` (or ``StatefulSet/<name>``, in the pod's
  namespace): the workload the queues controller scales, one replica at a time;
* ``tidelease.io/max-replicas: "<n>"``: it never grows past that.

Growth happens only while no pod waits at the queue gate (a waiting job's first GPU comes
before any running job's next), nothing released is still unplaced, and the chosen job has all
its pods placed: then the job whose next replica brings the largest mean scaling factor (the
throughput a job's next GPU adds, relative to what its second GPU added; from its throughput
profile) grows by one replica, if that replica's GPUs are free. An interactive pod that does not
fit shrinks the elastic jobs the partial preemption chooses (the GPUs worth least first; never
below one replica) by whole replicas, and waits for their GPUs instead of preempting; when that
cannot free enough, kube-scheduler's preemption does, as for any job.

Reference: cornucopia Algorithm 2, Algorithm 3, eq. 1 (docs/references.md).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from common import contract
from common.annotationrules import problem, rule_of
from common.jobclasses import JobKind
from extender.queues.allocation import JobView
from extender.queues.mlfq import Queue
from extender.queues.preemptionorder import preempt_counts


@dataclass(frozen=True, slots=True)
class Elastic:
    """A job's declared workload: what to scale, how far, and the GPUs of one replica."""

    namespace: str
    kind: str
    name: str
    max_replicas: int
    replica_gpus: int

    @property
    def path(self) -> str:
        plural = {"Deployment": "deployments", "StatefulSet": "statefulsets"}[self.kind]
        return f"/apis/apps/v1/namespaces/{self.namespace}/{plural}/{self.name}/scale"


def declared(
    annotations: Mapping[str, str], namespace: str, replica_gpus: int
) -> tuple[Elastic | None, list[str]]:
    """The workload a pod's annotations declare, or None; with the problems found (the rules
    are common.annotationrules', which the filter and the admission policy apply too)."""
    raw = annotations.get(contract.ANN_WORKLOAD)
    if raw is None:
        return None, []
    top = annotations.get(contract.ANN_MAX_REPLICAS, "")
    problems = [
        problem(rule_of(key), value)
        for key, value in ((contract.ANN_WORKLOAD, raw), (contract.ANN_MAX_REPLICAS, top))
        if not rule_of(key).accepts(value)
    ]
    if problems or replica_gpus < 1:
        return None, problems
    kind, _, name = raw.partition("/")
    return Elastic(namespace, kind, name, int(top), replica_gpus), []


def _gain(job: JobView, held: int, gpus: int) -> float:
    """Mean scaling factor of ``gpus`` more GPUs for a job holding ``held`` (+inf: its first)."""
    if held <= 0:
        return math.inf
    return sum(job.profile.scaling_factor(h) for h in range(held, held + gpus)) / gpus


@dataclass(frozen=True, slots=True)
class Grow:
    job: str
    replicas: int  # the new count
    reason: str


def grow(
    jobs: Mapping[str, JobView],
    elastic: Mapping[str, Elastic],
    replicas: Mapping[str, int],
) -> Grow | None:
    """The next growth step for running elastic batch jobs (cornucopia Algorithm 2): one
    replica more for the job whose next replica's GPUs bring the largest mean scaling factor,
    among ``elastic`` (those whose next replica fits now) below their maximum; None when none
    may grow."""
    best: tuple[float, int, float, str] | None = None
    for key, e in elastic.items():
        job = jobs.get(key)
        n = replicas.get(key)
        if job is None or n is None or not job.cls.elastic or job.cls.kind is not JobKind.BATCH:
            continue
        if n >= e.max_replicas:
            continue
        gain = _gain(job, job.held, e.replica_gpus)
        rank = (-gain, int(job.queue), job.arrival, key)
        if best is None or rank < best:
            best = rank
    if best is None:
        return None
    key = best[3]
    return Grow(
        key, replicas[key] + 1, f"largest scaling factor of the next replica: {-best[0]:.3f}"
    )


def shrink(
    need: int,
    jobs: Mapping[str, JobView],
    elastic: Mapping[str, Elastic],
    replicas: Mapping[str, int],
) -> dict[str, int] | None:
    """Partial preemption (cornucopia Algorithm 3) for an interactive arrival short of ``need``
    GPUs, on elastic jobs with a workload, by whole replicas and never below one: the new
    replica count of each job shrunk, or None when they cannot free ``need``."""
    views = []
    for key, e in elastic.items():
        job, n = jobs.get(key), replicas.get(key)
        if job is None or n is None or n <= 1 or not job.cls.elastic:
            continue
        # Only what it may give: all but one replica's GPUs (the last replica stays).
        views.append(
            JobView(
                key, job.cls, job.queue, job.request, min(job.held, (n - 1) * e.replica_gpus),
                job.arrival, job.profile,
            )
        )  # fmt: skip
    takes = preempt_counts(need, Queue.INTERACTIVE, views)
    out: dict[str, int] = {}
    freed = 0
    for t in takes:
        e = elastic[t.key]
        fewer = min(math.ceil(t.gpus / e.replica_gpus), replicas[t.key] - 1)
        if fewer > 0:
            out[t.key] = replicas[t.key] - fewer
            freed += fewer * e.replica_gpus
    return out if freed >= need else None
