"""The gang-aware victim choice (extender.scheduler.gangvictims) against brute force on random
small nodes: every set of pods that evicting together is allowed (a gang's members here all or
none, each one a pod the preemptor may evict) is tried, and the chosen set must fit the
preemptor and be the cheapest by the same order, computed here from the pods: the borrowers of
the preemptor's own lent devices first, then the fewest gangs broken, then the least work lost,
then the fewest pods evicted (a gang's members elsewhere counted), then pod priorities."""

from __future__ import annotations

import itertools
import random
from collections import Counter

import pytest

from common import builders
from common.model import (
    Allocation,
    Device,
    DeviceClass,
    GpuUuid,
    Holder,
    JobKey,
    NodeName,
    PodRequest,
    PodUid,
    Priority,
    Tier,
)
from extender.scheduler.gangvictims import EvictionCosts, choose_gang_victims
from extender.scheduler.placement import free_counts, plan_node
from extender.scheduler.victims import may_evict

OWNER = JobKey("online/recsys")
OTHER = JobKey("online/ads")
GANGS = ("batch/pod-group/sweep", "batch/pod-group/train", "batch/workload/j/workers")


def node(rng: random.Random) -> list[Device]:
    out: list[Device] = []
    for i in range(8):
        cls = DeviceClass(
            "H20",
            rng.choice([Tier.HA, Tier.HA, Tier.MA, Tier.LA]),
            rng.random() > 0.05,
            rng.choice([None, None, OWNER, OTHER]),
        )
        out.append(Device(NodeName("n"), i, builders.device_uuid("n", i), cls))
    return out


def holders(rng: random.Random, devices: list[Device]) -> tuple[list[Allocation], EvictionCosts]:
    """Pods on the node: 1-3 devices each, about half of them in one of three gangs (gangs
    have more members elsewhere, sometimes), some of a priority the preemptor may not evict."""
    uuids = [d.uuid for d in devices]
    rng.shuffle(uuids)
    allocations: list[Allocation] = []
    lost: dict[PodUid, float] = {}
    i = 0
    while uuids and rng.random() < 0.9:
        take = [uuids.pop() for _ in range(min(len(uuids), rng.randint(1, 3)))]
        gang = rng.choice([None, None, *GANGS])
        holder = Holder(
            PodUid(f"uid-{i}"),
            "batch",
            f"p{i}",
            Priority.LOW if rng.random() < 0.9 else Priority.HIGH,
            rng.choice([0, 10, 10, 500]),
            gang=gang,
        )
        allocations.append(Allocation(holder, tuple(GpuUuid(u) for u in take)))
        lost[holder.pod_uid] = float(rng.choice([60, 600, 3600, 7200]))
        i += 1
    members: Counter[str] = Counter(a.holder.gang for a in allocations if a.holder.gang)
    gang_members = {g: n + rng.choice([0, 0, 1, 3]) for g, n in members.items()}
    gang_lost = {
        g: sum(lost[a.holder.pod_uid] for a in allocations if a.holder.gang == g)
        + rng.choice([0.0, 0.0, 1800.0]) * (gang_members[g] - n)
        for g, n in members.items()
    }
    return allocations, EvictionCosts(lost, gang_members, gang_lost)


def rank(a: Allocation, by_uuid: dict[GpuUuid, Device], req: PodRequest) -> int:
    classes = [by_uuid[u].cls for u in a.devices]
    if any(c.owner is not None and c.owner == req.owner for c in classes):
        return 0
    return 1 if any(c.owner is not None for c in classes) else 2


def reference_cost(
    chosen: list[Allocation], by_uuid: dict[GpuUuid, Device], req: PodRequest, c: EvictionCosts
) -> tuple[object, ...]:
    gangs = {a.holder.gang for a in chosen if a.holder.gang}
    lone = [a for a in chosen if not a.holder.gang]
    return (
        max((rank(a, by_uuid, req) for a in chosen), default=0),
        len(gangs),
        sum(c.gang_lost_s[g] for g in gangs) + sum(c.lost_s[a.holder.pod_uid] for a in lone),
        sum(c.gang_members[g] for g in gangs) + len(lone),
        sum(a.holder.pod_priority for a in chosen),
        tuple(sorted([*gangs, *(a.holder.key for a in lone)])),
    )


def brute_force(
    devices: list[Device], allocations: list[Allocation], req: PodRequest, c: EvictionCosts
) -> tuple[object, ...] | None:
    """The cheapest allowed set's cost, () when nothing needs evicting, None when nothing
    helps."""
    by_uuid = {d.uuid: d for d in devices}
    held = [u for a in allocations for u in a.devices]
    base = free_counts(devices, held)
    if plan_node(base, req).fits:
        return ()
    best: tuple[object, ...] | None = None
    for size in range(1, len(allocations) + 1):
        for combo in itertools.combinations(allocations, size):
            chosen = list(combo)
            gangs = {a.holder.gang for a in chosen if a.holder.gang}
            whole = all(a in chosen for a in allocations if a.holder.gang in gangs)
            if not whole or not all(may_evict(a.holder, req) for a in chosen):
                continue
            counts = Counter(base)
            counts.update(by_uuid[u].cls for a in chosen for u in a.devices)
            if not plan_node(counts, req).fits:
                continue
            cost = reference_cost(chosen, by_uuid, req, c)
            if best is None or cost < best:
                best = cost
    return best


@pytest.mark.parametrize("seed", range(400))
def test_the_choice_is_the_cheapest_allowed_set(seed: int) -> None:
    rng = random.Random(seed)
    devices = node(rng)
    allocations, costs = holders(rng, devices)
    req = PodRequest(
        "online",
        "recsys-1",
        PodUid("preemptor"),
        rng.randint(1, 8),
        priority=Priority.HIGH,
        pod_priority=1000,
        owner=rng.choice([OWNER, None]),
        min_tier=rng.choice([Tier.LA, Tier.MA]),
    )
    want = brute_force(devices, allocations, req, costs)
    got = choose_gang_victims(devices, allocations, req, costs)
    if want is None or want == ():
        assert got == want
        return
    assert got is not None
    by_uuid = {d.uuid: d for d in devices}
    chosen = [a for a in allocations if a.holder in got]
    assert len(chosen) == len(got)
    # every member here of each gang chosen, and nothing the preemptor may not evict
    gangs = {a.holder.gang for a in chosen if a.holder.gang}
    assert all(a in chosen for a in allocations if a.holder.gang in gangs)
    assert all(may_evict(h, req) for h in got)
    counts = Counter(free_counts(devices, [u for a in allocations for u in a.devices]))
    counts.update(by_uuid[u].cls for a in chosen for u in a.devices)
    assert plan_node(counts, req).fits
    assert reference_cost(chosen, by_uuid, req, costs) == want


def test_a_lone_pod_goes_before_a_gang_and_the_newest_checkpoint_first() -> None:
    """Issue 36's case: a 2-pod gang and single pods compete for the preemptor's four GPUs;
    the victim breaks no gang, and of two lone pods the one that saved its work last goes."""
    devices = builders.devices("n", 8)
    gang = "batch/pod-group/pair"

    def pod(i: int, devs: range, gang: str | None = None) -> Allocation:
        holder = Holder(PodUid(f"u{i}"), "batch", f"p{i}", Priority.LOW, 0, gang=gang)
        return Allocation(holder, tuple(devices[d].uuid for d in devs))

    pair, fresh, stale = pod(0, range(0, 4), gang), pod(1, range(4, 6)), pod(2, range(6, 8))
    costs = EvictionCosts(
        lost_s={PodUid("u0"): 60.0, PodUid("u1"): 60.0, PodUid("u2"): 7200.0},
        gang_members={gang: 2},
        gang_lost_s={gang: 120.0},
    )
    req = PodRequest("online", "r", PodUid("x"), 4, Priority.HIGH, 1000)
    got = choose_gang_victims(devices, [pair, fresh, stale], req, costs)
    assert got == (fresh.holder, stale.holder)  # no gang broken, though they lose more work
    req2 = PodRequest("online", "r", PodUid("x"), 2, Priority.HIGH, 1000)
    assert choose_gang_victims(devices, [pair, fresh, stale], req2, costs) == (fresh.holder,)


def test_a_reclaim_takes_a_borrower_gang_whole() -> None:
    """One member of a 3-pod gang borrows a lent device: the reclaim's borrowers (noticed, then
    evicted, with one deadline) are all three, wherever the others run; a lone pod beside them
    on unlent devices, another namespace's gang of the same name, and an online pod stay."""
    from extender.rightofreturn.rules import plan_reclaim

    lent = builders.devices("a", 4, owner="online/recsys")
    other = builders.devices("b", 8)
    devices = {d.uuid: d for d in [*lent, *other]}

    def h(name: str, gang: str | None, ns: str = "batch", prio: Priority = Priority.LOW) -> Holder:
        return Holder(PodUid(f"u-{ns}-{name}"), ns, name, prio, 0, gang=gang)

    sweep = "batch/pod-group/sweep"
    holders = {
        lent[0].uuid: h("w0", sweep),
        other[0].uuid: h("w1", sweep),
        other[1].uuid: h("w1", sweep),
        other[2].uuid: h("w2", sweep),
        other[3].uuid: h("alone", None),
        other[4].uuid: h("w9", "team-b/pod-group/sweep", ns="team-b"),
        other[5].uuid: h("online", None, ns="online", prio=Priority.HIGH),
    }
    plan = plan_reclaim(
        JobKey("online/recsys"), [d.uuid for d in lent], devices, holders, {"a": True, "b": True}
    )
    assert sorted(b.name for b in plan.borrowers) == ["w0", "w1", "w2"]
    assert len({b.pod_uid for b in plan.borrowers}) == 3
