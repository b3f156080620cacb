"""The baselines as the papers define them, and ties broken as kube-scheduler breaks them.

* "no return" is the plain kube-scheduler with the NVIDIA device plugin: blind to tiers, so a
  cluster that differs only in its tiers gets the same placements, step for step (tidelease's
  tier-aware scheduler, the "tiers without tags" ablation, does not);
* every tie (the node, the devices the kubelet hands out, the preemption candidate) is drawn at
  random from the run's seed: one seed, the same choices; two seeds, different ones;
* the plain profile's scoring and victims are kube-scheduler's (``NodeResourcesFit``,
  ``SelectVictimsOnNode``, ``pickOneNodeForPreemption``).
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace
from functools import partial

import pytest

from common.model import Holder, JobKey, NodeName, PodRequest, PodUid, Priority, Tier
from extender.leasingsim.controlling import Policy
from extender.leasingsim.scenario import NodeSpec, Scenario, draw_failures
from extender.leasingsim.scheduling import (
    Profile,
    Scheduler,
    SchedulerSettings,
    Scoring,
    resources_fit,
    select_victims,
)
from extender.leasingsim.simulating import RunResult, SimSettings, simulate
from extender.leasingsim.tides import default_cluster, default_trace
from extender.leasingsim.world import SimCluster


def generated(seed: int = 2) -> Scenario:
    spec = default_cluster(0.05)  # 63 nodes, 504 GPUs
    nodes = spec.expand(seed)
    trace = default_trace(list(nodes), days=2, seed=seed)
    return Scenario(nodes, trace, draw_failures(nodes, spec.failure_model, trace.minutes, seed))


def retiered(sc: Scenario, seed: int) -> Scenario:
    """The same cluster, trace and failures, the tiers dealt out again over the devices."""
    tiers = [t for n in sc.nodes for t in n.tiers]
    random.Random(seed).shuffle(tiers)
    nodes, at = [], 0
    for n in sc.nodes:
        nodes.append(replace(n, tiers=tuple(tiers[at : at + len(n.tiers)])))
        at += len(n.tiers)
    return replace(sc, nodes=tuple(nodes))


def placements(r: RunResult) -> dict[str, list[tuple[str, int]]]:
    return {job: sorted((d.node, d.index) for d in devs) for job, devs in r.holdings.items()}


def same_run(a: RunResult, b: RunResult) -> bool:
    """The same placements, step for step (tiers aside)."""
    sa, sb = a.series, b.series
    return (
        placements(a) == placements(b)
        and sa.online_held == sb.online_held
        and sa.running == sb.running
        and sa.requested == sb.requested
        and a.stats == b.stats
    )


@pytest.fixture(scope="module")
def plain_run() -> RunResult:
    return simulate(generated(), SimSettings(Policy.NO_RETURN, seed=2))


@pytest.mark.parametrize("deal", [7, 11, 23])
def test_no_return_is_blind_to_tiers(plain_run: RunResult, deal: int) -> None:
    sc = generated()
    other = retiered(sc, deal)
    assert Counter(t for n in other.nodes for t in n.tiers) == Counter(
        t for n in sc.nodes for t in n.tiers
    )
    assert [n.tiers for n in other.nodes] != [n.tiers for n in sc.nodes]
    assert plain_run.summary.evictions > 0  # the jobs scaled up over borrowers
    assert same_run(plain_run, simulate(other, SimSettings(Policy.NO_RETURN, seed=2)))
    # tidelease's tier-aware scheduler does look at the tiers
    aware = [simulate(s, SimSettings(Policy.TIERS_NO_TAGS, seed=2)) for s in (sc, other)]
    assert not same_run(*aware)


def test_a_run_is_its_seed() -> None:
    sc = generated()
    one = simulate(sc, SimSettings(Policy.NO_RETURN, seed=2))
    again = simulate(sc, SimSettings(Policy.NO_RETURN, seed=2))
    other = simulate(sc, SimSettings(Policy.NO_RETURN, seed=3))  # same scenario, other draws
    assert same_run(one, again)
    assert placements(one) != placements(other)


def empty(nodes: int, gpus: int = 4) -> SimCluster:
    return SimCluster(
        [NodeSpec(NodeName(f"n{i:02d}"), "H20", (Tier.HA,) * gpus) for i in range(nodes)]
    )


def borrower(gpus: int, uid: str = "b") -> PodRequest:
    return PodRequest("ns", uid, PodUid(uid), gpus, priority=Priority.LOW, pod_priority=5)


def online(gpus: int, uid: str = "o") -> PodRequest:
    return PodRequest(
        "online",
        uid,
        PodUid(uid),
        gpus,
        priority=Priority.HIGH,
        pod_priority=100,
        owner=JobKey("online/job"),
    )


@pytest.mark.parametrize("profile", list(Profile), ids=[p.value for p in Profile])
def test_ties_between_nodes_are_drawn_from_the_seed(profile: Profile) -> None:
    def pick(seed: int) -> tuple[str, tuple[int, ...]]:
        scheduler = Scheduler(empty(12), SchedulerSettings(), random.Random(seed), profile)
        placed = scheduler.place(borrower(1))
        assert placed is not None
        return placed.node, tuple(d.index for d in placed.devices)

    picks = {seed: pick(seed) for seed in range(1, 7)}
    assert all(pick(seed) == picks[seed] for seed in picks)  # one seed, the same choice
    assert len({node for node, _ in picks.values()}) > 1  # other seeds, other nodes
    if profile is Profile.PLAIN:  # the kubelet's devices: any free ones
        assert len({devices for _, devices in picks.values()}) > 1
    else:  # the extender's own pick: the lowest index of the class it takes
        assert {devices for _, devices in picks.values()} == {(0,)}


def test_the_best_score_wins_before_any_draw() -> None:
    """Bin packing: the node already in use scores highest, whatever the seed."""
    for seed in range(1, 7):
        world = empty(12)
        scheduler = Scheduler(world, SchedulerSettings(), random.Random(seed), Profile.PLAIN)
        first = scheduler.place(borrower(1, "b1"))
        second = scheduler.place(borrower(1, "b2"))
        assert first is not None
        assert second is not None
        assert second.node == first.node


def evict(world: SimCluster, gone: list[Holder], holder: Holder) -> None:
    gone.append(holder)
    world.release(holder.pod_uid)


def test_preemption_ties_are_drawn_from_the_seed() -> None:
    """tidelease: every node holds one borrower, the fewest victims everywhere: the node is
    drawn from the seed."""

    def evicted(seed: int) -> str:
        world = empty(12)
        filler = Scheduler(world, SchedulerSettings(), random.Random(0))
        for i in range(12):
            assert filler.place(borrower(4, f"b{i}")) is not None
        scheduler = Scheduler(world, SchedulerSettings(), random.Random(seed))
        gone: list[Holder] = []
        placed = scheduler.place(online(4), evict=partial(evict, world, gone))
        assert placed is not None
        assert len(gone) == 1
        assert world.pod_node.get(gone[0].pod_uid) is None
        return placed.node

    picks = {seed: evicted(seed) for seed in range(1, 7)}
    assert len(set(picks.values())) > 1
    assert all(evicted(seed) == node for seed, node in picks.items())


def test_plain_preemption_takes_the_node_whose_victim_started_last() -> None:
    """pickOneNodeForPreemption: equal priorities and counts, then the latest start."""
    for seed in range(1, 5):
        world = empty(12)
        filler = Scheduler(world, SchedulerSettings(), random.Random(seed), Profile.PLAIN)
        for i in range(12):
            assert filler.place(borrower(4, f"b{i}")) is not None
        latest = world.pod_node[PodUid("b11")]
        scheduler = Scheduler(world, SchedulerSettings(), random.Random(seed), Profile.PLAIN)
        gone: list[Holder] = []
        placed = scheduler.place(online(4), evict=partial(evict, world, gone))
        assert [h.pod_uid for h in gone] == ["b11"]
        assert placed is not None
        assert placed.node == latest


def pod(name: str, priority: int) -> Holder:
    return Holder(PodUid(name), "ns", name, Priority.LOW, priority)


@pytest.mark.parametrize(
    ("free", "pods", "gpus", "victims"),
    [
        (4, [("a", 10, 4, 1)], 4, ()),  # fits already
        (0, [("a", 10, 4, 1), ("b", 10, 4, 2)], 4, ("b",)),  # the older one is reprieved
        (0, [("a", 10, 4, 2), ("b", 20, 4, 1)], 4, ("a",)),  # the higher priority is
        (0, [("a", 10, 4, 1), ("b", 10, 2, 2), ("c", 10, 2, 3)], 4, ("b", "c")),  # a stays
        (0, [("a", 10, 2, 1), ("b", 10, 2, 2), ("c", 10, 4, 3)], 8, ("a", "b", "c")),
        (0, [("a", 10, 4, 1), ("p", 100, 4, 2)], 8, None),  # p is not lower: no room
    ],
    ids=["fits", "older-stays", "higher-stays", "two-for-one", "all", "protected"],
)
def test_select_victims_reprieves_the_most_important_first(
    free: int,
    pods: list[tuple[str, int, int, int]],
    gpus: int,
    victims: tuple[str, ...] | None,
) -> None:
    on_node = [(pod(name, prio), held, start) for name, prio, held, start in pods]
    got = select_victims(on_node, free, online(gpus))
    assert (None if got is None else tuple(h.name for h in got)) == victims


@pytest.mark.parametrize(
    ("scoring", "free", "gpus", "score"),
    [
        (Scoring.MOST_ALLOCATED, 8, 8, 100),
        (Scoring.MOST_ALLOCATED, 8, 1, 12),
        (Scoring.MOST_ALLOCATED, 2, 1, 87),
        (Scoring.LEAST_ALLOCATED, 8, 1, 87),
        (Scoring.LEAST_ALLOCATED, 2, 1, 12),
    ],
)
def test_resources_fit_scores_as_kube_scheduler(
    scoring: Scoring, free: int, gpus: int, score: int
) -> None:
    assert resources_fit(scoring, 8, free, gpus) == score
