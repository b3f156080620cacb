"""The simulator's incremental bookkeeping equals a recomputation after any sequence of changes.

The world keeps per node its free healthy devices and those outside the standby pool (indexes by
count), and its healthy standby devices per type and tier; the tag check
(:class:`~extender.leasingsim.tagging.TagChecks`) keeps the answer of
:func:`~extender.leasing.decisions.stale_tags` per owner and lent group; the filter remembers
``own_resolvable`` per node state. Each is checked against what a look at everything gives,
after random device changes, binds and releases.
"""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from common.model import DeviceClass, GpuUuid, Holder, JobKey, NodeName, PodUid, Priority, Tier
from extender.leasing.decisions import View, stale_tags
from extender.leasingsim.scenario import NodeSpec
from extender.leasingsim.tagging import TagChecks
from extender.leasingsim.world import SimCluster
from extender.rightofreturn.lease import LentGroup
from extender.scheduler.filtering import own_resolvable

TYPES = ("H20", "A100")
OWNERS = (None, JobKey("j"), JobKey("k"))
REPLICAS = (None, "j-0", "j-1", "j-2")
NODES = 4
GPUS = 4

klass = st.tuples(
    st.sampled_from((True, True, False)),  # healthy
    st.sampled_from(OWNERS),
    st.booleans(),  # standby
    st.sampled_from(REPLICAS),
)
# (what, node, device index, the class drawn, a holder number)
change = st.tuples(
    st.sampled_from(("class", "class", "bind", "release")),
    st.integers(0, NODES - 1),
    st.integers(0, GPUS - 1),
    klass,
    st.integers(0, 3),
)


def world_of() -> SimCluster:
    return SimCluster(
        [
            NodeSpec(NodeName(f"n{i}"), TYPES[i % 2], (Tier.HA, Tier.MA, Tier.LA, Tier.HA))
            for i in range(NODES)
        ]
    )


def apply(
    world: SimCluster,
    step: tuple[str, int, int, tuple[bool, JobKey | None, bool, str | None], int],
) -> None:
    what, n, i, (healthy, owner, standby, replica), who = step
    node = NodeName(f"n{n}")
    dev = world.by_node[node][i]
    if what == "class":
        cls = DeviceClass(dev.gpu_type, dev.tier, healthy, owner, standby, replica)
        world.set_classes({dev.uuid: cls})
    elif what == "bind":
        if dev.uuid not in world.holder_of:
            uid = PodUid(f"p{who}-{n}-{i}-{len(world.pod_node)}")
            priority = Priority.HIGH if who == 3 else Priority.LOW
            holder = Holder(uid, "ns", uid, priority, 100 if who == 3 else 10 * who)
            world.bind(node, holder, [dev])
    else:
        held = world.holder_of.get(dev.uuid)
        if held is not None:
            world.release(held.pod_uid)


def check_world(world: SimCluster) -> None:
    free, open_ = world.free_counts()
    pool: Counter[tuple[str, Tier]] = Counter()
    for name in world.names:
        devs = [d for d in world.by_node[name] if d.uuid not in world.holder_of]
        assert free[name] == sum(1 for d in devs if d.cls.healthy)
        assert open_[name] == sum(1 for d in devs if d.cls.healthy and not d.cls.standby)
        for d in world.by_node[name]:
            if d.cls.standby and d.cls.healthy:
                pool[(d.gpu_type, d.tier)] += 1
    assert world.standby_pool() == pool
    for gpus in range(GPUS + 2):
        for gpu_type in (None, *TYPES):
            names = world.nodes_of(gpu_type)
            want = {n for n in names if free[n] >= max(gpus, 1)}
            assert set(world.with_free(gpus, gpu_type)) == want
            assert world.any_free(gpus, gpu_type) == bool(want)
            assert set(world.with_open(gpus, gpu_type)) == {
                n for n in names if open_[n] >= max(gpus, 1)
            }


@settings(max_examples=300, deadline=None)
@given(st.lists(change, max_size=60))
def test_the_worlds_indexes_equal_a_count_over_its_devices(steps: list) -> None:  # type: ignore[type-arg]
    world = world_of()
    check_world(world)
    for step in steps:
        apply(world, step)
        check_world(world)


def groups_of(world: SimCluster, picks: list[tuple[int, list[int]]]) -> tuple[LentGroup, ...]:
    uuids: list[GpuUuid] = [d.uuid for n in world.names for d in world.by_node[n]]
    return tuple(
        LentGroup(REPLICAS[1 + r % 3] or "", tuple(uuids[i % len(uuids)] for i in devs))
        for r, devs in picks
    )


group_picks = st.lists(
    st.tuples(st.integers(0, 2), st.lists(st.integers(0, NODES * GPUS - 1), max_size=4)),
    max_size=5,
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.lists(change, max_size=6),
            st.sampled_from(("same", "extend", "new")),
            group_picks,
            st.sampled_from((JobKey("j"), JobKey("k"))),
        ),
        max_size=12,
    )
)
def test_the_tag_check_answers_as_a_look_at_every_device(rounds: list) -> None:  # type: ignore[type-arg]
    world = world_of()
    checks = TagChecks(world)
    view = View(world.devices, world.holder_of, world.offering)
    groups: dict[JobKey, tuple[LentGroup, ...]] = {}
    for steps, how, picks, owner in rounds:
        for step in steps:
            apply(world, step)
        mine = groups.get(owner, ())
        if how == "extend":
            mine = mine + groups_of(world, picks)
        elif how == "new":
            mine = groups_of(world, picks)
        groups[owner] = mine
        assert checks(mine, view, owner) == stale_tags(mine, view, owner)


@settings(max_examples=200, deadline=None)
@given(st.lists(change, max_size=40), st.sampled_from(OWNERS[1:]), st.sampled_from(REPLICAS))
def test_own_resolvable_remembered_answers_as_afresh(
    steps: list,  # type: ignore[type-arg]
    owner: JobKey,
    lent_group: str | None,
) -> None:
    from common.model import PodRequest

    world = world_of()
    req = PodRequest(
        "online",
        "p",
        PodUid("p"),
        2,
        priority=Priority.HIGH,
        pod_priority=50,
        owner=owner,
        lent_group=lent_group,
    )
    for step in steps:
        apply(world, step)
        warm = own_resolvable(world.state, world.names, req)
        world.state.memo.clear()
        assert own_resolvable(world.state, world.names, req) == warm


def _group_can_return_reference(owner: JobKey, uuids: list[GpuUuid], world: SimCluster) -> bool:
    """group_can_return as first written: every device can return, all on one node."""
    from extender.rightofreturn.rules import can_return

    devices, holders = world.devices, world.holder_of
    nodes = {devices[u].node for u in uuids if u in devices}
    return (
        bool(uuids)
        and len(nodes) == 1
        and all(can_return(owner, devices.get(u), holders.get(u), world.offering) for u in uuids)
    )


@settings(max_examples=300, deadline=None)
@given(
    st.lists(change, max_size=30),
    st.lists(st.integers(0, NODES * GPUS + 1), max_size=5),
    st.sampled_from(OWNERS[1:]),
)
def test_group_can_return_answers_as_its_reference(
    steps: list,  # type: ignore[type-arg]
    picks: list[int],
    owner: JobKey,
) -> None:
    from extender.rightofreturn.rules import group_can_return

    world = world_of()
    for step in steps:
        apply(world, step)
    uuids = [d.uuid for n in world.names for d in world.by_node[n]]
    group = [uuids[i] if i < len(uuids) else GpuUuid(f"gone-{i}") for i in picks]
    # a group on one node, as lent, and any mix
    one_node = [d.uuid for d in world.by_node[world.names[0]] if d.index in picks]
    for g in (group, one_node):
        assert group_can_return(
            owner, g, world.devices, world.holder_of, world.offering
        ) == _group_can_return_reference(owner, g, world)
