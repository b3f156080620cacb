"""The preempt verb with cornucopia's partial preemption: job views from pods, and victims taken
from the batch job that loses least, not by the default order."""

from __future__ import annotations

import functools
from typing import Any

import pytest

from common import builders, contract
from common.model import Priority
from common.podrequest import parse_pod
from extender.planning.jobviews import (
    held_by_job,
    job_views,
    opted_in,
    preemptor_queue,
    profile_of,
)
from extender.planning.mlfq import Queue
from extender.planning.preempting import choose_preemption
from extender.preemption import Proposal, preempt_nodes
from tests.unit.cluster import allocate, cluster, holder

U = builders.device_uuid
NOW = 1_800_000_000.0


def member(
    name: str, owner: str, gpus: int, *, started_s_ago: float = 60.0, **ann: str
) -> dict[str, Any]:
    pod = builders.pod(name, gpus, owner=owner, priority=Priority.LOW, extra_annotations=dict(ann))
    stamp = NOW - started_s_ago
    from datetime import UTC, datetime

    pod["status"]["startTime"] = datetime.fromtimestamp(stamp, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return pod


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        pytest.param("100,190,270", (100.0, 190.0, 270.0), id="profile"),
        pytest.param(None, (), id="absent"),
        pytest.param("100,fast", (), id="unreadable"),
        pytest.param("100,-5", (), id="negative"),
        pytest.param("100,nan", (), id="nan"),
    ],
)
def test_profile_of(raw: str | None, want: tuple[float, ...]) -> None:
    assert profile_of(raw).throughput == want


def test_job_views_group_pods_by_owner_with_class_queue_and_holdings() -> None:
    pods = [
        member("a-0", "a", 2, **{contract.ANN_JOB_CLASS: "batch"}),
        member("a-1", "a", 2),
        member("chat", "chat", 1, **{contract.ANN_JOB_CLASS: "interactive"}),
        # An interactive job running for 2 h is demoted (it is a batch job in disguise).
        member("nb", "nb", 1, started_s_ago=7200, **{contract.ANN_JOB_CLASS: "interactive"}),
        member("rigid", "rigid", 4, **{contract.ANN_ELASTIC: "false"}),
    ]
    views = job_views(pods, {"a": 4, "rigid": 4}, now=NOW)
    assert (views["a"].request, views["a"].held, views["a"].queue) == (4, 4, Queue.BATCH)
    assert views["chat"].queue is Queue.INTERACTIVE
    assert views["nb"].queue is Queue.BATCH
    assert not views["rigid"].cls.elastic
    assert views["chat"].held == 0


def test_held_by_job_sums_allocations_per_owner() -> None:
    state = cluster(builders.gpu_node("n", builders.devices("n", 8)))
    allocate(
        state,
        "n",
        [
            (holder("a-0", owner="a"), [U("n", 0), U("n", 1)]),
            (holder("a-1", owner="a"), [U("n", 2)]),
            (holder("solo"), [U("n", 3)]),
        ],
    )
    allocations = list(state.get("n").allocations.values())  # type: ignore[union-attr]
    assert held_by_job(allocations) == {"a": 3, "default/solo": 1}


def test_a_preemptor_opts_in_by_declaring_its_class() -> None:
    assert opted_in(builders.pod("p", 1, extra_annotations={contract.ANN_JOB_CLASS: "batch"}))
    assert not opted_in(builders.pod("p", 1))


def test_the_preempt_verb_takes_from_the_job_that_loses_least() -> None:
    """Two batch jobs on a full node: ``small`` holds 2 GPUs in one pod (it would halt), ``big``
    holds 6 in three pods of 2. An interactive pod needing 2 GPUs: the default choice evicts
    by priority (``small``'s pod has the lower one); cornucopia takes one of ``big``'s pods,
    the GPU worth least (big keeps running on 4)."""
    state = cluster(builders.gpu_node("n", builders.devices("n", 8)))
    allocate(
        state,
        "n",
        [
            (holder("small-0", owner="small", pod_priority=5), [U("n", 0), U("n", 1)]),
            (holder("big-0", owner="big", pod_priority=10), [U("n", 2), U("n", 3)]),
            (holder("big-1", owner="big", pod_priority=10), [U("n", 4), U("n", 5)]),
            (holder("big-2", owner="big", pod_priority=10), [U("n", 6), U("n", 7)]),
        ],
    )
    pods = [member("small-0", "small", 2)] + [member(f"big-{i}", "big", 2) for i in range(3)]
    preemptor = builders.pod(
        "chat",
        2,
        priority=Priority.LOW,
        pod_priority=100,
        extra_annotations={contract.ANN_JOB_CLASS: "interactive"},
    )
    req = parse_pod(preemptor)
    proposals = {"n": Proposal(("uid-small-0",))}

    default = preempt_nodes(state, req, proposals)
    assert default["n"].victims == ("uid-small-0",)

    allocations = [a for s in state for a in s.allocations.values()]
    jobs = job_views(pods, held_by_job(allocations), now=NOW)
    choose = functools.partial(
        choose_preemption, jobs=jobs, preemptor=preemptor_queue(preemptor, jobs)
    )
    answer = preempt_nodes(state, req, proposals, choose)
    (victim,) = answer["n"].victims
    assert victim.startswith("uid-big-")
    assert answer["n"].pdb_violations == 0  # not within kube-scheduler's proposal


def test_the_preemptors_queue_is_its_jobs_or_where_its_class_starts() -> None:
    running = member("nb-0", "nb", 1, started_s_ago=7200, **{contract.ANN_JOB_CLASS: "interactive"})
    jobs = job_views([running], {"nb": 1}, now=NOW)
    newcomer = member("nb-1", "nb", 1, **{contract.ANN_JOB_CLASS: "interactive"})
    assert preemptor_queue(newcomer, jobs) is Queue.BATCH  # its job was demoted
    fresh = builders.pod("chat", 1, extra_annotations={contract.ANN_JOB_CLASS: "interactive"})
    assert preemptor_queue(fresh, jobs) is Queue.INTERACTIVE
