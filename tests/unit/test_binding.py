"""Bind: device choice recorded in the ledger (compare-and-swap) and on the pod, then bound."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

import pytest

from common import builders, contract
from common.errors import Conflict, InvalidInput, NotFound
from common.model import Allocation, GpuUuid, NodeName, PodUid, Priority
from extender.cluster.store import MemoryStore
from extender.cluster.watching import PodStatus, run_watch
from extender.scheduler import wire
from extender.scheduler.binding import BindRefused, stale_allocations
from extender.scheduler.extenderserver import build_app
from extender.scheduler.handlers import ExtenderApp
from extender.scheduler.settings import ExtenderSettings
from tests.unit.cluster import holder

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def alloc(name: str, since: datetime = T0) -> Allocation:
    return Allocation(holder(name), (GpuUuid(f"GPU-{name}"),), since.isoformat())


def status(name: str, node: str = "", phase: str = "Running") -> PodStatus:
    return PodStatus(PodUid(f"uid-{name}"), "default", name, node, phase, False)


@pytest.mark.parametrize(
    ("pod", "age_s", "reason"),
    [
        (None, 10, None),  # not in the cache yet: within the watch-lag grace
        (None, 60, "pod-gone"),
        (status("p", "n", "Succeeded"), 1, "pod-finished"),
        (status("p", "n", "Failed"), 1, "pod-finished"),
        (status("p", "other"), 1, "pod-elsewhere"),
        (status("p", "", "Pending"), 60, None),  # bind in progress
        (status("p", "", "Pending"), 600, "never-bound"),
        (status("p", "n"), 10_000, None),  # running where it was placed
    ],
    ids=[
        "missing-young",
        "missing-old",
        "succeeded",
        "failed",
        "elsewhere",
        "pending-young",
        "pending-old",
        "running",
    ],
)
def test_stale_allocations(pod: PodStatus | None, age_s: float, reason: str | None) -> None:
    pods = {pod.uid: pod} if pod else {}
    now = T0 + timedelta(seconds=age_s)
    stale = stale_allocations(
        [alloc("p")], NodeName("n"), pods, now, reserve_ttl_s=120, missing_grace_s=30
    )
    assert [r for _, r in stale] == ([reason] if reason else [])


class Replica:
    """One extender instance over a shared store, with its watch running."""

    def __init__(self, store: MemoryStore, **settings: object) -> None:
        self.app: ExtenderApp = build_app(
            store=store,
            settings=ExtenderSettings(**settings),  # type: ignore[arg-type]
        )
        self.ready = asyncio.Event()
        self.task = asyncio.create_task(
            run_watch(store=store, cluster=self.app.cluster, pods=self.app.pods, ready=self.ready)
        )

    async def stop(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


async def replica(store: MemoryStore, **settings: object) -> Replica:
    r = Replica(store, **settings)
    await r.ready.wait()
    return r


def devices_on_pod(store: MemoryStore, name: str) -> list[str]:
    pod = store.get("Pod", "default", name)
    assert pod is not None
    return pod["metadata"]["annotations"][contract.ANN_DEVICES].split(",")


async def test_bind_records_devices_then_binds() -> None:
    store = MemoryStore([builders.gpu_node("n"), builders.pod("p", 2)])
    r = await replica(store)
    result = await r.app.binder.bind("default", "p", builders.pod("p")["metadata"]["uid"], "n")
    pod = store.get("Pod", "default", "p")
    assert pod is not None
    assert pod["spec"]["nodeName"] == "n"
    ann = pod["metadata"]["annotations"]
    assert ann[contract.ANN_DEVICES] == ",".join(result.devices)
    assert ann[contract.ANN_DEVICE_NODE] == "n"
    ledger, _ = await store.read_ledger(NodeName("n"))
    assert [a.devices for a in ledger] == [result.devices]
    await r.stop()


async def test_bind_refuses_when_node_has_no_room_and_changes_nothing() -> None:
    store = MemoryStore([builders.gpu_node("n", builders.devices("n", 1)), builders.pod("p", 2)])
    r = await replica(store)
    with pytest.raises(BindRefused):
        await r.app.binder.bind("default", "p", builders.pod("p")["metadata"]["uid"], "n")
    with pytest.raises(BindRefused, match="no GPU inventory"):
        await r.app.binder.bind("default", "p", builders.pod("p")["metadata"]["uid"], "ghost")
    assert store.writes == 0
    assert (store.get("Pod", "default", "p") or {})["spec"].get("nodeName") is None
    await r.stop()


@pytest.mark.parametrize(
    ("pod", "reason"),
    [
        (builders.pod("p", 0), "asks for no nvidia.com/gpu"),
        ({**builders.pod("p", 1), "spec": {**builders.pod("p", 1)["spec"], "schedulerName": "x"}},
         "for scheduler 'x', which this extender does not serve"),
    ],
    ids=["no-gpu", "other-scheduler"],
)  # fmt: skip
async def test_bind_refuses_pods_the_extender_does_not_place(
    pod: dict[str, object], reason: str
) -> None:
    """Whoever calls bind, it binds only GPU pods of the schedulers it serves: a pod without
    GPUs (or without tolerations) is not put on a node of the caller's choosing."""
    store = MemoryStore([builders.gpu_node("n"), pod])
    r = await replica(store)
    with pytest.raises(BindRefused, match=reason):
        await r.app.binder.bind("default", "p", builders.pod("p")["metadata"]["uid"], "n")
    assert store.writes == 0
    assert (store.get("Pod", "default", "p") or {})["spec"].get("nodeName") is None
    await r.stop()


async def test_bind_of_unknown_or_replaced_pod() -> None:
    store = MemoryStore([builders.gpu_node("n"), builders.pod("p", 1, uid="new")])
    r = await replica(store)
    with pytest.raises(NotFound):
        await r.app.binder.bind("default", "nope", "x", "n")
    with pytest.raises(NotFound, match="UID"):
        await r.app.binder.bind("default", "p", "old", "n")
    assert store.writes == 0
    await r.stop()


async def test_bind_of_pod_with_invalid_annotation() -> None:
    bad = builders.pod("p", 1, extra_annotations={contract.ANN_PRIORITY: "urgent"})
    store = MemoryStore([builders.gpu_node("n"), bad])
    r = await replica(store)
    with pytest.raises(InvalidInput):
        await r.app.binder.bind("default", "p", bad["metadata"]["uid"], "n")
    assert store.writes == 0
    await r.stop()


async def test_retried_bind_is_idempotent() -> None:
    store = MemoryStore([builders.gpu_node("n"), builders.pod("p", 2)])
    r = await replica(store)
    uid = builders.pod("p")["metadata"]["uid"]
    first = await r.app.binder.bind("default", "p", uid, "n")
    await store.settle()
    again = await r.app.binder.bind("default", "p", uid, "n")
    assert again.reused
    assert again.devices == first.devices
    with pytest.raises(Conflict, match="already bound"):
        await r.app.binder.bind("default", "p", uid, "other")
    await r.stop()


async def test_failed_binding_releases_the_allocation() -> None:
    store = MemoryStore([builders.gpu_node("n"), builders.pod("p", 2, node_name="elsewhere")])
    r = await replica(store)
    uid = builders.pod("p")["metadata"]["uid"]
    r.app.pods.apply("MODIFIED", builders.pod("p", 2))  # a stale cache: looks unbound
    # The pod is bound already in the store: bind_pod conflicts, the allocation is released.
    with pytest.raises(Conflict):
        await r.app.binder.bind("default", "p", uid, "n")
    ledger, _ = await store.read_ledger(NodeName("n"))
    assert ledger == ()
    await r.stop()


async def test_concurrent_binds_on_one_replica_never_share_a_device() -> None:
    pods = [builders.pod(f"p{i}", 1) for i in range(10)]
    store = MemoryStore([builders.gpu_node("n"), *pods])
    r = await replica(store)
    results = await asyncio.gather(
        *(
            r.app.binder.bind("default", p["metadata"]["name"], p["metadata"]["uid"], "n")
            for p in pods
        ),
        return_exceptions=True,
    )
    bound = [x for x in results if not isinstance(x, BaseException)]
    assert len(bound) == 8
    assert all(isinstance(x, BindRefused) for x in results if isinstance(x, BaseException))
    devices = [d for b in bound for d in b.devices]  # type: ignore[union-attr]
    assert len(devices) == len(set(devices)) == 8
    await r.stop()


async def test_two_replicas_never_hand_out_one_device_twice() -> None:
    pods = [builders.pod(f"p{i}", 2) for i in range(6)]
    store = MemoryStore([builders.gpu_node("n"), *pods])
    a, b = await replica(store), await replica(store)
    calls = [
        (a if i % 2 else b).app.binder.bind(
            "default", p["metadata"]["name"], p["metadata"]["uid"], "n"
        )
        for i, p in enumerate(pods)
    ]
    results = await asyncio.gather(*calls, return_exceptions=True)
    assert sum(not isinstance(x, BaseException) for x in results) == 4
    await store.settle()
    ledger, _ = await store.read_ledger(NodeName("n"))
    held = [u for x in ledger for u in x.devices]
    assert len(held) == len(set(held)) == 8
    assert a.app.metrics.bind_conflicts._value.get() + b.app.metrics.bind_conflicts._value.get() > 0
    await a.stop()
    await b.stop()


async def test_a_restarted_extender_sees_the_allocations() -> None:
    store = MemoryStore([builders.gpu_node("n"), builders.pod("p", 6), builders.pod("q", 4)])
    first = await replica(store)
    await first.app.binder.bind("default", "p", builders.pod("p")["metadata"]["uid"], "n")
    await first.stop()
    second = await replica(store)  # a new process: all it knows comes from the store
    with pytest.raises(BindRefused):
        await second.app.binder.bind("default", "q", builders.pod("q")["metadata"]["uid"], "n")
    assert second.app.cluster.get("n").free_total == 2  # type: ignore[union-attr]
    await second.stop()


async def test_reaper_releases_devices_of_deleted_pods() -> None:
    now = [T0]
    store = MemoryStore([builders.gpu_node("n"), builders.pod("p", 8, priority=Priority.LOW)])
    app = build_app(store=store, settings=ExtenderSettings(), clock=lambda: now[0])
    ready = asyncio.Event()
    task = asyncio.create_task(
        run_watch(store=store, cluster=app.cluster, pods=app.pods, ready=ready)
    )
    await ready.wait()
    await app.binder.bind("default", "p", builders.pod("p")["metadata"]["uid"], "n")
    store.delete("Pod", "default", "p")
    await store.settle()
    node = app.cluster.get("n")
    assert node is not None
    assert node.free_total == 8  # seen deleted: free for placement at once
    assert len(node.ledger) == 1  # still in the stored ledger ...
    assert await app.binder.reap_once() == 1  # ... until the reaper writes, with no grace
    assert not app.cluster.get("n").ledger  # type: ignore[union-attr]
    # A pod never seen (watch lag) keeps its allocation for the grace period.
    store.put(builders.pod("q", 2, uid="q"))
    await store.settle()
    await app.binder.bind("default", "q", "q", "n")
    app.pods.apply("DELETED", builders.pod("q", 2, uid="q"))  # the cache lost it, no event
    assert await app.binder.reap_once() == 0
    now[0] = T0 + timedelta(seconds=31)
    assert await app.binder.reap_once() == 1
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_the_reaper_releases_many_nodes_ledgers_at_once() -> None:
    """Dawn: evicted borrowers on many nodes; their ledgers are written together (each node's
    own write), not one node after another."""
    nodes = [f"n{i}" for i in range(6)]
    store = MemoryStore(
        [builders.gpu_node(n) for n in nodes]
        + [builders.pod(f"p{i}", 8, priority=Priority.LOW, uid=f"p{i}") for i in range(6)]
    )
    r = await replica(store)
    app = r.app
    for i, n in enumerate(nodes):
        await app.binder.bind("default", f"p{i}", f"p{i}", n)
        store.delete("Pod", "default", f"p{i}")
    await store.settle()
    in_flight = most = 0
    write = store.write_ledger

    async def counted(node: NodeName, allocations: Iterable[Allocation], version: str) -> str:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        await asyncio.sleep(0.01)  # a round trip
        try:
            return await write(node, allocations, version)
        finally:
            in_flight -= 1

    store.write_ledger = counted  # type: ignore[method-assign]
    assert await app.binder.reap_once() == len(nodes)
    assert most == len(nodes)
    assert all(not app.cluster.get(n).ledger for n in nodes)  # type: ignore[union-attr]
    await r.stop()


async def test_a_tenants_mass_deletion_releases_its_own_devices_and_no_one_elses() -> None:
    """A tenant (edit role in its namespace) deletes all its pods at once, beside another
    namespace's pods on the same nodes: the reaper, writing the nodes' ledgers together, keeps
    every other pod's allocation."""
    nodes = [f"n{i}" for i in range(4)]
    mine = [builders.pod(f"t{i}", 4, namespace="tenant", uid=f"t{i}") for i in range(4)]
    theirs = [builders.pod(f"o{i}", 4, namespace="ml", uid=f"o{i}") for i in range(4)]
    store = MemoryStore([*(builders.gpu_node(n) for n in nodes), *mine, *theirs])
    r = await replica(store)
    app = r.app
    for i, n in enumerate(nodes):
        await app.binder.bind("ml", f"o{i}", f"o{i}", n)
        await app.binder.bind("tenant", f"t{i}", f"t{i}", n)
    for i in range(len(nodes)):
        store.delete("Pod", "tenant", f"t{i}")
    await store.settle()
    assert await app.binder.reap_once() == len(nodes)
    for i, n in enumerate(nodes):
        ledger = app.cluster.get(n).ledger  # type: ignore[union-attr]
        assert [a.holder.pod_uid for a in ledger.values()] == [f"o{i}"]
        assert len(ledger[PodUid(f"o{i}")].devices) == 4
    await r.stop()


def test_a_pod_seen_deleted_is_released_without_waiting_for_the_grace() -> None:
    stale = stale_allocations(
        [alloc("p")],
        NodeName("n"),
        {},
        T0,
        reserve_ttl_s=120,
        missing_grace_s=30,
        gone={PodUid("uid-p")},
    )
    assert [r for _, r in stale] == ["pod-gone"]


async def test_a_bind_cut_off_after_its_ledger_write_is_taken_up_again() -> None:
    """A bind that wrote the ledger and never made the Binding (the extender killed between
    the two, or the bind cut off by its deadline) leaves the pod's reservation in the ledger.
    A restarted extender offers the pod that node, on its own devices (it is not full to the
    pod), and the next bind takes the same devices; another pod still finds the node full."""
    pod, other = builders.pod("p", 4), builders.pod("q", 4)
    store = MemoryStore([builders.gpu_node("n", builders.devices("n", 4)), pod, other])
    first = await replica(store)
    binding = asyncio.Event()
    real_bind = store.bind_pod

    async def hang(*args: object, **kwargs: object) -> None:
        binding.set()
        await asyncio.Event().wait()  # the process dies here: nothing after it runs

    store.bind_pod = hang  # type: ignore[method-assign]
    cut = asyncio.create_task(first.app.binder.bind("default", "p", pod["metadata"]["uid"], "n"))
    await binding.wait()
    cut.cancel()
    await asyncio.gather(cut, return_exceptions=True)
    await first.stop()
    store.bind_pod = real_bind  # type: ignore[method-assign]
    ledger, _ = await store.read_ledger(NodeName("n"))
    assert [a.holder.name for a in ledger] == ["p"]  # the reservation outlived its process

    second = await replica(store)

    async def filtered(p: dict[str, object]) -> dict[str, object]:
        _, answer = await second.app.filter({"Pod": p, "NodeNames": ["n"]})
        return json.loads(wire.encode(answer))  # type: ignore[no-any-return]

    assert (await filtered(pod))["NodeNames"] == ["n"]
    answer = await filtered(other)
    assert answer["NodeNames"] == []
    assert "0 free" in str(answer["FailedAndUnresolvableNodes"])
    result = await second.app.binder.bind("default", "p", pod["metadata"]["uid"], "n")
    assert result.reused
    assert result.devices == ledger[0].devices
    assert devices_on_pod(store, "p") == list(ledger[0].devices)
    await second.stop()
