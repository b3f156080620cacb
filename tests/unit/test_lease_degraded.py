"""A GpuLease is Degraded while a reclaim runs past its borrowers' notice: the pure rule, the
condition the controller writes (once per change, not at every step) and the gauges an alert
reads."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from prometheus_client import CollectorRegistry

from common import builders
from common.model import Tier
from common.timefmt import microtime
from extender.cluster.testing import FixedView
from extender.leasing.controller import LeaseCache, LeaseController
from extender.leasing.decisions import OwnerPod, TagChange, Wait, overdue
from extender.leasing.metrics import LeasingMetrics
from extender.rightofreturn.lease import (
    GpuLease,
    LeaseStatus,
    Trouble,
    Workload,
    lease_conditions,
    parse_gpu_lease,
)
from tests.unit.cluster import cluster, granted_leases

NOW = 1_800_000_000.0


def reclaiming(
    deadline: float, *, conditions: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """A lease reclaiming 2 replicas of 4 GPUs, its borrowers' notice ending at ``deadline``."""
    raw = builders.gpu_lease(
        "recsys", "ns", gpus_per_replica=4, desired_gpus=8, resource_version="7"
    )
    raw["status"] = {
        "phase": "Reclaiming",
        "targetReplicas": 2,
        "reclaim": {
            "startedAt": microtime(deadline - 45),
            "deadline": microtime(deadline),
            "groups": ["recsys-1"],
        },
    }
    if conditions is not None:
        raw["status"]["conditions"] = conditions
    return raw


def test_overdue_only_after_the_threshold_past_the_notice() -> None:
    lease = parse_gpu_lease(reclaiming(NOW - 100))
    pods = [OwnerPod("recsys-0", "u0", "n1", ()), OwnerPod("recsys-1", "u1", "", ())]
    assert overdue(lease, pods, NOW, after_s=120) is None
    trouble = overdue(lease, pods, NOW + 20, after_s=120)
    assert trouble == Trouble(
        "ReclaimOverdue",
        "the reclaim of recsys-1 is 120 s past the borrowers' notice; 0 of 2 owner pod(s) placed",
    )
    steady = parse_gpu_lease(builders.gpu_lease("x", "ns", gpus_per_replica=4, desired_gpus=8))
    assert overdue(steady, pods, NOW + 1e6, after_s=1) is None


def test_the_degraded_condition_and_its_reason_read_back() -> None:
    status = LeaseStatus(phase="Reclaiming", reclaim_deadline=NOW)
    trouble = Trouble("ReclaimOverdue", "late")
    conditions = lease_conditions(status, None, 3, NOW, trouble)
    degraded = next(c for c in conditions if c["type"] == "Degraded")
    assert (degraded["status"], degraded["reason"], degraded["message"]) == (
        "True",
        "ReclaimOverdue",
        "late",
    )
    assert parse_gpu_lease(reclaiming(NOW, conditions=conditions)).degraded == "ReclaimOverdue"
    cleared = lease_conditions(status, conditions, 3, NOW + 5)
    degraded = next(c for c in cleared if c["type"] == "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("False", "AsExpected")
    assert parse_gpu_lease(reclaiming(NOW, conditions=cleared)).degraded is None


class Recorder:
    """A world whose workload runs its 2 replicas (none of them placed), recording statuses."""

    def __init__(self) -> None:
        self.written: list[tuple[LeaseStatus, Trouble | None]] = []
        self.tags: list[TagChange] = []

    async def replicas(self, namespace: str, workload: Workload) -> int:
        return 2

    async def set_tags(self, changes: Iterable[TagChange]) -> None:
        self.tags.extend(changes)

    async def write_status(
        self, lease: GpuLease, status: LeaseStatus, degraded: Trouble | None = None
    ) -> None:
        self.written.append((status, degraded))


def controller(world: Recorder, leases: LeaseCache, registry: CollectorRegistry) -> LeaseController:
    return LeaseController(
        view=FixedView(cluster(builders.gpu_node("n"))),
        leases=leases,
        world=world,  # type: ignore[arg-type]
        metrics=LeasingMetrics(registry),
        clock=lambda: NOW,
        overdue_after_s=60,
    )


async def test_a_waiting_reclaim_past_the_threshold_writes_degraded_once() -> None:
    world, leases, registry = Recorder(), granted_leases(), CollectorRegistry()
    ctl = controller(world, leases, registry)
    leases.apply("ADDED", reclaiming(NOW - 90))
    lease = parse_gpu_lease(leases.raw["ns/recsys"])
    action = await ctl.step(lease)
    assert isinstance(action, Wait)  # 0 of 2 pods placed
    assert len(world.written) == 1
    status, trouble = world.written[0]
    assert status == lease.status  # only the condition changes
    assert trouble is not None
    assert trouble.reason == "ReclaimOverdue"
    # The alert's gauge: 90 s past the notice.
    assert (
        registry.get_sample_value(
            "tidelease_leasing_reclaim_overdue_seconds", {"lease": "ns/recsys"}
        )
        == 90
    )

    # Stored as Degraded: waiting again writes nothing.
    conditions = lease_conditions(lease.status, None, 1, NOW, trouble)
    leases.apply("MODIFIED", reclaiming(NOW - 90, conditions=conditions))
    await ctl.step(parse_gpu_lease(leases.raw["ns/recsys"]))
    assert len(world.written) == 1

    # Within the threshold but stored as Degraded (say, a new reclaim): the condition clears.
    leases.apply("MODIFIED", reclaiming(NOW - 10, conditions=conditions))
    await ctl.step(parse_gpu_lease(leases.raw["ns/recsys"]))
    assert [t for _, t in world.written] == [trouble, None]
    assert (
        registry.get_sample_value(
            "tidelease_leasing_reclaim_overdue_seconds", {"lease": "ns/recsys"}
        )
        == 10
    )


async def test_the_standby_gauges_show_the_pool_after_a_top_up_and_its_target() -> None:
    world, registry = Recorder(), CollectorRegistry()
    ctl = LeaseController(
        view=FixedView(cluster(builders.gpu_node("idle"))),
        leases=granted_leases(),
        world=world,  # type: ignore[arg-type]
        metrics=LeasingMetrics(registry),
        clock=lambda: NOW,
        standby_targets={("H20", Tier.HA): 2, ("A100", Tier.MA): 1},
    )
    labels = {"gpu_type": "H20", "tier": "HA"}
    assert registry.get_sample_value("tidelease_leasing_standby_target_gpus", labels) == 2
    assert await ctl.top_up_standby() == 2
    assert registry.get_sample_value("tidelease_leasing_standby_gpus", labels) == 2
    # No A100 to add: its pool stays empty, below its target.
    short = {"gpu_type": "A100", "tier": "MA"}
    assert registry.get_sample_value("tidelease_leasing_standby_gpus", short) == 0
    assert registry.get_sample_value("tidelease_leasing_standby_target_gpus", short) == 1


async def test_the_write_that_ends_an_overdue_reclaim_clears_degraded() -> None:
    """The status written is judged, not the one it replaces: a reclaim done late is Steady and
    no longer Degraded in the same write."""
    world, leases, registry = Recorder(), granted_leases(), CollectorRegistry()
    ctl = controller(world, leases, registry)
    raw = reclaiming(NOW - 300)
    raw["status"]["reclaim"]["finalizing"] = True  # every pod placed; the tags are clear
    leases.apply("ADDED", raw)
    await ctl.step(parse_gpu_lease(leases.raw["ns/recsys"]))
    ((status, trouble),) = world.written
    assert status.phase == "Steady"
    assert trouble is None
