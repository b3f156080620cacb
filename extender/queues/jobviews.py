"""The planner's view of the jobs running now, from their pods: what the shared queues' partial
preemption (GPUs taken from the jobs that lose least by giving them up, rather than whole jobs;
:mod:`extender.queues.preemptionorder`) needs when the extender's preempt verb uses it. Pure.

A job is the pods sharing a ``tidelease.io/owner`` (a pod without one is a job of its own). Its
class comes from ``tidelease.io/job-class`` and ``tidelease.io/elastic`` on its pods; its queue
starts from the class (interactive: 1, batch: 2) and moves by the MLFQ rule on the time since
its oldest pod started (a job running longer than the threshold is demoted; the extender knows
no starvation history, so nothing is promoted), unless the queues controller keeps the job's
queue in ``tidelease.io/queue`` on its pods (extender.queues.admission): then that one. Its
throughput profile, when the job publishes one, is ``tidelease.io/throughput``: samples/s at
1, 2, ... GPUs (``"100,190,270"``); without
it the job scales linearly (every GPU worth the same), and among such jobs the one holding most
GPUs loses least by giving one up.

Reference: cornucopia Algorithm 3 (partial preemption) (docs/references.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any, Final

from common import contract
from common.jobclasses import job_class, parse_throughput
from common.model import Allocation, JobKey
from common.podrequest import gpu_count
from common.tenancy import pod_owner
from extender.queues.allocation import JobView
from extender.queues.mlfq import Queue, Thresholds, initial_queue, requeue
from extender.queues.profiling import Profile

# Twice the means an admin would start from: interactive sessions of 30 min, a runtime to
# failure of 12 h, batch jobs of 6 h (the queues adapt them from completed jobs, cornucopia
# 4.2; the extender, which sees no completions, keeps them).
DEFAULT_THRESHOLDS: Final = Thresholds(
    demote_1_s=2 * 1800.0, demote_2_s=2 * 12 * 3600.0, promote_3_s=2 * 6 * 3600.0
)


def profile_of(raw: str | None) -> Profile:
    """``"100,190,270"`` -> throughput at 1, 2, 3 GPUs; anything unreadable -> no profile (the
    filter has told the pod's author already)."""
    return Profile(parse_throughput(raw)[0]) if raw else Profile()


def _started(pod: Mapping[str, Any]) -> float | None:
    raw = (pod.get("status") or {}).get("startTime")
    if not isinstance(raw, str):
        return None
    try:
        return datetime.fromisoformat(raw.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def job_views(
    pods: Iterable[Mapping[str, Any]],
    held: Mapping[str, int],
    *,
    now: float,
    resource: str = contract.DEFAULT_GPU_RESOURCE,
    thresholds: Thresholds = DEFAULT_THRESHOLDS,
) -> dict[JobKey, JobView]:
    """Every job with a pod among ``pods``; ``held``: GPUs allocated now, by job name."""
    grouped: dict[str, list[Mapping[str, Any]]] = {}
    for pod in pods:
        grouped.setdefault(job_key(pod), []).append(pod)
    views: dict[JobKey, JobView] = {}
    for key, members in grouped.items():
        annotations: dict[str, str] = {}
        for pod in members:  # the first pod that says it decides
            for k, v in ((pod.get("metadata") or {}).get("annotations") or {}).items():
                annotations.setdefault(str(k), str(v))
        cls, _problems = job_class(annotations)
        starts = [s for s in (_started(p) for p in members) if s is not None]
        running_s = now - min(starts) if starts else 0.0
        queue = (
            _annotated_queue(annotations)
            or requeue(initial_queue(cls), running_s, 0.0, thresholds).queue
        )
        request = sum(gpu_count(p.get("spec") or {}, resource, []) for p in members)
        views[JobKey(key)] = JobView(
            key=key,
            cls=cls,
            queue=queue,
            request=max(request, 1),
            held=held.get(key, 0),
            arrival=min(starts) if starts else now,
            profile=profile_of(annotations.get(contract.ANN_THROUGHPUT)),
        )
    return views


def _annotated_queue(annotations: Mapping[str, str]) -> Queue | None:
    """The queue the live queues controller keeps the job in (``tidelease.io/queue``)."""
    try:
        return Queue(int(annotations.get(contract.ANN_QUEUE, "")))
    except ValueError:
        return None


def held_by_job(allocations: Iterable[Allocation]) -> dict[str, int]:
    """GPUs allocated now, by job (the owner, or the pod for a pod without one)."""
    held: dict[str, int] = {}
    for a in allocations:
        key = a.holder.owner or a.holder.key
        held[key] = held.get(key, 0) + len(a.devices)
    return held


def opted_in(pod: Mapping[str, Any]) -> bool:
    """Whether a preemptor asks for the shared queues' partial preemption (cornucopia
    Algorithm 3): it declares its class."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    return contract.ANN_JOB_CLASS in annotations


def job_key(pod: Mapping[str, Any]) -> str:
    """The job a pod belongs to: its owner (a job of the pod's namespace, ``ns/job``: the key
    the ledger's holders carry), or the pod itself (``ns/pod``)."""
    owner = pod_owner(pod)
    if owner is not None:
        return owner
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def preemptor_queue(pod: Mapping[str, Any], jobs: Mapping[JobKey, JobView]) -> Queue:
    """The queue a preemptor's job is in: its job's, or where its class starts."""
    known = jobs.get(JobKey(job_key(pod)))
    if known is not None:
        return known.queue
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    return initial_queue(job_class({str(k): str(v) for k, v in annotations.items()})[0])
