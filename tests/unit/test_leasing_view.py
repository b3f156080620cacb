"""The leasing controller's view is watched only while it has something to act on: GpuLeases
are always watched; pods, GpuNodes, ledgers and agents' Leases only while a GpuLease exists or
standby targets are set. Over a MemoryStore, which counts who watches what."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from common import builders
from extender.cluster.store import KINDS, Kind, MemoryStore
from extender.cluster.testing import FixedView
from extender.cluster.watching import DemandView
from extender.controllers import Enabled, Running, controllers
from extender.leasing.controller import VIEW_KINDS, LeaseController
from extender.leasing.decisions import TagChange
from extender.leasing.metrics import LeasingMetrics
from extender.rightofreturn.lease import Workload
from extender.scheduler.settings import ExtenderSettings
from tests.unit.cluster import cluster, granted_leases

NODES = 3


def gpu_lease(name: str) -> dict[str, Any]:
    """A GpuLease wanting the 2 replicas of 4 GPUs its workload runs: Steady at once."""
    return builders.gpu_lease(name, "ns", gpus_per_replica=4, desired_gpus=8)


class World:
    """Two replicas per workload; records, for each step, what the view held when it ran."""

    def __init__(self) -> None:
        self.view: DemandView | FixedView | None = None
        self.seen: list[tuple[bool, int]] = []  # (the view synced, its nodes) at each step
        self.tags: list[TagChange] = []

    async def replicas(self, namespace: str, workload: Workload) -> int:
        assert self.view is not None
        self.seen.append((self.view.synced.is_set(), len(self.view.cluster)))
        return 2

    async def set_tags(self, changes: Iterable[TagChange]) -> None:
        self.tags.extend(changes)


def watched(store: MemoryStore) -> set[Kind]:
    return {kind for kind in KINDS if store.watchers(kind)}


async def until(check: Callable[[], bool]) -> None:
    """Let the event loop turn until ``check()`` holds (no clock: only tasks' turns)."""
    for _ in range(2_000):
        if check():
            return
        await asyncio.sleep(0)
    raise AssertionError("not true after 2,000 turns of the event loop")


def a_busy_cluster() -> MemoryStore:
    """GpuNodes with their agents' Leases, and 200 GPU pods: what a scale run looks like."""
    store = MemoryStore([builders.namespace("ns")])  # granted online jobs: its leases step
    for i in range(NODES):
        store.put(builders.gpu_node(f"n{i}"))
    for i in range(200):
        store.put(builders.pod(f"p{i}", 1, node_name=f"n{i % NODES}"))
    return store


@asynccontextmanager
async def leasing(
    store: MemoryStore, world: World, registry: CollectorRegistry, **settings: Any
) -> AsyncIterator[Running]:
    async with controllers(
        store=store,
        world=world,  # type: ignore[arg-type]
        kube=None,  # type: ignore[arg-type]  # only the other controllers use it
        settings=ExtenderSettings(**settings),
        enabled=Enabled(leasing=True),
        registry=registry,
    ) as running:
        assert running.view is not None
        world.view = running.view
        yield running


async def test_without_a_gpulease_only_gpuleases_are_watched_and_a_lease_starts_the_view(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store, world, registry = a_busy_cluster(), World(), CollectorRegistry()
    async with leasing(store, world, registry) as running:
        view = running.view
        assert view is not None
        await store.settle()
        # GpuLeases, and the Namespaces an admin granted online jobs (only their leases step).
        assert watched(store) == {"GpuLease", "Namespace"}
        for i in range(200, 400):  # pods keep coming: nobody here parses them
            store.put(builders.pod(f"p{i}", 1, node_name="n0"))
        await store.settle()
        assert watched(store) == {"GpuLease", "Namespace"}
        assert (view.active, len(view.cluster), len(view.pods.by_uid)) == (False, 0, 0)
        assert registry.get_sample_value("tidelease_leasing_view_active") == 0

        # The first GpuLease: the view starts afresh; the lease is stepped on the listed view.
        store.put(gpu_lease("recsys"))
        await until(lambda: bool(world.seen))
        assert world.seen[0] == (True, NODES)
        assert watched(store) == {"GpuLease", "Namespace", *VIEW_KINDS}
        assert len(view.pods.by_uid) == 400
        assert registry.get_sample_value("tidelease_leasing_view_active") == 1

        # A second lease changes nothing; deleting the first leaves the view running.
        store.put(gpu_lease("ranker"))
        store.delete("GpuLease", "ns", "recsys")
        await store.settle()
        assert view.active
        assert store.watchers("Pod") == 1

        # The last GpuLease gone: the view is dropped and its watches stopped.
        store.delete("GpuLease", "ns", "ranker")
        await until(lambda: not view.active)
        assert watched(store) == {"GpuLease", "Namespace"}
        assert (len(view.cluster), len(view.pods.by_uid), view.synced.is_set()) == (0, 0, False)
        assert registry.get_sample_value("tidelease_leasing_view_active") == 0
    starts = [r.message for r in caplog.records if r.message.startswith("leasing view: ")]
    assert starts == [
        "leasing view: watching Pod, GpuNode, GpuAllocation, Lease: GpuLease ns/recsys exists",
        "leasing view: stopped watching: no GpuLease and no standby targets",
    ]


async def test_a_lease_created_again_gets_a_fresh_view() -> None:
    store, world = a_busy_cluster(), World()
    async with leasing(store, world, CollectorRegistry()) as running:
        view = running.view
        assert view is not None
        store.put(gpu_lease("recsys"))
        await until(lambda: view.synced.is_set())
        first = view.cluster
        store.delete("GpuLease", "ns", "recsys")
        await until(lambda: not view.active)
        store.delete("GpuNode", "", "n0")  # while nobody watched
        store.put(gpu_lease("recsys"))
        await until(lambda: view.synced.is_set())
        assert view.cluster is not first
        assert sorted(s.node for s in view.cluster) == ["n1", "n2"]


async def test_standby_targets_keep_the_view_watched_with_no_lease() -> None:
    store, world = a_busy_cluster(), World()
    async with leasing(store, world, CollectorRegistry(), standby={"H20/HA": 2}) as running:
        assert running.view is not None
        await until(lambda: bool(world.tags))  # the top-up ran, on the synced view
        assert watched(store) == {"GpuLease", "Namespace", *VIEW_KINDS}
        assert len(world.tags) == 2


async def test_a_step_waits_for_the_view_to_have_synced() -> None:
    view = FixedView(cluster(builders.gpu_node("n")), synced=asyncio.Event())
    world = World()
    world.view = view
    leases = granted_leases()
    leases.apply("ADDED", gpu_lease("recsys"))
    controller = LeaseController(
        view=view,
        leases=leases,
        world=world,  # type: ignore[arg-type]
        metrics=LeasingMetrics(CollectorRegistry()),
    )
    step = asyncio.create_task(controller.reconcile("ns/recsys"))
    for _ in range(50):
        await asyncio.sleep(0)
    assert not step.done()
    assert world.seen == []
    view.synced.set()
    await step
    assert world.seen == [(True, 1)]
