"""Dawn: many leases reclaim at once (docs/performance.md, "Dawn"). The leasing controller steps
up to ``leasing_workers`` leases at once, and a step's notices and evictions go out together;
each one is still tried when another fails, and the step fails with the first error."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

import pytest
from prometheus_client import CollectorRegistry

from common import builders
from common.errors import InvalidInput, Unavailable
from common.model import Holder
from extender.cluster.testing import FixedView
from extender.leasing.controller import LeaseController, _LeaseWrites
from extender.leasing.decisions import Evict, Notify, TagChange
from extender.leasing.metrics import LeasingMetrics
from extender.rightofreturn.lease import Workload, parse_gpu_lease
from extender.scheduler.settings import load_settings
from tests.unit.cluster import cluster, granted_leases, holder
from tests.unit.test_lending import NOW, raw_lease


class Gate:
    """A world whose calls wait until ``want`` of them are in flight at once (or time out):
    what a serial controller could never reach."""

    def __init__(self, want: int, fail: set[str] | None = None) -> None:
        self.want, self.fail = want, fail or set()
        self.in_flight = self.most = 0
        self.done: list[str] = []
        self._all_in = asyncio.Event()

    async def _call(self, what: str) -> None:
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        if self.in_flight >= self.want:
            self._all_in.set()
        try:
            await asyncio.wait_for(self._all_in.wait(), timeout=0.5)
        finally:
            self.in_flight -= 1
        if what in self.fail:
            raise Unavailable(f"{what}: the API server is down")
        self.done.append(what)

    async def notify(self, pod: Holder, lease: object, deadline: float) -> None:
        await self._call(f"notify {pod.name}")

    async def evict(self, pod: Holder, lease: object) -> None:
        await self._call(f"evict {pod.name}")

    async def write_status(self, lease: object, status: object, trouble: object) -> None:
        self.done.append("status")

    async def replicas(self, namespace: str, workload: Workload) -> int:
        await self._call(f"replicas of {workload.name}")
        return 2

    async def set_tags(self, changes: Iterable[TagChange]) -> None:
        pass


def controller(world: object, workers: int = 16) -> LeaseController:
    return LeaseController(
        view=FixedView(cluster(builders.gpu_node("n"))),
        leases=granted_leases(),
        world=world,  # type: ignore[arg-type]
        metrics=LeasingMetrics(CollectorRegistry()),
        clock=lambda: NOW,
        workers=workers,
    )


def evictions(c: LeaseController) -> float | None:
    return c.metrics.registry.get_sample_value("tidelease_leasing_evictions_total")


BORROWERS = tuple(holder(f"b{i}") for i in range(4))


async def test_a_steps_borrowers_are_evicted_together() -> None:
    world = Gate(want=len(BORROWERS))
    c = controller(world)
    writes = _LeaseWrites(c, parse_gpu_lease(raw_lease("a")), (), NOW)
    await writes.evict(Evict(BORROWERS))
    assert world.most == len(BORROWERS)
    assert sorted(world.done) == sorted(f"evict {b.name}" for b in BORROWERS)
    assert evictions(c) == len(BORROWERS)


async def test_one_failed_eviction_fails_the_step_but_every_other_is_tried() -> None:
    world = Gate(want=len(BORROWERS), fail={"evict b1"})
    c = controller(world)
    writes = _LeaseWrites(c, parse_gpu_lease(raw_lease("a")), (), NOW)
    with pytest.raises(Unavailable, match="evict b1"):
        await writes.evict(Evict(BORROWERS))
    assert sorted(world.done) == sorted(f"evict {b.name}" for b in BORROWERS if b.name != "b1")
    assert evictions(c) == len(BORROWERS) - 1


async def test_notices_go_out_together_and_the_status_is_written_after_them_all() -> None:
    world = Gate(want=len(BORROWERS))
    c = controller(world)
    lease = parse_gpu_lease(raw_lease("a"))
    writes = _LeaseWrites(c, lease, (), NOW)
    await writes.notify(Notify(BORROWERS, NOW + 30, lease.status))
    assert world.most == len(BORROWERS)
    assert world.done[-1] == "status"
    # A failed notice: no status recording the notices (they are given again next step).
    world = Gate(want=len(BORROWERS), fail={"notify b2"})
    writes = _LeaseWrites(controller(world), lease, (), NOW)
    with pytest.raises(Unavailable):
        await writes.notify(Notify(BORROWERS, NOW + 30, lease.status))
    assert "status" not in world.done


@pytest.mark.parametrize("workers", [1, 3])
async def test_leases_are_stepped_up_to_leasing_workers_at_once(workers: int) -> None:
    world = Gate(want=3)
    c = controller(world, workers=workers)
    for name in ("a", "b", "c"):
        c.leases.apply("ADDED", raw_lease(name))
    await c.loop.run_once()
    assert world.most == workers  # with one worker the gate times out for each lease alone
    assert sorted(world.done) == (
        ["replicas of a", "replicas of b", "replicas of c"] if workers == 3 else []
    )


def test_the_leasing_workers_setting() -> None:
    assert load_settings(env={}).leasing_workers == 16
    assert load_settings(env={"TIDELEASE_EXTENDER_LEASING_WORKERS": "4"}).leasing_workers == 4
    with pytest.raises(InvalidInput, match="leasing_workers must be at least 1"):
        load_settings(env={"TIDELEASE_EXTENDER_LEASING_WORKERS": "0"})


def test_an_owners_pod_steps_its_reclaiming_lease_at_once() -> None:
    """A reclaim waiting for its replicas is stepped on their pods' events, not at its next poll
    (at dawn each second of polling is a second late); a lease not reclaiming, another
    namespace's job of the same name and a lease deleted are not."""
    c = controller(Gate(want=1))
    c.leases.on_change = None  # the leases' own events queue nothing here
    reclaiming = raw_lease("a")
    reclaiming["status"] = {"phase": "Reclaiming"}
    steady = builders.gpu_lease("b", "ns", gpus_per_replica=4, desired_gpus=8)
    steady["status"] = {"phase": "Steady"}
    elsewhere = builders.gpu_lease("a", "other", gpus_per_replica=4, desired_gpus=8)
    elsewhere["status"] = {"phase": "Reclaiming"}
    for raw in (reclaiming, steady, elsewhere):
        c.leases.apply("ADDED", raw)
    assert c.leases.of_owner("ns", "a") == ("ns/a",)
    c._pod_changed(builders.pod("b-1", 4, namespace="ns", owner="b"))
    c._pod_changed(builders.pod("x", 4, namespace="ns"))  # no owner
    assert c.loop.depth == 0
    c._pod_changed(builders.pod("a-1", 4, namespace="ns", owner="a"))
    assert c.loop.depth == 1
    c.leases.apply("DELETED", reclaiming)
    assert c.leases.of_owner("ns", "a") == ()
    assert c.leases.of_owner("other", "a") == ("other/a",)


async def test_a_borrower_evicted_is_not_evicted_again_before_the_watch_shows_it_leaving() -> None:
    """The step after an eviction may see the borrower still there (its deletion not yet
    watched): it waits rather than evict twice, steps as soon as the pod terminates, and evicts
    again only once EVICTED_RECENTLY_S have passed. A failed eviction is tried again at once."""
    from extender.leasing.controller import EVICTED_RECENTLY_S
    from extender.leasing.decisions import Wait

    world = Gate(want=1, fail={"evict b1"})
    c = controller(world)
    c.leases.on_change = None
    lease = parse_gpu_lease(raw_lease("a"))
    with pytest.raises(Unavailable):
        await _LeaseWrites(c, lease, (), NOW).evict(Evict(BORROWERS[:2]))
    again = c._not_twice(lease, Evict(BORROWERS[:2]), NOW + 0.1)
    assert again == Evict((BORROWERS[1],))  # b0 went; b1 failed, so it is asked again
    assert isinstance(c._not_twice(lease, Evict((BORROWERS[0],)), NOW + 0.1), Wait)
    terminating = builders.pod("b0", 4, namespace="ns", uid=BORROWERS[0].pod_uid)
    c._pod_changed(terminating)
    assert c.loop.depth == 0  # not terminating yet
    terminating["metadata"]["deletionTimestamp"] = "2026-11-30T00:00:00Z"
    c._pod_changed(terminating)
    assert c.loop.depth == 1  # its lease steps now
    later = NOW + EVICTED_RECENTLY_S + 1
    assert c._not_twice(lease, Evict((BORROWERS[0],)), later) == Evict((BORROWERS[0],))
