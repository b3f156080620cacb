"""Elastic growth and shrinking of live batch jobs (extender.queues.growth): Algorithm 2 one
replica at a time to the job that scales best, within its maximum and the free GPUs; Algorithm 3
by whole replicas for an interactive arrival, never below one replica."""

from __future__ import annotations

from common import contract
from common.jobclasses import JobClass, JobKind
from extender.queues.allocation import JobView
from extender.queues.growth import Elastic, declared, grow, shrink
from extender.queues.mlfq import Queue
from extender.queues.profiling import Profile

BATCH = JobClass(JobKind.BATCH)
# a: linear to 5 GPUs, its 6th worth half; b: sub-linear from its 2nd.
A = Profile((100, 200, 300, 400, 500, 550, 560))
B = Profile((100, 130, 140, 145))


def view(key: str, held: int, profile: Profile, cls: JobClass = BATCH) -> JobView:
    return JobView(key, cls, Queue.BATCH, request=2, held=held, arrival=0.0, profile=profile)


def elastic(name: str, top: int = 6, gpus: int = 1) -> Elastic:
    return Elastic("ns", "Deployment", name, top, gpus)


def test_the_job_that_scales_best_grows_one_replica_at_a_time_up_to_its_maximum() -> None:
    decl = {"a": elastic("a"), "b": elastic("b")}
    held = {"a": 2, "b": 2}
    grown = []
    for _ in range(4):  # 4 GPUs free
        step = grow({k: view(k, h, A if k == "a" else B) for k, h in held.items()}, decl, held)
        assert step is not None
        grown.append(step.job)
        held[step.job] = step.replicas
    assert grown == ["a", "a", "a", "a"]  # S = 1, 1, 1, 0.5 against b's 0.33
    assert held == {"a": 6, "b": 2}
    # At its maximum a stops; b takes what is left.
    views = {k: view(k, h, A if k == "a" else B) for k, h in held.items()}
    step = grow(views, decl, held)
    assert step is not None
    assert (step.job, step.replicas) == ("b", 3)


def test_nothing_grows_past_its_maximum_and_no_interactive_job_grows() -> None:
    decl = {"a": elastic("a", top=3, gpus=2)}
    assert grow({"a": view("a", 6, A)}, decl, {"a": 3}) is None
    chat = JobClass(JobKind.INTERACTIVE)
    assert grow({"a": view("a", 2, A, chat)}, decl, {"a": 1}) is None


def test_an_interactive_arrival_shrinks_the_job_whose_gpu_is_worth_least() -> None:
    views = {"a": view("a", 6, A), "b": view("b", 2, B)}
    decl = {"a": elastic("a"), "b": elastic("b")}
    # a's 6th GPU is worth 0.5, b's 2nd (its last but one) S^1 = 1: a gives one replica.
    assert shrink(1, views, decl, {"a": 6, "b": 2}) == {"a": 5}
    # Whole replicas, never below one: b alone cannot give 2 GPUs of 1 replica of 2.
    two = {"b": Elastic("ns", "Deployment", "b", 6, 2)}
    assert shrink(2, {"b": view("b", 2, B)}, two, {"b": 1}) is None


def test_a_declaration_needs_a_known_kind_and_a_maximum() -> None:
    ok = {contract.ANN_WORKLOAD: "Deployment/train", contract.ANN_MAX_REPLICAS: "6"}
    assert declared(ok, "ns", 2) == (Elastic("ns", "Deployment", "train", 6, 2), [])
    assert declared({}, "ns", 2) == (None, [])
    e, problems = declared({contract.ANN_WORKLOAD: "Job/x"}, "ns", 2)
    assert e is None
    assert len(problems) == 2
    assert Elastic("ns", "StatefulSet", "db", 3, 1).path == (
        "/apis/apps/v1/namespaces/ns/statefulsets/db/scale"
    )
