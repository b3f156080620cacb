"""The leasing controller's decisions, step by step, and resuming from any stored status."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

import pytest

from common import builders
from common.model import Device, Holder, JobKey, Priority, Tier
from common.tenancy import job_key
from extender.leasing.decisions import (
    RELEASE_COST,
    Evict,
    MarkRelease,
    Notify,
    OwnerPod,
    ScaleTo,
    SetTags,
    TagChange,
    View,
    Wait,
    WriteStatus,
    decide,
)
from extender.rightofreturn.lease import (
    GpuLease,
    LeaseSpec,
    LeaseStatus,
    LentGroup,
    Notice,
    Workload,
)
from tests.unit.cluster import granted_leases, holder

OWNER = job_key("default", "recsys")
NOW = 1_800_000_000.0


def lease(desired: int, status: LeaseStatus | None = None, grace: int = 45) -> GpuLease:
    spec = LeaseSpec(OWNER, Workload("apps/v1", "StatefulSet", "recsys"), 4, desired, grace_s=grace)
    return GpuLease("default", "recsys", "1", spec, status or LeaseStatus())


def world(*, lent_owner: bool = False, healthy: bool = True) -> tuple[list[Device], View]:
    a = builders.devices("a", 8)
    b = builders.devices(
        "b",
        4,
        owner="recsys" if lent_owner else None,
        replica="recsys-2" if lent_owner else None,
        healthy=healthy,
    ) + builders.devices("b", 4, tier=Tier.LA, start=4)
    devs = a + b
    return devs, View({d.uuid: d for d in devs}, {}, {"a": True, "b": True})


def applied(view: View, changes: Iterable[TagChange]) -> View:
    """The view once the controller's tag changes are written (as KubeWorld.set_tags does)."""
    classes = {
        c.uuid: view.devices[c.uuid].cls._replace(
            owner=c.owner, standby=c.standby, replica=c.replica
        )
        for c in changes
    }
    return replace(
        view,
        devices={u: replace(d, cls=classes.get(u, d.cls)) for u, d in view.devices.items()},
    )


def pods(devs: list[Device], n: int) -> list[OwnerPod]:
    # recsys-0 on a[0:4], recsys-1 on a[4:8], recsys-2 on b[0:4], recsys-3 on b[4:8]
    return [
        OwnerPod(
            f"recsys-{i}",
            f"uid-{i}",
            devs[4 * i].node,
            tuple(d.uuid for d in devs[4 * i : 4 * i + 4]),
        )
        for i in range(n)
    ]


def test_steady_waits() -> None:
    devs, view = world()
    assert isinstance(decide(lease(16), 4, pods(devs, 4), view, NOW), Wait)


def test_scale_down_records_then_tags_then_scales() -> None:
    devs, view = world()
    step = decide(lease(8), 4, pods(devs, 4), view, NOW)
    assert isinstance(step, WriteStatus)
    # recsys-2 and -3 go; all their devices are lent, the HA ones (b 0-3) and the LA ones (b 4-7)
    assert step.status.lent == tuple(d.uuid for d in devs[8:16])
    assert (step.status.phase, step.status.target_replicas) == ("Lending", 2)
    recorded = lease(8, step.status)
    step = decide(recorded, 4, pods(devs, 4), view, NOW)
    assert isinstance(step, SetTags)
    assert {(c.node, c.owner) for c in step.changes} == {("b", OWNER)}
    assert len(step.changes) == 8
    tagged = applied(view, step.changes)
    step = decide(recorded, 4, pods(devs, 4), tagged, NOW)
    assert step == ScaleTo(2)
    step = decide(recorded, 2, pods(devs, 2), tagged, NOW)
    assert isinstance(step, WriteStatus)
    assert step.status.phase == "Steady"
    assert step.status.lent == recorded.status.lent


def test_a_deployments_scale_down_marks_the_pods_that_lent_to_go_first() -> None:
    """A ReplicaSet removes the pods of its choice at a scale-down (not those the controller
    recorded as lent: the hour's soak found a lent group whose pod kept running): before it
    scales, the controller gives the released pods the lowest pod-deletion-cost, and takes the
    mark off any other pod that had it."""
    devs, view = world()
    deployment = replace(lease(8).spec, workload=Workload("apps/v1", "Deployment", "recsys"))
    running = [
        replace(p, name=f"recsys-7c9f-{c}", deletion_cost=cost)
        for p, c, cost in zip(pods(devs, 4), "wxyz", (RELEASE_COST, None, None, None), strict=True)
    ]
    step = decide(
        GpuLease("default", "recsys", "1", deployment, LeaseStatus()), 4, running, view, NOW
    )
    assert isinstance(step, WriteStatus)
    released = {g.replica for g in step.status.groups}
    assert released == {"recsys-7c9f-y", "recsys-7c9f-z"}
    recorded = GpuLease("default", "recsys", "1", deployment, step.status)
    step = decide(recorded, 4, running, view, NOW)
    assert isinstance(step, SetTags)
    tagged = applied(view, step.changes)
    step = decide(recorded, 4, running, tagged, NOW)
    assert isinstance(step, MarkRelease)
    assert {(p.name, cost) for p, cost in step.costs} == {
        ("recsys-7c9f-w", None),
        ("recsys-7c9f-y", RELEASE_COST),
        ("recsys-7c9f-z", RELEASE_COST),
    }
    marked = [
        replace(p, deletion_cost=RELEASE_COST if p.name in released else None) for p in running
    ]
    assert decide(recorded, 4, marked, tagged, NOW) == ScaleTo(2)


def lent_status(devs: list[Device]) -> LeaseStatus:
    return LeaseStatus(
        phase="Steady",
        target_replicas=2,
        groups=(LentGroup("recsys-2", tuple(d.uuid for d in devs[8:12])),),
    )


def reclaiming_status(devs: list[Device], *, deadline: float) -> LeaseStatus:
    """recsys-2's group being reclaimed, back to 4 replicas, started at NOW."""
    return replace(
        lent_status(devs),
        phase="Reclaiming",
        reclaiming=("recsys-2",),
        target_replicas=4,
        reclaim_started=NOW,
        reclaim_deadline=deadline,
    )


def test_reclaim_notice_then_wait_then_evict_then_scale() -> None:
    devs, view = world(lent_owner=True)
    borrower = holder("finetune-0", pod_priority=10)
    busy = replace(view, holders={u: borrower for u in lent_status(devs).lent})
    step = decide(lease(16, lent_status(devs)), 2, pods(devs, 2), busy, NOW)
    assert isinstance(step, WriteStatus)
    assert step.status.phase == "Reclaiming"
    assert step.status.reclaim_deadline == NOW + 45
    reclaiming = lease(16, step.status)
    step = decide(reclaiming, 2, pods(devs, 2), busy, NOW + 1)
    assert isinstance(step, Notify)
    assert [p.name for p in step.pods] == ["finetune-0"]
    assert step.deadline == NOW + 45
    noticed = lease(16, step.then)
    assert decide(noticed, 2, pods(devs, 2), busy, NOW + 2) == Wait(
        NOW + 45, "1 borrower(s) have notice"
    )
    step = decide(noticed, 2, pods(devs, 2), busy, NOW + 45)
    assert isinstance(step, Evict)
    assert step.pods == (borrower,)
    # The borrower is gone: scale up.
    assert decide(noticed, 2, pods(devs, 2), view, NOW + 46) == ScaleTo(4)


def test_reclaim_finishes_once_the_owners_pods_are_placed() -> None:
    devs, view = world(lent_owner=True)
    status = reclaiming_status(devs, deadline=NOW + 45)
    placed = [*pods(devs, 3), OwnerPod("recsys-3", "uid-3", "", ())]
    assert isinstance(decide(lease(16, status), 4, placed, view, NOW + 50), Wait)
    step = decide(lease(16, status), 4, pods(devs, 4), view, NOW + 50)
    assert isinstance(step, WriteStatus)
    assert step.status.finalizing
    assert (step.status.returned, step.status.backfilled) == (4, 0)
    step = decide(lease(16, step.status), 4, pods(devs, 4), view, NOW + 51)
    assert isinstance(step, SetTags)
    assert {c.owner for c in step.changes} == {None}
    _, untagged = world()
    done = decide(lease(16, replace(status, finalizing=True)), 4, pods(devs, 4), untagged, NOW + 52)
    assert isinstance(done, WriteStatus)
    assert (done.status.phase, done.status.lent, done.status.reclaims) == ("Steady", (), 1)
    assert done.status.last_reclaim_s == 52


def test_backfilled_standby_devices_are_counted_and_kept_on_loan() -> None:
    devs, view = world(lent_owner=True)
    spare = builders.devices("s", 4, standby=True)
    view = View({**view.devices, **{d.uuid: d for d in spare}}, {}, {**view.offering, "s": True})
    status = reclaiming_status(devs, deadline=NOW)
    placed = [
        *pods(devs, 2),
        OwnerPod("recsys-2", "uid-2", "b", tuple(d.uuid for d in devs[8:12])),
        OwnerPod("recsys-3", "uid-3", "s", tuple(d.uuid for d in spare)),
    ]
    step = decide(lease(16, status), 4, placed, view, NOW + 5)
    assert isinstance(step, WriteStatus)
    assert (step.status.returned, step.status.backfilled) == (4, 4)
    finalizing = step.status
    step = decide(lease(16, finalizing), 4, placed, view, NOW + 6)
    assert isinstance(step, SetTags)
    # the lent devices are the owner's again; the standby ones are its loans, still standby
    assert {(c.node, c.owner, c.standby) for c in step.changes} == {
        ("b", None, False),
        ("s", OWNER, True),
    }
    after = applied(view, step.changes)
    done = decide(lease(16, finalizing), 4, placed, after, NOW + 7)
    assert isinstance(done, WriteStatus)
    assert (done.status.phase, done.status.backfilled) == ("Steady", 4)
    # A later reclaim does not count the loans it did not make.
    later = replace(done.status, phase="Reclaiming", target_replicas=4, reclaiming=())
    step = decide(lease(16, later), 4, placed, after, NOW + 100)
    assert isinstance(step, WriteStatus)
    assert step.status.backfilled == 4


def test_a_released_replica_gives_its_loans_back_to_the_pool() -> None:
    devs, view = world()
    loans = builders.devices("s", 4, standby=True, owner=OWNER)
    view = View({**view.devices, **{d.uuid: d for d in loans}}, {}, {**view.offering, "s": True})
    running = [
        *pods(devs, 3),
        OwnerPod("recsys-3", "uid-3", "s", tuple(d.uuid for d in loans)),
    ]
    step = decide(lease(12), 4, running, view, NOW)
    assert isinstance(step, WriteStatus)
    assert step.status.lent == ()  # loans are not lent
    recorded = step.status
    step = decide(lease(12, recorded), 4, running, view, NOW)
    assert isinstance(step, SetTags)
    assert {(c.node, c.owner, c.standby) for c in step.changes} == {("s", None, True)}
    back = replace(
        view,
        devices={
            **view.devices,
            **{d.uuid: builders.devices("s", 4, standby=True)[d.index] for d in loans},
        },
    )
    assert decide(lease(12, recorded), 4, running, back, NOW) == ScaleTo(3)


def test_a_failed_lent_device_stays_lent_while_a_standby_device_stands_in() -> None:
    """The owner's failed device is still its own: it stays lent (it comes back once repaired)
    and the replica runs on a standby device on loan meanwhile."""
    devs, view = world(lent_owner=True)
    broken = devs[8]
    spare = builders.devices("s", 4, standby=True)
    devices = {**view.devices, **{d.uuid: d for d in spare}}
    devices[broken.uuid] = replace(broken, cls=broken.cls._replace(healthy=False))
    view = View(devices, {}, {**view.offering, "s": True})
    status = replace(reclaiming_status(devs, deadline=NOW), finalizing=True)
    placed = [*pods(devs, 2), OwnerPod("recsys-2", "uid-2", "s", tuple(d.uuid for d in spare))]
    step = decide(lease(16, status), 3, placed, view, NOW + 5)
    assert isinstance(step, SetTags)
    assert {(c.node, c.owner, c.standby) for c in step.changes} == {("s", OWNER, True)}
    marked = replace(
        view,
        devices={
            **devices,
            **{d.uuid: replace(d, cls=d.cls._replace(owner=OWNER)) for d in spare},
        },
    )
    done = decide(lease(16, status), 3, placed, marked, NOW + 6)
    assert isinstance(done, WriteStatus)
    assert done.status.phase == "Steady"
    assert done.status.lent == tuple(d.uuid for d in devs[8:12])
    # it now stands for a replica past the running ones
    assert [g.replica for g in done.status.groups] == ["recsys-4"]


def test_resuming_after_a_notice_was_sent_but_not_recorded() -> None:
    """Killed between notifying and recording: the same borrowers get notice again (the
    annotation is idempotent) and the deadline does not move."""
    devs, view = world(lent_owner=True)
    borrower = holder("finetune-0")
    busy = replace(view, holders={devs[8].uuid: borrower})
    status = reclaiming_status(devs, deadline=NOW + 30)
    step = decide(lease(16, status), 2, pods(devs, 2), busy, NOW + 10)
    assert isinstance(step, Notify)
    assert step.deadline == NOW + 30
    recorded = replace(status, noticed=(Notice("default", "finetune-0", borrower.pod_uid),))
    assert isinstance(decide(lease(16, recorded), 2, pods(devs, 2), busy, NOW + 10), Wait)


def test_high_priority_squatters_are_never_evicted() -> None:
    devs, view = world(lent_owner=True)
    squatter = Holder(
        "uid-sq",
        "default",
        "other-hp",
        Priority.HIGH,
        5000,
        JobKey("other"),
    )
    busy = replace(view, holders={devs[8].uuid: squatter})
    status = reclaiming_status(devs, deadline=NOW)
    assert decide(lease(16, status), 2, pods(devs, 2), busy, NOW + 1) == ScaleTo(4)


async def test_standby_top_up_through_the_controller() -> None:

    from prometheus_client import CollectorRegistry

    from extender.cluster.testing import FixedView
    from extender.leasing.controller import LeaseController
    from extender.leasing.metrics import LeasingMetrics
    from tests.unit.cluster import allocate, cluster

    state = cluster(
        builders.gpu_node("pool", builders.devices("pool", 2, standby=True)),
        builders.gpu_node("busy"),
        builders.gpu_node("idle"),
    )
    allocate(state, "busy", [(holder("x"), [builders.device_uuid("busy", i) for i in range(8)])])
    changes: list[TagChange] = []

    class Recorder:
        async def set_tags(self, batch: Iterable[TagChange]) -> None:
            changes.extend(batch)

    controller = LeaseController(
        view=FixedView(state),
        leases=granted_leases(),
        world=Recorder(),  # type: ignore[arg-type]
        metrics=LeasingMetrics(CollectorRegistry()),
        standby_targets={("H20", Tier.HA): 5},
    )
    assert await controller.top_up_standby() == 3
    assert {(c.node, c.standby) for c in changes} == {("idle", True)}


async def test_standby_beyond_its_target_goes_back_through_the_controller() -> None:
    """Loans given back leave the pool above its target: free standby devices go back to the
    platform, from the nodes with the fewest first (whole standby nodes are kept); devices a
    replica still holds on loan stay."""

    from prometheus_client import CollectorRegistry

    from extender.cluster.testing import FixedView
    from extender.leasing.controller import LeaseController
    from extender.leasing.metrics import LeasingMetrics
    from tests.unit.cluster import allocate, cluster

    state = cluster(
        builders.gpu_node("pool", builders.devices("pool", 4, standby=True)),
        builders.gpu_node("loan", builders.devices("loan", 3, standby=True)),
    )
    allocate(state, "loan", [(holder("x"), [builders.device_uuid("loan", 0)])])
    changes: list[TagChange] = []

    class Recorder:
        async def set_tags(self, batch: Iterable[TagChange]) -> None:
            changes.extend(batch)

    controller = LeaseController(
        view=FixedView(state),
        leases=granted_leases(),
        world=Recorder(),  # type: ignore[arg-type]
        metrics=LeasingMetrics(CollectorRegistry()),
        standby_targets={("H20", Tier.HA): 5},
    )
    assert await controller.top_up_standby() == 2
    assert {(c.node, c.uuid, c.standby) for c in changes} == {
        ("loan", builders.device_uuid("loan", i), False) for i in (1, 2)
    }


def test_a_partial_scale_up_reclaims_only_the_returning_replicas_devices() -> None:
    """1 of 3 replicas running, 2 lent (recsys-1 on a, recsys-2 on b); scaling to 2 reclaims
    recsys-1's devices only: recsys-2's stay lent, their borrower untouched."""
    devs, view = world(lent_owner=True)
    a_lent = tuple(d.uuid for d in devs[4:8])
    b_lent = tuple(d.uuid for d in devs[8:12])
    status = LeaseStatus(
        phase="Steady",
        target_replicas=1,
        groups=(LentGroup("recsys-1", a_lent), LentGroup("recsys-2", b_lent)),
    )
    on_b = holder("borrower-b")
    on_a = holder("borrower-a")
    tagged_a = applied(view, (TagChange("a", u, OWNER, False, "recsys-1") for u in a_lent))
    busy = replace(tagged_a, holders={a_lent[0]: on_a, b_lent[0]: on_b})
    start = decide(lease(8, status), 1, pods(devs, 1), busy, NOW)
    assert isinstance(start, WriteStatus)
    step = decide(lease(8, start.status), 1, pods(devs, 1), busy, NOW + 1)
    assert isinstance(step, Notify)
    assert [p.name for p in step.pods] == ["borrower-a"]
    # recsys-1 back on a's lent devices: finish, keeping recsys-2's group lent.
    back = [
        OwnerPod("recsys-0", "uid-0", "a", tuple(d.uuid for d in devs[0:4])),
        OwnerPod("recsys-1", "uid-1", "a", a_lent),
    ]
    fin = replace(start.status, finalizing=True)
    step = decide(lease(8, fin), 2, back, tagged_a, NOW + 5)
    assert isinstance(step, SetTags)
    assert {c.uuid for c in step.changes} == set(a_lent)  # b's tags stay
    done = decide(lease(8, fin), 2, back, view, NOW + 6)  # a's tags cleared
    assert isinstance(done, WriteStatus)
    assert done.status.groups == (LentGroup("recsys-2", b_lent),)
    assert done.status.phase == "Steady"


def test_reclaim_takes_back_free_groups_first_and_keeps_the_rest_lent() -> None:
    from extender.leasing.decisions import choose_groups, relabel

    devs, view = world(lent_owner=True)
    g1 = LentGroup("recsys-1", tuple(d.uuid for d in devs[4:8]))  # a: a borrower on it
    g2 = LentGroup("recsys-2", tuple(d.uuid for d in devs[8:12]))  # b: free
    busy = replace(view, holders={devs[4].uuid: holder("borrower")})
    assert choose_groups([g1, g2], 1, busy) == [g2]
    assert choose_groups([g1, g2], 2, busy) == [g2, g1]
    # After recsys-1 came back on g2's devices, g1 is still lent, now as recsys-2's.
    assert relabel([g1], 2) == (LentGroup("recsys-2", g1.devices),)
    assert relabel([g2], 2) == (g2,)


def test_a_reclaim_takes_back_the_group_that_breaks_no_gang() -> None:
    """One borrower on each group: g1's is a member of a gang whose other member borrows
    elsewhere, g2's runs alone. Taking g2 back evicts one pod; g1, a gang of two."""
    from extender.leasing.decisions import choose_groups

    devs, view = world(lent_owner=True)
    g1 = LentGroup("recsys-1", tuple(d.uuid for d in devs[4:8]))
    g2 = LentGroup("recsys-2", tuple(d.uuid for d in devs[8:12]))
    gang = "batch/pod-group/sweep"
    member = replace(holder("member-0"), gang=gang)
    mate = replace(holder("member-1"), gang=gang)
    holders = {devs[4].uuid: member, devs[8].uuid: holder("alone"), devs[0].uuid: mate}
    assert choose_groups([g1, g2], 1, replace(view, holders=holders)) == [g2]
    # Without the gang, the first by ordinal (equal costs): g1.
    plain = {devs[4].uuid: holder("member-0"), devs[8].uuid: holder("alone")}
    assert choose_groups([g1, g2], 1, replace(view, holders=plain)) == [g1]


async def test_an_unexpected_error_on_one_lease_is_logged_and_the_others_go_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from prometheus_client import CollectorRegistry

    from extender.cluster.testing import FixedView
    from extender.leasing.controller import LeaseController
    from extender.leasing.metrics import LeasingMetrics
    from tests.unit.cluster import cluster

    leases = granted_leases()
    for name in ("broken", "fine"):
        leases.apply("ADDED", builders.gpu_lease(name, "ns", gpus_per_replica=4, desired_gpus=8))
    asked: list[str] = []

    class World:
        async def replicas(self, namespace: str, workload: Workload) -> int:
            asked.append(workload.name)
            if workload.name == "broken":
                raise RuntimeError("a bug")
            return 2

    controller = LeaseController(
        view=FixedView(cluster(builders.gpu_node("n"))),
        leases=leases,
        world=World(),  # type: ignore[arg-type]
        metrics=LeasingMetrics(CollectorRegistry()),
        clock=lambda: NOW,
    )
    # One pass of the controller's reconcile loop over every lease; when it would run next
    # (the earliest retry or requeue), as a time on the controller's clock.
    await controller.loop.run_once()
    due = controller.loop.next_due_in()
    wake = NOW + due if due is not None else float("inf")
    assert sorted(asked) == ["broken", "fine"]
    assert wake <= NOW + 2.0
    assert "lease ns/broken: unexpected error (retrying)" in caplog.text


# --- the controller on its reconcile loop ---


def raw_lease(name: str) -> dict[str, object]:
    """A GpuLease as the watch brings it: 2 replicas of 4 GPUs wanted, no status yet."""
    return builders.gpu_lease(name, "ns", gpus_per_replica=4, desired_gpus=8, resource_version="1")


class TwoReplicas:
    """A world whose workloads run 2 replicas, recording the tag changes asked; ``broken``
    makes set_tags fail as an unreachable API server would."""

    def __init__(self) -> None:
        self.tags: list[TagChange] = []
        self.broken = False

    async def replicas(self, namespace: str, workload: Workload) -> int:
        return 2

    async def set_tags(self, changes: Iterable[TagChange]) -> None:
        from common.errors import Unavailable

        if self.broken:
            raise Unavailable("the API server is down")
        self.tags.extend(changes)


async def test_each_lease_is_a_key_its_events_queue_and_its_step_says_when_next() -> None:
    from prometheus_client import CollectorRegistry

    from common.reconcile import Requeue
    from extender.cluster.testing import FixedView
    from extender.leasing.controller import STANDBY_KEY, LeaseController
    from extender.leasing.metrics import LeasingMetrics
    from tests.unit.cluster import cluster

    leases = granted_leases()
    leases.apply("ADDED", raw_lease("a"))  # before the controller: listed by keys() instead
    controller = LeaseController(
        view=FixedView(cluster(builders.gpu_node("n"))),
        leases=leases,
        world=TwoReplicas(),  # type: ignore[arg-type]
        metrics=LeasingMetrics(CollectorRegistry()),
        clock=lambda: NOW,
    )
    assert controller.keys() == ["ns/a"]  # no standby targets: no standby key
    assert controller.loop.depth == 0
    leases.apply("ADDED", raw_lease("b"))
    leases.apply("MODIFIED", raw_lease("b"))
    assert controller.loop.depth == 1  # two events, one key
    # Steady (2 replicas wanted, 2 running): stepped again at its Wait's time, 30 s on.
    assert await controller.reconcile("ns/b") == Requeue(30.0)
    leases.apply("DELETED", raw_lease("b"))
    assert controller.keys() == ["ns/a"]
    assert await controller.reconcile("ns/b") is None  # gone: nothing to step
    assert STANDBY_KEY not in leases.raw  # the standby key is never a lease's


async def test_the_standby_key_tops_up_once_per_interval_and_retries_a_failure() -> None:
    from prometheus_client import CollectorRegistry

    from common.errors import Unavailable
    from common.reconcile import Requeue
    from extender.cluster.testing import FixedView
    from extender.leasing.controller import STANDBY_KEY, LeaseController
    from extender.leasing.metrics import LeasingMetrics
    from tests.unit.cluster import cluster

    now = NOW
    world = TwoReplicas()
    controller = LeaseController(
        view=FixedView(cluster(builders.gpu_node("idle"))),
        leases=granted_leases(),
        world=world,  # type: ignore[arg-type]
        metrics=LeasingMetrics(CollectorRegistry()),
        clock=lambda: now,
        standby_targets={("H20", Tier.HA): 2},
        standby_interval_s=60.0,
    )
    assert controller.keys() == [STANDBY_KEY]
    world.broken = True
    with pytest.raises(Unavailable):
        await controller.reconcile(STANDBY_KEY)  # the loop retries it with backoff
    world.broken = False
    assert await controller.reconcile(STANDBY_KEY) == Requeue(60.0)  # the retry does the work
    assert len(world.tags) == 2
    now += 30.0  # a resync before the interval is over: nothing written, asked back at 60 s
    assert await controller.reconcile(STANDBY_KEY) == Requeue(30.0)
    assert len(world.tags) == 2
    now += 30.0
    assert await controller.reconcile(STANDBY_KEY) == Requeue(60.0)  # due: topped up again
    assert len(world.tags) == 4  # (this world does not write the tags back into the view)


# --- right of return per replica ---


def three_groups(*, broken: bool) -> tuple[View, tuple[LentGroup, ...]]:
    """recsys-1, -2 and -3 lent, on nodes a, b and c; recsys-1's group with an unhealthy
    device when ``broken``."""
    groups = tuple(
        LentGroup(f"recsys-{i}", tuple(d.uuid for d in builders.devices(node, 4)))
        for i, node in ((1, "a"), (2, "b"), (3, "c"))
    )
    devices = {}
    for g, node in zip(groups, "abc", strict=True):
        for d in builders.devices(node, 4, owner=OWNER, replica=g.replica):
            sick = broken and node == "a" and d.index == 0
            devices[d.uuid] = replace(d, cls=d.cls._replace(healthy=False)) if sick else d
    return View(devices, {}, dict.fromkeys("abc", True)), groups


@pytest.mark.parametrize(
    ("broken", "target", "reclaimed", "renamed"),
    [
        (False, 3, ("recsys-1", "recsys-2"), {}),
        # recsys-1's group cannot come back: recsys-3's (staying lent) stands in, names swap
        (True, 3, ("recsys-1", "recsys-2"), {"recsys-1": "c", "recsys-3": "a"}),
        # nothing stays lent to stand in: recsys-1 takes its own group as it is
        (True, 4, ("recsys-1", "recsys-2", "recsys-3"), {}),
    ],
    ids=["own-groups", "broken-swaps-with-a-spare", "broken-without-a-spare"],
)
def test_a_scale_up_takes_back_each_replicas_own_group(
    broken: bool, target: int, reclaimed: tuple[str, ...], renamed: dict[str, str]
) -> None:
    view, groups = three_groups(broken=broken)
    status = LeaseStatus(phase="Steady", target_replicas=1, groups=groups)
    step = decide(lease(4 * target, status), 1, pods(builders.devices("z", 4), 1), view, NOW)
    assert isinstance(step, WriteStatus)
    assert step.status.reclaiming == reclaimed
    by_name = {g.replica: {view.devices[u].node for u in g.devices} for g in step.status.groups}
    expected = {"recsys-1": "a", "recsys-2": "b", "recsys-3": "c"} | renamed
    assert by_name == {name: {node} for name, node in expected.items()}
    # The tags follow the names before any borrower is told: each device says its group.
    step2 = decide(lease(4 * target, step.status), 1, pods(builders.devices("z", 4), 1), view, NOW)
    if renamed:
        assert isinstance(step2, SetTags)
        assert {(c.node, c.replica) for c in step2.changes} == {
            (node, name) for name, node in renamed.items()
        }
        step2 = decide(
            lease(4 * target, step.status),
            1,
            pods(builders.devices("z", 4), 1),
            applied(view, step2.changes),
            NOW,
        )
    assert step2 == ScaleTo(target)


def test_a_deployment_takes_back_the_cheapest_groups() -> None:
    view, groups = three_groups(broken=True)
    deployment = Workload("apps/v1", "Deployment", "recsys")
    spec = replace(lease(8).spec, workload=deployment)
    status = LeaseStatus(phase="Steady", target_replicas=1, groups=groups)
    busy = replace(view, holders={groups[1].devices[0]: holder("finetune")})
    step = decide(
        GpuLease("ml", "recsys", "1", spec, status), 1, pods(builders.devices("z", 4), 1), busy, NOW
    )
    assert isinstance(step, WriteStatus)
    assert step.status.groups == groups  # no renaming
    assert step.status.reclaiming == ("recsys-3",)  # healthy and free: the cheapest


def test_steady_tags_follow_the_recorded_groups() -> None:
    view, groups = three_groups(broken=False)
    untagged = applied(
        view, (TagChange(view.devices[u].node, u, OWNER, False) for u in groups[0].devices)
    )
    status = LeaseStatus(phase="Steady", target_replicas=1, groups=groups)
    step = decide(lease(4, status), 1, pods(builders.devices("z", 4), 1), untagged, NOW)
    assert isinstance(step, SetTags)
    assert {(c.uuid, c.owner, c.replica) for c in step.changes} == {
        (u, OWNER, "recsys-1") for u in groups[0].devices
    }
    assert isinstance(
        decide(lease(4, status), 1, pods(builders.devices("z", 4), 1), view, NOW), Wait
    )
