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
    JobName,
    NodeName,
    PodRequest,
    PodUid,
    Priority,
    Tier,
)
from extender.scheduler.filtering import filter_nodes
from extender.simulation.scenario import NodeSpec
from extender.simulation.scheduling import Scheduler, SchedulerSettings
from extender.simulation.world import SimCluster

TYPES = ("H20", "A100")
TIERS = (Tier.HA, Tier.MA, Tier.LA)
OWNERS = (None, JobName("j"), JobName("k"))

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


Dev = tuple[Tier, bool, JobName | None, bool, int]


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
        3: Holder(PodUid("hp"), "ns", "hp", Priority.HIGH, 100, JobName("k")),
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


@settings(max_examples=600, deadline=None)
@given(st.lists(node, min_size=1, max_size=8), request)
def test_shortcuts_answer_as_the_filter_over_every_node(
    nodes: list[tuple[str, list[Dev]]],
    req_shape: tuple[int, Tier, str | None, JobName, bool],
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
    event(f"passed={bool(full.passed)} failed={bool(full.failed)} reclaim={reclaim}")
    if not full.passed:
        found = scheduler.preemption_candidates(req, universe, len(universe))
        assert set(found) == set(full.failed)
