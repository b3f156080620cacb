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
