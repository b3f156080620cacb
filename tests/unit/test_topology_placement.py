"""Topology-aware device choice (common.topology.choose, placement.devices_for), against brute
force on the NVML fake's layouts: the tightest group of the plan's classes, placement's rules
(tiers, tags, right of return) never traded, and no change on nodes without topology."""

from __future__ import annotations

import random
from collections import Counter
from itertools import combinations, product

import pytest

from benchmarks.bench_topology import LAYOUTS as LAYOUTS_16
from common import builders
from common import topology as topo
from common.model import Device, DeviceClass, NodeName, PodRequest, PodUid, Priority, Tier
from common.topology import Link, NodeTopology, group_score, link_table
from extender.scheduler.placement import NodePlan, devices_for, pick_devices, plan_node
from nodeagent.nvml import NvmlReader
from nodeagent.nvmlfake import FakeNvml, layout

LAYOUTS = ("nvswitch-8", "pcie-2socket-8", "nvlink-pairs-4")


def fake_topology(name: str) -> NodeTopology:
    reading = NvmlReader(FakeNvml(layout(name))).topology()
    assert reading.topology is not None
    return reading.topology


def brute_force(
    top: NodeTopology, wants: list[tuple[list[int], int]]
) -> tuple[topo.GroupScore, tuple[int, ...]]:
    """The least score over every group taking exactly ``n`` of each class, and the first
    such group (class by class, each class's indexes in lexicographic order)."""
    table = link_table(top)
    found = None
    for picks in product(*(combinations(c, n) for c, n in wants)):
        group = tuple(i for p in picks for i in p)
        score = group_score(table, group)
        if found is None or score < found[0]:
            found = (score, group)
    assert found is not None
    return found


def request(gpus: int, **kw: object) -> PodRequest:
    return PodRequest("default", "p", PodUid("uid-p"), gpus, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", LAYOUTS)
def test_the_choice_is_the_tightest_group_for_every_size_and_free_subset(name: str) -> None:
    top = fake_topology(name)
    n = len(top.placements)
    rng = random.Random(40)
    subsets = [list(range(n))] + [
        sorted(rng.sample(range(n), rng.randint(1, n))) for _ in range(60)
    ]
    for free in subsets:
        for k in range(1, len(free) + 1):
            chosen = topo.choose(top, [(free, k)])
            flat = chosen[0]
            best, first = brute_force(top, [(free, k)])
            assert len(flat) == k
            assert set(flat) <= set(free)
            assert group_score(link_table(top), flat) == best, (free, k, flat)
            assert flat == first  # ties: the lowest indexes


@pytest.mark.parametrize("name", LAYOUTS)
def test_classes_keep_their_counts_and_the_group_is_the_tightest_of_them(name: str) -> None:
    top = fake_topology(name)
    n = len(top.placements)
    rng = random.Random(41)
    for _ in range(80):
        classes = [rng.randrange(3) for _ in range(n)]
        free = sorted(rng.sample(range(n), rng.randint(2, n)))
        wants: list[tuple[list[int], int]] = []
        for c in range(3):
            of_class = [i for i in free if classes[i] == c]
            if of_class:
                wants.append((of_class, rng.randint(0, len(of_class))))
        if sum(k for _, k in wants) < 2:
            continue
        chosen = topo.choose(top, wants)
        assert [len(g) for g in chosen] == [k for _, k in wants]
        for group, (of_class, _) in zip(chosen, wants, strict=True):
            assert set(group) <= set(of_class)
        best, first = brute_force(top, wants)
        flat = tuple(i for g in chosen for i in g)
        assert group_score(link_table(top), flat) == best
        assert flat == first


def mixed_devices(node: str, n: int, seed: int) -> list[Device]:
    """Devices of mixed tiers, owner tags, lent groups and standby, one per index."""
    rng = random.Random(seed)
    kinds = [
        DeviceClass("H20", Tier.HA, True),
        DeviceClass("H20", Tier.LA, True),
        DeviceClass("H20", Tier.MA, True),
        DeviceClass("H20", Tier.HA, True, builders.owner_key("a")),
        DeviceClass("H20", Tier.HA, True, builders.owner_key("a"), replica="a-0"),
        DeviceClass("H20", Tier.HA, True, None, True),
        DeviceClass("H20", Tier.HA, False),
    ]
    return [
        Device(NodeName(node), i, builders.device_uuid(node, i), rng.choice(kinds))
        for i in range(n)
    ]


REQUESTS = [
    {},
    {"min_tier": Tier.HA},
    {"priority": Priority.HIGH, "owner": builders.owner_key("a")},
    {"priority": Priority.HIGH, "owner": builders.owner_key("a"), "lent_group": "a-0"},
    {"priority": Priority.HIGH, "owner": builders.owner_key("a"), "reclaim": True},
    {"lent_only": True},
]


@pytest.mark.parametrize("name", LAYOUTS)
@pytest.mark.parametrize("kw", REQUESTS, ids=lambda kw: ",".join(kw) or "plain")
def test_topology_never_trades_a_tier_or_a_tag(name: str, kw: dict[str, object]) -> None:
    top = fake_topology(name)
    n = len(top.placements)
    for seed in range(30):
        devs = mixed_devices("n", n, seed)
        rng = random.Random(seed)
        taken = [d.uuid for d in rng.sample(devs, rng.randint(0, n - 1))]
        free = [d for d in devs if d.uuid not in taken]
        for gpus in range(1, n + 1):
            req = request(gpus, **kw)
            plan = plan_node(Counter(d.cls for d in free), req)
            got_plan, chosen = pick_devices(devs, taken, req, top)
            assert got_plan == plan
            if not plan.fits:
                assert chosen == ()
                continue
            # exactly the plan's counts of each class, in the plan's order
            assert Counter(d.cls for d in chosen) == Counter(dict(plan.take))
            assert [d.cls for d in chosen] == [c for c, k in plan.take for _ in range(k)]
            wants = [([d.index for d in free if d.cls == cls], k) for cls, k in plan.take]
            best, _ = brute_force(top, wants)
            assert group_score(link_table(top), [d.index for d in chosen]) == best


def legacy(plan: NodePlan, free: list[Device]) -> tuple[Device, ...]:
    """The choice before topology: the lowest indexes of each class, in the plan's order."""
    out: list[Device] = []
    for cls, k in plan.take:
        out.extend(sorted((d for d in free if d.cls == cls), key=lambda d: d.index)[:k])
    return tuple(out)


@pytest.mark.parametrize("kw", REQUESTS, ids=lambda kw: ",".join(kw) or "plain")
def test_without_topology_or_for_one_gpu_the_choice_is_the_lowest_indexes(
    kw: dict[str, object],
) -> None:
    top = fake_topology("pcie-2socket-8")
    for seed in range(30):
        devs = mixed_devices("n", 8, seed)
        free = [d for d in devs if seed % 3 or d.index % 2]
        taken = [d.uuid for d in devs if d not in free]
        for gpus in range(1, 9):
            req = request(gpus, **kw)
            plan, chosen = pick_devices(devs, taken, req, None)
            assert chosen == (legacy(plan, free) if plan.fits else ())
            if gpus == 1 and plan.fits:
                assert devices_for(plan, free, top) == legacy(plan, free)


def test_a_bind_on_nvlink_pairs_takes_a_whole_pair() -> None:
    top = fake_topology("nvlink-pairs-4")
    devs = builders.devices("n", 4)
    plan, chosen = pick_devices(devs, [devs[0].uuid], request(2), top)
    assert plan.fits
    assert [d.index for d in chosen] == [2, 3]
    _, before = pick_devices(devs, [devs[0].uuid], request(2), None)
    assert [d.index for d in before] == [1, 2]  # what it took before: across the pairs


def test_past_the_bound_the_choice_is_the_lowest_indexes() -> None:
    n = 20  # C(20, 10) groups: more than MAX_GROUPS
    assert topo.MAX_GROUPS < 184_756
    links = [
        topo.pair(a, b, Link.NVLINK if a // 2 == b // 2 else Link.ACROSS_SOCKETS, 4)
        if a // 2 == b // 2
        else topo.pair(a, b, Link.ACROSS_SOCKETS)
        for a, b in combinations(range(n), 2)
    ]
    top = topo.make([topo.Placement(i) for i in range(n)], links)
    free = list(range(1, n))  # 1 alone, then pairs
    assert topo.choose(top, [(free, 10)]) == (tuple(free[:10]),)
    assert topo.choose(top, [(free, 2)]) == ((2, 3),)  # within the bound: a pair


@pytest.mark.parametrize("name", sorted(LAYOUTS_16))
def test_on_16_gpus_the_search_finds_what_every_group_scored_would(name: str) -> None:
    """choose() cuts branches (benchmarks/bench_topology.py): on 16-GPU layouts, with one class
    and with two, its answer is the brute force's, ties to the first indexes included."""
    top = LAYOUTS_16[name]()
    rng = random.Random(16)
    for _ in range(4):
        free = sorted(rng.sample(range(16), rng.randint(9, 16)))
        for k in (2, 5, 8):
            assert topo.choose(top, [(free, k)]) == (brute_force(top, [(free, k)])[1],), (free, k)
        half = len(free) // 2
        wants = [(free[:half], 3), (free[half:], 2)]
        flat = tuple(i for p in topo.choose(top, wants) for i in p)
        assert flat == brute_force(top, wants)[1], wants


def test_a_class_asked_for_more_than_it_has_is_refused() -> None:
    top = fake_topology("nvlink-pairs-4")
    assert topo.choose(top, [([0, 1, 2, 3], 2)]) == ((0, 1),)
    with pytest.raises(ValueError, match="asked"):
        topo.choose(top, [([0, 1], 3)])


@pytest.mark.parametrize(
    ("group", "loosest", "want"),
    [
        ((0,), Link.NVLINK, True),
        ((0, 1), Link.NVLINK, True),
        ((1, 2), Link.NVLINK, False),
        ((1, 2), Link.SAME_NUMA_NODE, True),
        ((0, 1, 2, 3), Link.SAME_HOST_BRIDGE, False),
    ],
    ids=["one", "pair", "across-pairs", "numa", "four-host-bridge"],
)
def test_within(group: tuple[int, ...], loosest: Link, want: bool) -> None:
    assert topo.within(fake_topology("nvlink-pairs-4"), group, loosest) is want
    assert topo.within(None, group, loosest) is (len(group) == 1)


def test_tightness_runs_from_across_sockets_to_nvlink() -> None:
    top = fake_topology("pcie-2socket-8")
    table = link_table(top)
    values = [topo.tightness(group_score(table, g), len(g)) for g in [(0, 1), (0, 2), (0, 4), (0,)]]
    # one PCIe switch, one host bridge (the socket), across sockets, one device
    assert values == [0.75, 0.5, 0.0, 1.0]
    assert topo.tightness(group_score(link_table(fake_topology("nvswitch-8")), (0, 7)), 2) == 1.0


def test_a_returning_replicas_stand_in_is_the_standby_device_closest_to_its_group() -> None:
    """Right of return on the 2-socket layout: replica a-0 lent GPUs 4-6 (socket 1) and its
    fourth device is gone, so the reclaim takes its three and one standby device. Of the
    standby devices 1 (socket 0, the lowest index) and 7 (socket 1, behind the switch of 6),
    it takes 7: the group stays on one socket. Tiers, tags and right of return first: the
    plan's counts (3 own, 1 standby) are what they were without topology."""
    top = fake_topology("pcie-2socket-8")
    own = DeviceClass("H20", Tier.HA, True, builders.owner_key("a"), replica="a-0")
    standby = DeviceClass("H20", Tier.HA, True, None, True)
    plain = DeviceClass("H20", Tier.HA, True)
    classes = {0: plain, 1: standby, 2: plain, 3: plain, 4: own, 5: own, 6: own, 7: standby}
    devices = [
        Device(NodeName("n"), i, builders.device_uuid("n", i), c) for i, c in classes.items()
    ]
    held = [builders.device_uuid("n", i) for i in (0, 2, 3)]  # other pods' devices
    req = request(
        4, priority=Priority.HIGH, owner=builders.owner_key("a"), lent_group="a-0", reclaim=True
    )
    without, before = pick_devices(devices, held, req)
    plan, chosen = pick_devices(devices, held, req, top)
    assert plan.take == without.take
    assert plan.standby_used == 1
    assert sorted(d.index for d in before) == [1, 4, 5, 6]  # the lowest standby index
    assert sorted(d.index for d in chosen) == [4, 5, 6, 7]
