"""Algorithm 1 of weflex, line by line, at device granularity."""

from __future__ import annotations

from collections import Counter

import pytest

from common import builders, contract
from common.errors import InvalidInput
from common.model import DeviceClass, PodRequest, PodUid, Priority, Tier
from common.podrequest import parse_pod
from extender.scheduler.placement import Verdict, pick_devices, plan_node, verdict


def req(
    gpus: int = 1,
    *,
    priority: Priority = Priority.LOW,
    owner: str | None = None,
    tier: Tier = Tier.LA,
    gpu_type: str | None = None,
    reclaim: bool = False,
) -> PodRequest:
    return PodRequest(
        namespace="default",
        name="p",
        uid=PodUid("u"),
        gpus=gpus,
        priority=priority,
        owner=builders.owner_key(owner),
        min_tier=tier,
        gpu_type=gpu_type,
        reclaim=reclaim,
    )


def cls(
    tier: Tier = Tier.HA,
    *,
    healthy: bool = True,
    owner: str | None = None,
    standby: bool = False,
    gpu_type: str = "H20",
) -> DeviceClass:
    return DeviceClass(gpu_type, tier, healthy, builders.owner_key(owner), standby)


HP_A = req(priority=Priority.HIGH, owner="a")
HP_A_RECLAIM = req(priority=Priority.HIGH, owner="a", reclaim=True)
LP = req()


@pytest.mark.parametrize(
    ("device", "request_", "expected"),
    [
        # line 6: RelMap[g] < ReqRel -> skip
        (cls(Tier.MA), req(tier=Tier.HA), Verdict.BELOW_TIER),
        (cls(Tier.LA), req(tier=Tier.MA), Verdict.BELOW_TIER),
        (cls(Tier.HA), req(tier=Tier.HA), Verdict.USABLE),
        (cls(Tier.MA), req(tier=Tier.MA), Verdict.USABLE),
        # line 8: untagged devices are open to all
        (cls(), LP, Verdict.USABLE),
        (cls(), HP_A, Verdict.USABLE),
        # line 10: low priority may use tagged devices
        (cls(owner="a"), LP, Verdict.USABLE),
        (cls(owner="b"), LP, Verdict.USABLE),
        # line 12: high priority only on its own tags
        (cls(owner="a"), HP_A, Verdict.USABLE),
        (cls(owner="b"), HP_A, Verdict.TAGGED_OTHER),
        (cls(owner="b"), req(priority=Priority.HIGH), Verdict.TAGGED_OTHER),
        # FETCHSTANDBY: reclaims only
        (cls(standby=True), LP, Verdict.STANDBY_RESERVED),
        (cls(standby=True), HP_A, Verdict.STANDBY_RESERVED),
        (cls(standby=True), HP_A_RECLAIM, Verdict.STANDBY),
        (
            cls(Tier.MA, standby=True),
            req(priority=Priority.HIGH, owner="a", reclaim=True, tier=Tier.HA),
            Verdict.BELOW_TIER,
        ),
        # unhealthy devices are never offered, to anyone
        (cls(healthy=False), LP, Verdict.UNHEALTHY),
        (cls(healthy=False, owner="a"), HP_A, Verdict.UNHEALTHY),
        (cls(healthy=False, standby=True), HP_A_RECLAIM, Verdict.UNHEALTHY),
        # GPU type
        (cls(gpu_type="A100"), req(gpu_type="H20"), Verdict.WRONG_TYPE),
        (cls(gpu_type="A100"), req(), Verdict.USABLE),
    ],
    ids=[
        "ma-below-ha",
        "la-below-ma",
        "ha-meets-ha",
        "ma-meets-ma",
        "untagged-low",
        "untagged-high",
        "low-borrows-a",
        "low-borrows-b",
        "high-own-tag",
        "high-other-tag",
        "high-no-owner-tagged",
        "standby-low",
        "standby-high-not-reclaim",
        "standby-reclaim",
        "standby-tier-checked",
        "unhealthy-low",
        "unhealthy-own",
        "unhealthy-standby",
        "wrong-type",
        "any-type",
    ],
)
def test_verdict(device: DeviceClass, request_: PodRequest, expected: Verdict) -> None:
    assert verdict(device, request_) is expected


def test_enough_usable_devices_fits_without_standby() -> None:
    free = Counter({cls(): 4, cls(standby=True): 4})
    plan = plan_node(free, req(4, priority=Priority.HIGH, owner="a", reclaim=True))
    assert plan.fits
    assert plan.standby_used == 0


def test_reclaim_shortfall_is_supplemented_from_standby() -> None:
    free = Counter({cls(owner="a"): 2, cls(standby=True): 4})
    plan = plan_node(free, req(4, priority=Priority.HIGH, owner="a", reclaim=True))
    assert plan.fits
    assert plan.standby_used == 2
    assert dict(plan.take) == {cls(owner="a"): 2, cls(standby=True): 2}


def test_standby_supplement_matches_type_and_tier() -> None:
    free = Counter(
        {
            cls(owner="a"): 2,
            cls(Tier.MA, standby=True): 4,  # tier too low
            cls(standby=True, gpu_type="A100"): 4,  # other type
        }
    )
    r = req(4, priority=Priority.HIGH, owner="a", reclaim=True, tier=Tier.HA, gpu_type="H20")
    assert not plan_node(free, r).fits


def test_non_reclaim_request_never_gets_standby() -> None:
    free = Counter({cls(): 2, cls(standby=True): 6})
    for r in (req(4), req(4, priority=Priority.HIGH, owner="a")):
        plan = plan_node(free, r)
        assert not plan.fits
        assert "standby" in plan.reason


def test_devices_of_one_pod_share_a_type() -> None:
    free = Counter({cls(gpu_type="H20"): 2, cls(gpu_type="A100"): 2})
    assert not plan_node(free, req(4)).fits
    assert plan_node(free, req(2)).fits


def test_high_priority_of_a_never_takes_b_tags() -> None:
    free = Counter({cls(owner="b"): 8})
    plan = plan_node(free, req(1, priority=Priority.HIGH, owner="a"))
    assert not plan.fits
    assert "another job" in plan.reason


def test_required_tier_respected() -> None:
    free = Counter({cls(Tier.MA): 8, cls(Tier.HA): 1})
    assert not plan_node(free, req(2, tier=Tier.HA)).fits
    assert plan_node(free, req(2, tier=Tier.MA)).fits


def test_unhealthy_devices_excluded() -> None:
    free = Counter({cls(healthy=False): 8, cls(): 1})
    plan = plan_node(free, req(2))
    assert not plan.fits
    assert "unhealthy" in plan.reason


def test_zero_gpu_pod_always_fits() -> None:
    assert plan_node(Counter(), req(0)).fits


def _node(*groups: list) -> list:
    return [d for g in groups for d in g]


def test_pick_owner_gets_its_own_tagged_devices_back() -> None:
    devs = _node(
        builders.devices("n", 4),  # untagged 0-3
        builders.devices("n", 4, owner="a", start=4),  # tagged for a 4-7
    )
    plan, chosen = pick_devices(devs, [], req(4, priority=Priority.HIGH, owner="a"))
    assert plan.fits
    assert [d.index for d in chosen] == [4, 5, 6, 7]


def test_pick_borrower_takes_untagged_before_lent() -> None:
    devs = _node(builders.devices("n", 4, owner="a"), builders.devices("n", 4, start=4))
    _, chosen = pick_devices(devs, [], req(4))
    assert [d.index for d in chosen] == [4, 5, 6, 7]
    _, chosen = pick_devices(devs, [], req(6))
    assert sorted(d.index for d in chosen) == [0, 1, 4, 5, 6, 7]


def test_pick_best_fit_tier_keeps_ha_free() -> None:
    devs = _node(builders.devices("n", 2), builders.devices("n", 2, tier=Tier.MA, start=2))
    _, chosen = pick_devices(devs, [], req(2, tier=Tier.MA))
    assert [d.index for d in chosen] == [2, 3]


def test_pick_skips_allocated_devices() -> None:
    devs = builders.devices("n", 4)
    _, chosen = pick_devices(devs, [devs[0].uuid, devs[2].uuid], req(2))
    assert [d.index for d in chosen] == [1, 3]
    plan, chosen = pick_devices(devs, [d.uuid for d in devs], req(1))
    assert not plan.fits
    assert chosen == ()


def test_pick_reclaim_uses_own_then_standby() -> None:
    devs = _node(
        builders.devices("n", 2, owner="a"),
        builders.devices("n", 2, start=2, standby=True),
        builders.devices("n", 2, start=4, owner="b"),
    )
    _, chosen = pick_devices(devs, [], req(3, priority=Priority.HIGH, owner="a", reclaim=True))
    assert [d.index for d in chosen] == [0, 1, 2]


def test_a_lent_only_borrower_takes_lent_devices_alone() -> None:
    """tidelease.io/lent-only: the untagged devices a borrower would take first are refused,
    with the reason, and the pod fits only as far as lent devices go."""
    lent_only = PodRequest(namespace="default", name="p", uid=PodUid("u"), gpus=4, lent_only=True)
    assert verdict(cls(), lent_only) is Verdict.NOT_LENT
    assert verdict(cls(owner="a"), lent_only) is Verdict.USABLE
    devs = _node(builders.devices("n", 4, owner="a"), builders.devices("n", 4, start=4))
    _, chosen = pick_devices(devs, [], lent_only)
    assert [d.index for d in chosen] == [0, 1, 2, 3]
    plan = plan_node(Counter({cls(): 8, cls(owner="a"): 2}), lent_only)
    assert not plan.fits
    assert "not lent by an online job" in plan.reason


def test_lent_only_is_read_from_its_annotation() -> None:
    pod = {
        "metadata": {"name": "p", "namespace": "t", "uid": "u"},
        "spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": 1}}}]},
    }
    assert not parse_pod(pod).lent_only
    pod["metadata"]["annotations"] = {contract.ANN_LENT_ONLY: "true"}  # type: ignore[index]
    assert parse_pod(pod).lent_only
    pod["metadata"]["annotations"] = {contract.ANN_LENT_ONLY: "yes"}  # type: ignore[index]
    with pytest.raises(InvalidInput, match="lent-only"):
        parse_pod(pod)
