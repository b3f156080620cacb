"""Cornucopia 4: classes, MLFQ, scaling factors (eq. 1), Algorithm 2 and Algorithm 3."""

from __future__ import annotations

from dataclasses import replace

import pytest

from common import builders, contract
from common.jobclasses import JobClass, JobKind, job_class
from common.model import JobKey, Priority
from common.podrequest import parse_pod
from extender.queues.allocation import JobView, allocate
from extender.queues.mlfq import Means, Queue, Thresholds, adapt, requeue
from extender.queues.preemptionorder import preempt_counts
from extender.queues.profiling import Profile, profile_from_batches, scaling_factors
from extender.scheduler.partialpreemption import choose_preemption, plan_preemption
from tests.unit.cluster import allocate as ledger
from tests.unit.cluster import cluster, holder

INTERACTIVE = JobClass(JobKind.INTERACTIVE)
BATCH = JobClass(JobKind.BATCH)
RIGID = JobClass(JobKind.BATCH, elastic=False)
LINEAR = Profile(tuple(float(g) for g in range(1, 17)))
# Sub-linear: gains 1, 0.5, 0.25, ... after the first GPU.
SUBLINEAR = Profile((1.0, 2.0, 2.5, 2.75, 2.875, 2.9375, 2.96875, 2.984375))


@pytest.mark.parametrize(
    ("annotations", "label", "problems"),
    [
        pytest.param({}, "batch", 0, id="default-batch"),
        pytest.param({contract.ANN_JOB_CLASS: "interactive"}, "interactive", 0, id="interactive"),
        pytest.param({contract.ANN_ELASTIC: "false"}, "non-elastic", 0, id="non-elastic"),
        pytest.param({contract.ANN_JOB_CLASS: "urgent"}, "batch", 1, id="bad-class"),
        pytest.param({contract.ANN_ELASTIC: "nope"}, "batch", 1, id="bad-elastic"),
    ],
)
def test_job_class_from_annotations(annotations: dict[str, str], label: str, problems: int) -> None:
    cls, found = job_class(annotations)
    assert (cls.label, len(found)) == (label, problems)


def test_scaling_factor_eq1() -> None:
    assert scaling_factors(LINEAR)[:3] == (1.0, 1.0, 1.0)
    assert scaling_factors(SUBLINEAR)[:4] == (1.0, 0.5, 0.25, 0.125)
    assert Profile().scaling_factor(3) == 1.0  # non-elastic: not profiled, S = 1


def test_ramp_up_profile_drops_two_warmup_batches() -> None:
    # 1 GPU: 10 s per batch of 32 after two slow warm-up batches; 2 GPUs: 64 samples per 10 s.
    p = profile_from_batches({1: [30, 20, 10, 10, 10], 2: [40, 30, 10, 10, 10]}, per_gpu_batch=32)
    assert p.throughput == pytest.approx((3.2, 6.4))


def test_mlfq_moves_and_adapts() -> None:
    t = Thresholds.from_means(interactive_s=600, rttf_s=3600, batch_s=7200)
    assert requeue(Queue.INTERACTIVE, 1201, 0, t).queue is Queue.BATCH
    assert requeue(Queue.INTERACTIVE, 1200, 0, t).queue is Queue.INTERACTIVE
    assert requeue(Queue.BATCH, 7200, 0, t).queue is Queue.LONG
    assert requeue(Queue.LONG, 0, 14400, t).queue is Queue.BATCH
    means = Means()
    for d in (300.0, 500.0):
        means = means.completed(INTERACTIVE, d)
    means = means.completed(BATCH, 1000.0)
    same, means = adapt(t, means, every=4)
    assert same == t
    new, means = adapt(t, means.completed(BATCH, 3000.0), every=4)
    assert (new.demote_1_s, new.demote_2_s, new.promote_3_s) == (800.0, 7200.0, 4000.0)
    assert means.since_update == 0


def test_algorithm_2_interactive_first_then_largest_scaling_factor() -> None:
    jobs = [
        JobView("sub", BATCH, Queue.BATCH, request=4, held=2, arrival=1, profile=SUBLINEAR),
        JobView("lin", BATCH, Queue.BATCH, request=4, held=2, arrival=2, profile=LINEAR),
        JobView("ia", INTERACTIVE, Queue.INTERACTIVE, request=2, arrival=3),
    ]
    grants = {g.key: g.gpus for g in allocate(jobs, 5)}
    # The interactive job gets its request; the linear job (S = 1) beats the sub-linear
    # one (S^2 = 0.5) for every remaining GPU until it reaches twice its request... 3 left.
    assert grants == {"ia": 2, "lin": 3}


def test_algorithm_2_partial_interactive_and_waiting_jobs_start_first() -> None:
    jobs = [
        JobView("ia", INTERACTIVE, Queue.INTERACTIVE, request=4, arrival=1),
        JobView("run", BATCH, Queue.BATCH, request=2, held=2, arrival=0, profile=LINEAR),
        JobView("wait", BATCH, Queue.BATCH, request=2, arrival=2, profile=LINEAR),
    ]
    assert {g.key: g.gpus for g in allocate(jobs, 3)} == {"ia": 3}
    assert {g.key: g.gpus for g in allocate(jobs[1:], 1)} == {"wait": 1}


def test_algorithm_2_non_elastic_all_or_nothing() -> None:
    jobs = [JobView("rigid", RIGID, Queue.BATCH, request=4, arrival=0)]
    assert allocate(jobs, 3) == ()
    assert {g.key: g.gpus for g in allocate(jobs, 6)} == {"rigid": 4}


def test_algorithm_3_sublinear_first_then_most_gpus() -> None:
    jobs = [
        JobView("lin-small", BATCH, Queue.BATCH, request=4, held=4, profile=LINEAR),
        JobView("lin-big", BATCH, Queue.BATCH, request=8, held=8, profile=LINEAR),
        JobView("sub", BATCH, Queue.BATCH, request=4, held=4, profile=SUBLINEAR),
        JobView("ia", INTERACTIVE, Queue.INTERACTIVE, request=2, held=2),
    ]
    takes = {t.key: t.gpus for t in preempt_counts(4, Queue.INTERACTIVE, jobs)}
    # sub at 4 GPUs loses S^3 = 0.25, then S^2 = 0.5, then 1 = linear: the linear job with the
    # most GPUs gives the rest. The interactive job is never touched.
    assert takes == {"sub": 2, "lin-big": 2}


def test_algorithm_3_lower_queue_first_and_rigid_whole() -> None:
    jobs = [
        JobView("q2", BATCH, Queue.BATCH, request=4, held=4, profile=SUBLINEAR),
        JobView("q3-rigid", RIGID, Queue.LONG, request=3, held=3),
    ]
    takes = {t.key: t.gpus for t in preempt_counts(1, Queue.INTERACTIVE, jobs)}
    assert takes == {"q3-rigid": 3}
    assert preempt_counts(2, Queue.BATCH, jobs[:1]) == ()  # same queue: no preemption


U = builders.device_uuid


def _node() -> tuple[list, list]:  # type: ignore[type-arg]
    state = cluster(builders.gpu_node("n", builders.devices("n", 8)))
    ledger(
        state,
        "n",
        [
            (holder("sub-0", owner="sub"), [U("n", 0), U("n", 1)]),
            (holder("sub-1", owner="sub"), [U("n", 2), U("n", 3)]),
            (holder("lin-0", owner="lin"), [U("n", 4), U("n", 5)]),
            (holder("lin-1", owner="lin"), [U("n", 6), U("n", 7)]),
        ],
    )
    node = state.get("n")
    assert node is not None
    return list(node.devices), list(node.allocations.values())


JOBS = {  # the ledger's holders name jobs of their namespace (default)
    JobKey("default/sub"): JobView("default/sub", BATCH, Queue.BATCH, 4, held=4, profile=SUBLINEAR),
    JobKey("default/lin"): JobView("default/lin", BATCH, Queue.BATCH, 4, held=4, profile=LINEAR),
    JobKey("default/ia"): JobView("default/ia", INTERACTIVE, Queue.INTERACTIVE, 2),
}


def _preemptor(gpus: int) -> object:
    return parse_pod(
        builders.pod("ia-0", gpus, priority=Priority.HIGH, owner="ia", pod_priority=1000)
    )


def test_choose_preemption_takes_the_pod_that_loses_least() -> None:
    devices, allocations = _node()
    victims = choose_preemption(devices, allocations, _preemptor(2), JOBS)  # type: ignore[arg-type]
    assert [v.name for v in victims or ()] == ["sub-0"]
    decision = plan_preemption(devices, allocations, _preemptor(2), JOBS)  # type: ignore[arg-type]
    assert decision is not None
    assert "S=0.375" in decision.reasons[0]  # mean of S^3 and S^2 of the sub-linear job


def test_partial_preemption_breaks_no_gang_while_a_lone_pod_will_do() -> None:
    """sub-0 and sub-1 are one gang: the sub-linear job's GPU is worth least, but taking it
    would halt the gang, so a linear pod goes; with the lone pods protected (none may be
    taken), the gang goes whole, never one member."""
    devices, allocations = _node()
    gang = "default/pod-group/sub"
    ganged = [
        replace(a, holder=replace(a.holder, gang=gang)) if a.holder.owner == "default/sub" else a
        for a in allocations
    ]
    victims = choose_preemption(devices, ganged, _preemptor(2), JOBS)  # type: ignore[arg-type]
    assert [v.name for v in victims or ()] in (["lin-0"], ["lin-1"])
    interactive = {
        **JOBS,
        JobKey("default/lin"): replace(JOBS[JobKey("default/lin")], queue=Queue.INTERACTIVE),
    }
    decision = plan_preemption(devices, ganged, _preemptor(2), interactive)  # type: ignore[arg-type]
    assert decision is not None
    assert sorted(v.name for v in decision.victims) == ["sub-0", "sub-1"]
    assert all(f"gang {gang}" in r for r in decision.reasons)


def test_choose_preemption_same_queue_cannot_preempt() -> None:
    devices, allocations = _node()
    req = _preemptor(2)
    assert choose_preemption(devices, allocations, req, JOBS, preemptor=Queue.BATCH) is None  # type: ignore[arg-type]
