"""Right-of-return leasing decisions: schedule, scale-down tagging, reclaim plans, standby."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from common import builders
from common.model import GpuUuid, JobKey, Priority, Tier
from extender.rightofreturn.rules import (
    ScheduleEntry,
    devices_to_tag,
    parse_schedule_time,
    plan_reclaim,
    replicas_for,
    replicas_to_release,
    standby_topup,
    target_gpus,
)
from tests.unit.cluster import holder


def at(hh: int, mm: int = 0) -> float:
    return datetime(2026, 11, 21, hh, mm, tzinfo=UTC).timestamp()


TIDE = [ScheduleEntry(parse_schedule_time("22:00"), 8), ScheduleEntry(480, 32)]


@pytest.mark.parametrize(
    ("now", "gpus"),
    [(at(7, 59), 8), (at(8), 32), (at(21, 59), 32), (at(22), 8), (at(0, 30), 8)],
)
def test_schedule(now: float, gpus: int) -> None:
    assert target_gpus(16, TIDE, now) == gpus


def test_no_schedule_is_desired_count() -> None:
    assert target_gpus(16, [], at(3)) == 16


@pytest.mark.parametrize("bad", ["24:00", "7", "07:60", "ab:cd", ""])
def test_bad_schedule_time(bad: str) -> None:
    with pytest.raises(ValueError, match="HH:MM"):
        parse_schedule_time(bad)


def test_replicas() -> None:
    assert replicas_for(17, 4) == 4
    names = ["job-3", "job-0", "job-10", "job-2", "job-1"]
    assert replicas_to_release(names, 3) == ["job-3", "job-10"]
    assert replicas_to_release(names, 9) == []
    assert replicas_to_release(names, 0) == sorted(names, key=lambda n: int(n.split("-")[1]))


def test_every_released_device_is_tagged_but_standby_loans() -> None:
    """A replica comes back to a whole node: LA and unhealthy devices are tagged too, so that
    no borrower sits on a device it needs; standby devices on loan go back to the pool."""
    devs = (
        builders.devices("n", 2)
        + builders.devices("n", 1, tier=Tier.MA, start=2)
        + builders.devices("n", 1, tier=Tier.LA, start=3)
        + builders.devices("n", 1, healthy=False, start=4)
        + builders.devices("n", 1, standby=True, owner="job", start=5)
    )
    assert [d.index for d in devices_to_tag(devs)] == [0, 1, 2, 3, 4]


def test_reclaim_plan() -> None:
    lent_devs = builders.devices("a", 4, owner="job") + builders.devices(
        "b", 2, owner="job", tier=Tier.MA
    )
    broken = lent_devs[1]
    from dataclasses import replace

    devices = {d.uuid: d for d in lent_devs}
    devices[broken.uuid] = replace(broken, cls=broken.cls._replace(healthy=False))
    holders = {
        lent_devs[0].uuid: holder("borrower-1"),
        lent_devs[2].uuid: holder("borrower-1"),
        lent_devs[3].uuid: holder("hp-squatter", priority=Priority.HIGH),
        lent_devs[4].uuid: holder("own", priority=Priority.HIGH, owner="job"),
    }
    lent = [d.uuid for d in lent_devs] + [GpuUuid("GPU-gone")]
    plan = plan_reclaim(JobKey("job"), lent, devices, holders, {"a": True, "b": False})
    assert [d.index for d in plan.returnable] == [0, 2]
    assert sorted((d.node, d.index) for d in plan.lost) == [("a", 1), ("b", 0), ("b", 1)]
    assert [h.name for h in plan.borrowers] == ["borrower-1"]
    assert [h.name for h in plan.blocked_by] == ["hp-squatter"]
    assert plan.backfill == {("H20", Tier.HA): 2, ("H20", Tier.MA): 2}
    assert not plan.complete


def test_standby_topup_whole_nodes_first_and_only_what_is_missing() -> None:
    free = (
        builders.devices("x", 2)
        + builders.devices("y", 8)
        + builders.devices("z", 8, tier=Tier.MA)
        + builders.devices("w", 8, owner="job")
    )
    chosen = standby_topup(free, {("H20", Tier.HA): 1}, {("H20", Tier.HA): 5, ("H20", Tier.MA): 0})
    assert [(d.node, d.index) for d in chosen] == [("y", i) for i in range(4)]
    assert standby_topup(free, {("H20", Tier.HA): 5}, {("H20", Tier.HA): 5}) == ()


def test_standby_topup_completes_nodes_that_hold_standby_devices() -> None:
    """A node with 6 standby devices and 2 free ones becomes a whole standby node (one
    8-GPU replica can stand in there) before a node with more free devices is started."""
    pool_devs = builders.devices("a", 6, standby=True)
    free = builders.devices("a", 2, start=6, tier=Tier.MA) + builders.devices("b", 4)
    targets = {("H20", Tier.HA): 8, ("H20", Tier.MA): 2}
    chosen = standby_topup(free, {("H20", Tier.HA): 6}, targets, pool_devs)
    assert sorted((d.node, d.index) for d in chosen) == [("a", 6), ("a", 7), ("b", 0), ("b", 1)]
    # without knowing the pool's devices, the node with the most free devices comes first
    chosen = standby_topup(free, {("H20", Tier.HA): 6}, {("H20", Tier.MA): 1})
    assert [(d.node, d.index) for d in chosen] == [("a", 6)]
