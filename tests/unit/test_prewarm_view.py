"""The prewarm controller watches GpuNodes and ledgers only while it has something to act on: a
GpuLease, or directives left to clear. GpuLeases are always watched. Over a scripted API client
that counts who lists and watches what, and every event it hands out."""

from __future__ import annotations

import asyncio
import copy
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, cast

import pytest
from prometheus_client import CollectorRegistry

from common import builders, contract
from common.kubeclient import KubeClient
from common.model import Allocation, GpuUuid, Holder, NodeName, PodUid, Priority
from common.objects import gpu_allocation_object
from common.prewarmwire import Directive, directives_json, parse_directives
from extender.prewarm.controller import (
    PrewarmController,
    PrewarmMetrics,
    Watched,
    run_prewarm_controller,
    wants_view,
)
from extender.prewarm.policy import PrewarmSettings, WorkloadTemplate
from extender.rightofreturn.lease import Workload

GB = 1e9
NODES = 3
IMAGE = "registry.example/recsys:v7"
LEASES = f"/apis/{contract.API_VERSION}/{contract.PLURAL_GPU_LEASE}"
NODES_PATH = f"/apis/{contract.API_VERSION}/{contract.PLURAL_GPU_NODE}"
LEDGERS = f"/apis/{contract.API_VERSION}/{contract.PLURAL_GPU_ALLOCATION}"
TEMPLATE = WorkloadTemplate(replicas=2, images=(IMAGE,), image_bytes=10 * GB)
NOW = datetime(2025, 3, 10, 7, 59, tzinfo=UTC).timestamp()  # the scale-up is at 08:00
STALE = Directive("ml/gone", "Lent", (IMAGE,), (), NOW - 60, NOW + 60, 20.0)  # lease deleted


async def until(check: Callable[[], bool]) -> None:
    """Let the event loop turn until ``check()`` holds (no clock: only tasks' turns)."""
    for _ in range(5_000):
        if check():
            return
        await asyncio.sleep(0)
    raise AssertionError("not true after 5,000 turns of the event loop")


def key_of(obj: dict[str, Any]) -> str:
    """namespace/name, or the name alone for a cluster-scoped object."""
    meta = obj["metadata"]
    return f"{meta['namespace']}/{meta['name']}" if meta.get("namespace") else meta["name"]


@dataclass
class Kube:
    """``list_watch`` and collection GETs over objects kept by path; counts the lists, the open
    watches and every event handed to a watcher. ``held``: paths whose list waits (for
    :meth:`release`) before it is complete."""

    objects: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    lists: Counter[str] = field(default_factory=Counter)
    delivered: Counter[str] = field(default_factory=Counter)
    held: dict[str, asyncio.Event] = field(default_factory=dict)
    _streams: dict[str, list[asyncio.Queue[tuple[str, dict[str, Any]]]]] = field(
        default_factory=dict
    )

    def watching(self, path: str) -> int:
        return len(self._streams.get(path, ()))

    def put(self, path: str, obj: dict[str, Any]) -> None:
        table = self.objects.setdefault(path, {})
        key = key_of(obj)
        event = "MODIFIED" if key in table else "ADDED"
        table[key] = obj
        for q in self._streams.get(path, ()):
            q.put_nowait((event, copy.deepcopy(obj)))

    def delete(self, path: str, key: str) -> None:
        obj = self.objects[path].pop(key)
        for q in self._streams.get(path, ()):
            q.put_nowait(("DELETED", copy.deepcopy(obj)))

    def release(self, path: str) -> None:
        self.held.pop(path).set()

    async def json(self, method: str, path: str, **_: Any) -> dict[str, Any]:
        assert method == "GET", f"{method} {path}: only lists here"
        self.lists[path] += 1
        return {"items": [copy.deepcopy(o) for o in self.objects.get(path, {}).values()]}

    async def list_watch(
        self, path: str, query: dict[str, Any] | None = None
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        q: asyncio.Queue[tuple[str, dict[str, Any]]] = asyncio.Queue()
        self._streams.setdefault(path, []).append(q)
        self.lists[path] += 1
        try:
            for obj in list(self.objects.get(path, {}).values()):
                self.delivered[path] += 1
                yield "ADDED", copy.deepcopy(obj)
            if path in self.held:
                await self.held[path].wait()
            yield "SYNCED", {}
            while True:
                event = await q.get()
                self.delivered[path] += 1
                yield event
        finally:
            self._streams[path].remove(q)


class World:
    """Workload templates, and directives written through to the scripted API server's GpuNodes
    (whose watch, when open, brings them back)."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self.templates = 0
        self.writes: list[tuple[str, tuple[Directive, ...]]] = []

    async def template(self, namespace: str, workload: Workload) -> WorkloadTemplate:
        self.templates += 1
        return TEMPLATE

    async def write(self, node: str, directives: Sequence[Directive]) -> None:
        self.writes.append((node, tuple(directives)))
        obj = copy.deepcopy(self.kube.objects[NODES_PATH][node])
        obj["spec"]["prewarm"] = directives_json(directives)
        if not directives:
            del obj["spec"]["prewarm"]
        self.kube.put(NODES_PATH, obj)


def gpu_lease(name: str = "recsys") -> dict[str, Any]:
    """Scales 2 -> 4 replicas at 08:00; recsys-2's group is lent on n1."""
    return {
        **builders.gpu_lease(
            name,
            "ml",
            owner="recsys",
            gpus_per_replica=4,
            desired_gpus=8,
            schedule=[{"at": "08:00", "gpus": 16}, {"at": "22:00", "gpus": 8}],
        ),
        "status": {
            "phase": "Steady",
            "targetReplicas": 2,
            "lent": [
                {
                    "replica": "recsys-2",
                    "devices": [builders.device_uuid("n1", i) for i in range(4, 8)],
                }
            ],
        },
    }


def ledger(node: str, pods: int) -> dict[str, Any]:
    """``pods`` one-GPU pods on the node's first devices: what binds write."""
    allocations = [
        Allocation(
            Holder(PodUid(f"{node}-p{i}"), "batch", f"{node}-p{i}", Priority.LOW, 0),
            (GpuUuid(builders.device_uuid(node, i % 4)),),
        )
        for i in range(pods)
    ]
    return gpu_allocation_object(NodeName(node), allocations, resource_version=str(pods))


def a_busy_cluster(**directives: Directive) -> Kube:
    """GpuNodes (n1 holding recsys' lent group) with their ledgers; ``directives`` by node."""
    kube = Kube()
    for i in range(NODES):
        name = f"n{i}"
        devs = builders.devices(name, 4) + builders.devices(name, 4, owner="recsys", start=4)
        obj = builders.gpu_node(name, devs)
        if name in directives:
            obj["spec"]["prewarm"] = directives_json([directives[name]])
        kube.put(NODES_PATH, obj)
        kube.put(LEDGERS, ledger(name, 1))
    return kube


def view_watched(kube: Kube) -> tuple[int, int]:
    return kube.watching(NODES_PATH), kube.watching(LEDGERS)


@dataclass
class Running:
    kube: Kube
    world: World
    controller: PrewarmController
    registry: CollectorRegistry
    task: asyncio.Task[None]

    def view_active(self) -> float | None:
        return self.registry.get_sample_value("tidelease_prewarm_view_active")


@asynccontextmanager
async def prewarm(kube: Kube) -> AsyncIterator[Running]:
    registry = CollectorRegistry()
    world = World(kube)
    controller = PrewarmController(
        world=world,
        metrics=PrewarmMetrics(registry),
        settings=PrewarmSettings(margin_s=120.0, horizon_s=3600.0),
        clock=lambda: NOW,
        template_ttl_s=0.0,
    )
    ready = asyncio.Event()
    task = asyncio.create_task(
        run_prewarm_controller(
            kube=cast(KubeClient, kube),
            controller=controller,
            resync_s=3600.0,
            min_interval_s=0.0,
            ready=ready,
        )
    )
    try:
        await until(lambda: ready.is_set() or task.done())
        if task.done():
            task.result()
        yield Running(kube, world, controller, registry, task)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def view_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.message for r in caplog.records if r.message.startswith("prewarm view: ")]


async def test_without_a_gpulease_no_node_or_ledger_is_watched_and_a_lease_starts_the_view(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level("INFO")
    kube = a_busy_cluster()
    async with prewarm(kube) as run:
        assert kube.watching(LEASES) == 1
        assert view_watched(kube) == (0, 0)
        assert kube.lists[NODES_PATH] == 1  # the one look for directives left behind
        assert kube.lists[LEDGERS] == 0
        assert run.view_active() == 0
        # Binds keep writing ledgers: nobody here receives, let alone parses, one of them.
        for pods in range(2, 202):
            kube.put(LEDGERS, ledger(f"n{pods % NODES}", pods))
        for _ in range(100):
            await asyncio.sleep(0)
        assert kube.delivered == Counter({})
        assert run.controller.parsed.parses == 0
        assert (run.world.templates, run.world.writes) == (0, [])

        # A GpuLease: GpuNodes and ledgers are listed and watched, and the step plans on them
        # as before: n1, holding the lent group, is told to fetch the image.
        kube.put(LEASES, gpu_lease())
        await until(lambda: bool(run.world.writes))
        assert view_watched(kube) == (1, 1)
        assert run.view_active() == 1
        ((node, (directive,)),) = run.world.writes
        assert (node, directive.lease, directive.role, directive.images) == (
            "n1",
            "ml/recsys",
            "Lent",
            (IMAGE,),
        )
        assert run.controller.parsed.parses == 2 * NODES  # every node and ledger, listed
        kube.put(LEDGERS, ledger("n0", 300))
        await until(lambda: run.controller.parsed.ledgers["n0"][0] == "300")

        # The last GpuLease gone: its directive is cleared, then the watches stop and what
        # was kept of them is dropped.
        kube.delete(LEASES, "ml/recsys")
        await until(lambda: run.view_active() == 0)
        assert view_watched(kube) == (0, 0)
        assert run.world.writes[-1] == ("n1", ())
        assert (run.controller.parsed.nodes, run.controller.parsed.ledgers) == ({}, {})
        delivered = sum(kube.delivered.values())
        for pods in range(400, 500):
            kube.put(LEDGERS, ledger(f"n{pods % NODES}", pods))
        for _ in range(100):
            await asyncio.sleep(0)
        assert sum(kube.delivered.values()) == delivered
        assert kube.lists[NODES_PATH] == 2  # the view's list; no second look

        # n1 goes while nobody watches; a lease again: a fresh view, listed anew, without it.
        kube.delete(NODES_PATH, "n1")
        templates = run.world.templates
        kube.put(LEASES, gpu_lease())
        await until(lambda: run.world.templates > templates and bool(run.controller.parsed.nodes))
        assert view_watched(kube) == (1, 1)
        assert kube.lists[LEDGERS] == 2
        assert sorted(run.controller.parsed.nodes) == ["n0", "n2"]
    assert view_lines(caplog) == [
        "prewarm view: watching GpuNode, GpuAllocation: GpuLease ml/recsys exists",
        "prewarm view: stopped watching: no GpuLease and no prewarm directive left",
        "prewarm view: watching GpuNode, GpuAllocation: GpuLease ml/recsys exists",
        "prewarm view: stopped watching: the controller stopped (leadership given up or lost)",
    ]


async def test_a_step_waits_for_the_view_to_have_listed() -> None:
    kube = a_busy_cluster()
    async with prewarm(kube) as run:
        kube.held[LEDGERS] = asyncio.Event()
        kube.put(LEASES, gpu_lease())
        await until(lambda: view_watched(kube) == (1, 1))
        for _ in range(200):
            await asyncio.sleep(0)
        assert (run.world.templates, run.world.writes) == (0, [])
        kube.release(LEDGERS)
        await until(lambda: bool(run.world.writes))
        assert run.controller.parsed.parses == 2 * NODES


async def test_directives_a_deleted_lease_left_are_found_by_one_list_and_cleared(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A lease deleted while no replica led: its directives are cleared at the next term's
    start, and the view stops once none is left."""
    caplog.set_level("INFO")
    kube = a_busy_cluster(n2=STALE)
    async with prewarm(kube) as run:
        assert run.world.writes == [("n2", ())]
        assert view_watched(kube) == (0, 0)
        assert run.view_active() == 0
        assert not parse_directives(kube.objects[NODES_PATH]["n2"]["spec"].get("prewarm"))
    assert view_lines(caplog)[:2] == [
        "prewarm view: watching GpuNode, GpuAllocation: prewarm directives left on GpuNode(s) "
        "n2 to clear",
        "prewarm view: stopped watching: no GpuLease and no prewarm directive left",
    ]


def node_with(name: str, directive: Directive | None = None, items: bool = False) -> dict[str, Any]:
    obj = builders.gpu_node(name)
    if directive is not None:
        obj["spec"]["prewarm"] = directives_json([directive])
    if items:
        obj["status"]["prewarm"] = {"items": []}  # what an agent reports once cleared
    return obj


@pytest.mark.parametrize(
    ("leases", "nodes", "want"),
    [
        pytest.param([], [], (False, "no GpuLease and no prewarm directive left"), id="nothing"),
        pytest.param(
            [gpu_lease()], [], (True, "GpuLease ml/recsys exists"), id="a lease, even idle"
        ),
        pytest.param(
            [],
            [node_with("n1", STALE), node_with("n2", items=True)],
            (True, "prewarm directives left to clear on 1 GpuNode(s)"),
            id="a deleted lease's directive: kept until cleared",
        ),
        pytest.param(
            [],
            [node_with("n1", items=True)],
            (False, "no GpuLease and no prewarm directive left"),
            id="an agent's empty report is nothing to clear",
        ),
    ],
)
def test_when_the_view_is_wanted(
    leases: list[dict[str, Any]], nodes: list[dict[str, Any]], want: tuple[bool, str]
) -> None:
    watched = Watched()
    for obj in leases:
        watched.apply("leases", "ADDED", obj)
    for obj in nodes:
        watched.apply("nodes", "ADDED", obj)
    assert wants_view(watched) == want


async def test_a_lease_that_needed_no_directive_stops_the_view_when_it_goes() -> None:
    kube = a_busy_cluster()
    async with prewarm(kube) as run:
        steady = gpu_lease()
        del steady["spec"]["schedule"]  # 8 GPUs wanted, 8 held: no scale-up, no directive
        kube.put(LEASES, steady)
        await until(lambda: run.world.templates > 0)
        assert view_watched(kube) == (1, 1)
        kube.delete(LEASES, "ml/recsys")
        await until(lambda: run.view_active() == 0)
        assert view_watched(kube) == (0, 0)
        assert run.world.writes == []


async def test_losing_leadership_stops_the_view() -> None:
    kube = a_busy_cluster()
    async with prewarm(kube) as run:
        kube.put(LEASES, gpu_lease())
        await until(lambda: bool(run.world.writes))
        run.task.cancel()
        await asyncio.gather(run.task, return_exceptions=True)
        assert view_watched(kube) == (0, 0)
        assert kube.watching(LEASES) == 0
        assert run.view_active() == 0
