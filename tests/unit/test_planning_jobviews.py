"""The preempt verb with cornucopia's partial preemption: job views from pods, and victims taken
from the batch job that loses least, not by the default order."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import pytest

from common import builders, contract
from common.model import Holder, PodUid, Priority
from common.podrequest import parse_pod
from extender.leasing.decisions import View, choose_groups
from extender.queues.jobviews import (
    held_by_job,
    job_views,
    opted_in,
    preemptor_queue,
    profile_of,
)
from extender.queues.mlfq import Queue
from extender.queues.preemptionorder import eviction_cost
from extender.rightofreturn.lease import LentGroup
from extender.scheduler.partialpreemption import choose_preemption
from extender.scheduler.victims import Proposal, preempt_nodes
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
    views = job_views(pods, {"default/a": 4, "default/rigid": 4}, now=NOW)
    assert (views["default/a"].request, views["default/a"].held, views["default/a"].queue) == (
        4,
        4,
        Queue.BATCH,
    )
    assert views["default/chat"].queue is Queue.INTERACTIVE
    assert views["default/nb"].queue is Queue.BATCH
    assert not views["default/rigid"].cls.elastic
    assert views["default/chat"].held == 0


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
    assert held_by_job(allocations) == {"default/a": 3, "default/solo": 1}


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
    jobs = job_views([running], {"default/nb": 1}, now=NOW)
    newcomer = member("nb-1", "nb", 1, **{contract.ANN_JOB_CLASS: "interactive"})
    assert preemptor_queue(newcomer, jobs) is Queue.BATCH  # its job was demoted
    fresh = builders.pod("chat", 1, extra_annotations={contract.ANN_JOB_CLASS: "interactive"})
    assert preemptor_queue(fresh, jobs) is Queue.INTERACTIVE


# --- the leasing controller: which lent groups a reclaim takes back ---


def _groups_world() -> tuple[list[LentGroup], View, dict[str, int]]:
    """Two lent groups of 4 devices, one borrower on each: ``solo`` (a job's only pod, 4 GPUs)
    on recsys-2's, ``big-0`` (one of three 4-GPU pods of job ``big``) on recsys-3's."""
    devs = builders.devices("a", 4, owner="recsys") + builders.devices(
        "b", 4, owner="recsys", start=0
    )
    solo = holder("solo-0", owner="solo")
    big = holder("big-0", owner="big")
    holders = {d.uuid: solo for d in devs[:4]} | {d.uuid: big for d in devs[4:]}
    groups = [
        LentGroup("recsys-2", tuple(d.uuid for d in devs[:4])),
        LentGroup("recsys-3", tuple(d.uuid for d in devs[4:])),
    ]
    view = View({d.uuid: d for d in devs}, holders, {"a": True, "b": True})
    return groups, view, {"default/solo": 4, "default/big": 12}


def _cost(
    held: dict[str, int], pods: list[dict[str, Any]]
) -> Callable[[Sequence[Holder]], tuple[int, int, float]]:
    jobs = job_views(pods, held, now=NOW)
    gpus = {PodUid(f"uid-{p['metadata']['name']}"): 4 for p in pods}
    return functools.partial(eviction_cost, gpus=gpus, jobs=jobs)


def test_a_reclaim_takes_back_the_group_whose_borrowers_lose_least() -> None:
    groups, view, held = _groups_world()
    # Without the jobs' view: equal borrower counts, the lower ordinal goes first.
    assert [g.replica for g in choose_groups(groups, 1, view)] == ["recsys-2"]
    pods = [member("solo-0", "solo", 4)] + [member(f"big-{i}", "big", 4) for i in range(3)]
    cornucopia = replace(view, eviction_cost=_cost(held, pods))
    # Evicting solo-0 halts its job; big-0's job goes on with 8 GPUs.
    assert [g.replica for g in choose_groups(groups, 1, cornucopia)] == ["recsys-3"]


def test_an_interactive_borrower_is_evicted_last() -> None:
    groups, view, _ = _groups_world()
    pods = [
        member("solo-0", "solo", 4, **{contract.ANN_JOB_CLASS: "batch"}),
        member("big-0", "big", 4, **{contract.ANN_JOB_CLASS: "interactive"}),
    ]
    cornucopia = replace(view, eviction_cost=_cost({"default/solo": 4, "default/big": 12}, pods))
    assert [g.replica for g in choose_groups(groups, 1, cornucopia)] == ["recsys-2"]


@pytest.mark.parametrize(
    ("profile", "want"),
    [
        pytest.param("100,200,300,400", 2.0, id="linear"),
        pytest.param("100,200,250,260", 0.6, id="sub-linear"),
    ],
)
def test_eviction_cost_sums_the_worth_of_the_gpus_taken(profile: str, want: float) -> None:
    pods = [member("j-0", "j", 2, **{contract.ANN_THROUGHPUT: profile}), member("j-1", "j", 2)]
    jobs = job_views(pods, {"default/j": 4}, now=NOW)
    victims = [holder("j-0", owner="j"), holder("j-1", owner="j")]
    top, halts, worth = eviction_cost(victims[:1], {victims[0].pod_uid: 2}, jobs)
    assert (top, halts) == (-int(Queue.BATCH), 0)
    # The two GPUs taken are the job's 4th and 3rd: worth S^3 + S^2 (eq. 1; 1 each if linear).
    assert worth == pytest.approx(want)
    assert eviction_cost(victims, {v.pod_uid: 2 for v in victims}, jobs)[1] == 1  # halts j
