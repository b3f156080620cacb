"""The simulator's scheduling cycle answers exactly as ``filter_nodes`` over every node.

The scheduler asks the filter only about nodes with enough free devices (and, for a reclaim pod,
those with its owner's tags); that shortcut may change neither which nodes pass, nor which
nodes are candidates for preemption. Checked on random small clusters.
"""

from __future__ import annotations

import random

from hypothesis import event, given, settings
from hypothesis import strategies as st

from common.model import (
    DeviceClass,
    Holder,
    JobKey,
    NodeName,
    PodRequest,
    PodUid,
    Priority,
    Tier,
)
from extender.leasingsim.scenario import NodeSpec
from extender.leasingsim.scheduling import Scheduler, SchedulerSettings
from extender.leasingsim.world import SimCluster
from extender.scheduler.filtering import filter_nodes
from extender.scheduler.scoring import prioritize_nodes

TYPES = ("H20", "A100")
TIERS = (Tier.HA, Tier.MA, Tier.LA)
OWNERS = (None, JobKey("j"), JobKey("k"))

device = st.tuples(
    st.sampled_from(TIERS),
    st.sampled_from((True, True, True, False)),  # healthy, mostly
    st.sampled_from(OWNERS),
    st.integers(0, 4).map(lambda n: n == 0),  # standby, sometimes
    st.sampled_from((0, 0, 0, 1, 2, 3)),  # 0: free; 1, 2: borrowers; 3: a protected pod
)
node = st.tuples(st.sampled_from(TYPES), st.lists(device, min_size=1, max_size=4))
request = st.tuples(
    st.integers(1, 3),
    st.sampled_from(TIERS),
    st.sampled_from((None, *TYPES)),
    st.sampled_from(OWNERS[1:]),
    st.booleans(),  # reclaim
)


Dev = tuple[Tier, bool, JobKey | None, bool, int]


def build(nodes: list[tuple[str, list[Dev]]]) -> SimCluster:
    specs = [
        NodeSpec(NodeName(f"n{i}"), t, tuple(d[0] for d in devs))
        for i, (t, devs) in enumerate(nodes)
    ]
    world = SimCluster(specs)
    changes = {}
    for spec, (_, devs) in zip(specs, nodes, strict=True):
        for dev, (tier, healthy, owner, standby, _) in zip(
            world.by_node[spec.name], devs, strict=True
        ):
            changes[dev.uuid] = DeviceClass(spec.gpu_type, tier, healthy, owner, standby)
    world.set_classes(changes)
    holders = {
        1: Holder(PodUid("b1"), "ns", "b1", Priority.LOW, 10),
        2: Holder(PodUid("b2"), "ns", "b2", Priority.LOW, 20),
        3: Holder(PodUid("hp"), "ns", "hp", Priority.HIGH, 100, JobKey("k")),
    }
    for spec, (_, devs) in zip(specs, nodes, strict=True):
        for who, holder in holders.items():
            taken = [
                d for d, (*_, w) in zip(world.by_node[spec.name], devs, strict=True) if w == who
            ]
            if taken:
                h = Holder(
                    PodUid(f"{holder.pod_uid}-{spec.name}"),
                    holder.namespace,
                    f"{holder.name}-{spec.name}",
                    holder.priority,
                    holder.pod_priority,
                    holder.owner,
                )
                world.bind(spec.name, h, taken)
    return world


def best_of(world: SimCluster, req: PodRequest, passed: list[str]) -> set[str]:
    """kube-scheduler's picks: the nodes with the best score among those that passed (one of
    them at random)."""
    if not passed:
        return set()
    scores = prioritize_nodes(world.state, req, passed, SchedulerSettings().weights)
    top = max(v for _, v in scores)
    return {n for n, v in scores if v == top}


def best(scheduler: Scheduler, req: PodRequest, universe: list[NodeName]) -> set[str]:
    found = scheduler._best(req, universe, None)
    return set() if found is None else {found}


@settings(max_examples=600, deadline=None)
@given(st.lists(node, min_size=1, max_size=8), request)
def test_shortcuts_answer_as_the_filter_over_every_node(
    nodes: list[tuple[str, list[Dev]]],
    req_shape: tuple[int, Tier, str | None, JobKey, bool],
) -> None:
    world = build(nodes)
    gpus, tier, gpu_type, owner, reclaim = req_shape
    req = PodRequest(
        "ns",
        "p",
        PodUid("p"),
        gpus,
        priority=Priority.HIGH,
        pod_priority=50,
        owner=owner,
        min_tier=tier,
        gpu_type=gpu_type,
        reclaim=reclaim,
    )
    full = filter_nodes(world.state, req, world.names)
    scheduler = Scheduler(world, SchedulerSettings(), random.Random(1))
    universe = world.nodes_of(gpu_type)
    assert set(scheduler.passed(req, universe, None)) == set(full.passed)
    assert best(scheduler, req, universe) <= best_of(world, req, full.passed)
    assert bool(best(scheduler, req, universe)) == bool(full.passed)
    event(f"passed={bool(full.passed)} failed={bool(full.failed)} reclaim={reclaim}")
    if not full.passed:
        found = scheduler.preemption_candidates(req, universe, len(universe))
        assert set(found) == set(full.failed)


@settings(max_examples=400, deadline=None)
@given(
    st.lists(node, min_size=1, max_size=8),
    st.integers(1, 3),
    st.sampled_from(TIERS),
    st.sampled_from((None, *TYPES)),
    st.sampled_from((frozenset(), frozenset({JobKey("j")}))),
)
def test_a_borrower_is_asked_about_open_devices_only_and_counted_as_before(
    nodes: list[tuple[str, list[Dev]]],
    gpus: int,
    tier: Tier,
    gpu_type: str | None,
    reclaiming: frozenset[JobKey],
) -> None:
    """A pod that is no reclaim is filtered over the nodes with enough free devices outside the
    standby pool; it passes where the filter over every node passes it, and the statistics
    count one filter call whenever some node has enough free healthy devices, standby or not
    (the calls of the cycle without that shortcut)."""
    world = build(nodes)
    req = PodRequest(
        "ns",
        "b",
        PodUid("b"),
        gpus,
        priority=Priority.LOW,
        pod_priority=5,
        min_tier=tier,
        gpu_type=gpu_type,
        reclaiming_owners=reclaiming,
    )
    full = filter_nodes(world.state, req, world.names)
    scheduler = Scheduler(world, SchedulerSettings(), random.Random(1))
    universe = world.nodes_of(gpu_type)
    assert set(scheduler.passed(req, universe, None)) == set(full.passed)
    scheduler.stats.filter_calls = 0
    found = best(scheduler, req, universe)
    assert found <= best_of(world, req, full.passed)
    assert bool(found) == bool(full.passed)
    free = [
        n
        for n in universe
        if sum(1 for d in world.by_node[n] if d.cls.healthy and d.uuid not in world.holder_of)
        >= gpus
    ]
    assert scheduler.stats.filter_calls == (1 if free else 0)
    event(f"passed={bool(full.passed)} asked={bool(free)}")


def test_the_best_scored_candidate_that_does_not_pass_is_passed_over() -> None:
    """A borrower's best-scored candidate (scores tie at 0, the first by name) is being taken
    back by its owner: the filter is asked about every candidate, and the pod goes where one
    passes, as kube-scheduler would send it."""
    k = JobKey("k")
    world = build(
        [
            ("H20", [(Tier.HA, True, JobKey("j"), False, 0)]),
            ("H20", [(Tier.HA, True, k, False, 0)] * 20),
        ]
    )
    req = PodRequest(
        "ns",
        "b",
        PodUid("b"),
        1,
        priority=Priority.LOW,
        pod_priority=5,
        min_tier=Tier.LA,
        reclaiming_owners=frozenset({JobKey("j")}),
    )
    scheduler = Scheduler(world, SchedulerSettings(), random.Random(1))
    universe = world.nodes_of(None)
    scores = dict(prioritize_nodes(world.state, req, universe, SchedulerSettings().weights))
    assert scores == {"n0": 0, "n1": 0}
    full = filter_nodes(world.state, req, world.names)
    assert full.passed == ["n1"]
    assert best(scheduler, req, universe) == best_of(world, req, full.passed) == {"n1"}
    assert scheduler.stats.filter_calls == 1
