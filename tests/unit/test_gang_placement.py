"""A gang's pods placed one after another (extender.scheduler.gangplacement), through the
extender's filter and bind verbs over a store: each member is answered with one node, its
devices held for it there, so the next member is never offered them, and its bind takes them.

The nodes: ``a`` with four plain GPUs and four standby ones (no borrower may use those), ``b``
with four plain ones. kube-scheduler's own count would let two 4-GPU pods onto ``a``; the
extender's holds let one."""

from __future__ import annotations

import json
import time
from typing import Any

from common import builders, contract
from common.model import NodeName, PodUid, Priority
from extender.cluster.store import MemoryStore
from extender.scheduler import wire
from extender.scheduler.gangplacement import held_elsewhere
from tests.unit.test_binding import Replica, replica


def member(name: str, gang: str = "sweep", gpus: int = 4) -> dict[str, Any]:
    extra = {contract.ANN_POD_GROUP: gang} if gang else None
    return builders.pod(
        name, gpus, namespace="batch", priority=Priority.LOW, extra_annotations=extra
    )


def store_with(*pods: dict[str, Any]) -> MemoryStore:
    a = builders.devices("a", 4) + builders.devices("a", 4, standby=True, start=4)
    return MemoryStore(
        [builders.gpu_node("a", a), builders.gpu_node("b", builders.devices("b", 4)), *pods]
    )


async def filtered(
    r: Replica, pod: dict[str, Any], nodes: tuple[str, ...] = ("a", "b")
) -> dict[str, Any]:
    _, answer = await r.app.filter({"Pod": pod, "NodeNames": list(nodes)})
    return json.loads(wire.encode(answer))  # type: ignore[no-any-return]


def uid(pod: dict[str, Any]) -> PodUid:
    return PodUid(pod["metadata"]["uid"])


async def test_each_member_gets_one_node_and_the_next_is_not_offered_its_devices() -> None:
    g0, g1, g2, lone = member("g0"), member("g1"), member("g2"), member("lone", gang="")
    store = store_with(g0, g1, g2, lone)
    r = await replica(store)
    first = await filtered(r, g0)
    (node0,) = first["NodeNames"]
    other = "b" if node0 == "a" else "a"
    assert first["FailedAndUnresolvableNodes"] == {other: held_elsewhere(node0)}
    second = await filtered(r, g1)
    assert second["NodeNames"] == [other]
    # Both nodes' usable devices are held now: the third member, and a pod of no gang, wait.
    assert (await filtered(r, g2))["NodeNames"] == []
    assert (await filtered(r, lone))["NodeNames"] == []
    # A member filtered again (a retry) finds its own place.
    assert (await filtered(r, g0))["NodeNames"] == [node0]
    held0 = r.app.cluster.reservation(uid(g0))
    held1 = r.app.cluster.reservation(uid(g1))
    assert held0 is not None
    assert held1 is not None
    assert not set(held0[1].devices) & set(held1[1].devices)
    # Nothing written yet: the holds are in memory.
    assert store.writes == 0
    # The binds take exactly the held devices, and the holds end.
    got0 = await r.app.binder.bind("batch", "g0", uid(g0), node0)
    got1 = await r.app.binder.bind("batch", "g1", uid(g1), other)
    assert got0.devices == held0[1].devices
    assert got1.devices == held1[1].devices
    assert r.app.cluster.reservation(uid(g0)) is None
    assert r.app.cluster.reservation(uid(g1)) is None
    ledger, _ = await store.read_ledger(NodeName(node0))
    assert [a.holder.name for a in ledger] == ["g0"]
    assert ledger[0].holder.gang == "batch/pod-group/sweep"
    await r.stop()


async def test_a_hold_ends_with_its_time_with_its_pod_or_with_a_bind_elsewhere() -> None:
    g0, lone = member("g0"), member("lone", gang="")
    store = store_with(g0, lone)
    r = await replica(store)
    # Held on b (one node only offered); a pod of no gang finds b full while it lasts ...
    assert (await filtered(r, g0, ("b",)))["NodeNames"] == ["b"]
    assert (await filtered(r, lone, ("b",)))["NodeNames"] == []
    # ... and free once it has expired (the reaper's pass).
    r.app.cluster.expire_reservations(time.monotonic() + r.app.settings.gang_reserve_ttl_s + 1)
    assert (await filtered(r, lone, ("b",)))["NodeNames"] == ["b"]
    # Held again, then the pod is deleted: free at once.
    assert (await filtered(r, g0, ("b",)))["NodeNames"] == ["b"]
    store.delete("Pod", "batch", "g0")
    await store.settle()
    assert r.app.cluster.reservation(uid(g0)) is None
    assert (await filtered(r, lone, ("b",)))["NodeNames"] == ["b"]
    await r.stop()


async def test_a_member_bound_elsewhere_than_its_hold_is_placed_there() -> None:
    """kube-scheduler is free to bind where it likes: the hold on the other node is dropped
    and the pod gets devices where it is bound."""
    g0 = member("g0")
    store = store_with(g0)
    r = await replica(store)
    assert (await filtered(r, g0, ("b",)))["NodeNames"] == ["b"]
    got = await r.app.binder.bind("batch", "g0", uid(g0), "a")
    assert all(d.startswith("GPU-") for d in got.devices)
    assert r.app.cluster.reservation(uid(g0)) is None
    ledger_b, _ = await store.read_ledger(NodeName("b"))
    assert ledger_b == ()
    await r.stop()
