"""The extender's API-server client against a real kube-apiserver and etcd."""

from __future__ import annotations

import asyncio
import ssl
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from common import builders, contract
from common.errors import Conflict, InvalidInput, NotFound
from common.model import Allocation, GpuUuid, NodeName
from extender.cluster.kubestore import KubeStore
from extender.cluster.store import KINDS
from extender.scheduler.extenderserver import serve
from extender.scheduler.settings import ExtenderSettings
from tests.apiserver.conftest import ApiServer
from tests.unit.cluster import holder

pytestmark = pytest.mark.apiserver


class Api:
    """Plain REST calls for setting up and checking objects."""

    def __init__(self, server: ApiServer, session: aiohttp.ClientSession) -> None:
        self.base = server.server
        self.session = session
        self.headers = {"Authorization": f"Bearer {server.token}"}
        self.ssl = ssl.create_default_context(cafile=str(server.ca))

    async def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        async with self.session.request(
            method, self.base + path, json=body, headers=self.headers, ssl=self.ssl
        ) as resp:
            return resp.status, await resp.json(content_type=None)

    async def create_pod(self, namespace: str, pod: dict[str, Any]) -> dict[str, Any]:
        pod = {**pod, "metadata": {k: v for k, v in pod["metadata"].items() if k != "uid"}}
        pod["metadata"]["namespace"] = namespace
        pod.pop("status", None)
        status, obj = await self.call("POST", f"/api/v1/namespaces/{namespace}/pods", pod)
        assert status == 201, obj
        return dict(obj)

    async def namespace(self) -> str:
        name = f"t-{uuid.uuid4().hex[:8]}"
        status, obj = await self.call("POST", "/api/v1/namespaces", builders.namespace(name))
        assert status == 201, obj
        return name

    async def put_gpu_node(self, obj: dict[str, Any]) -> None:
        path = f"/apis/{contract.API_VERSION}/{contract.PLURAL_GPU_NODE}"
        status, created = await self.call("POST", path, obj)
        assert status == 201, created
        status_obj = {**created, "status": obj["status"]}
        status, done = await self.call(
            "PUT", f"{path}/{obj['metadata']['name']}/status", status_obj
        )
        assert status == 200, done


@pytest.fixture
async def api(apiserver: ApiServer) -> AsyncIterator[Api]:
    async with aiohttp.ClientSession() as session:
        yield Api(apiserver, session)


@pytest.fixture
async def store(apiserver: ApiServer) -> AsyncIterator[KubeStore]:
    kube = await KubeStore.connect(apiserver.kubeconfig)
    yield kube
    await kube.close()


def node_name() -> NodeName:
    return NodeName(f"node-{uuid.uuid4().hex[:8]}")


async def test_ledger_compare_and_swap(store: KubeStore) -> None:
    node = node_name()
    assert await store.read_ledger(node) == ((), "")
    a = Allocation(holder("p"), (GpuUuid("GPU-1"),), "2026-01-01T00:00:00+00:00")
    v1 = await store.write_ledger(node, [a], "")
    with pytest.raises(Conflict):  # a second create: someone else got there first
        await store.write_ledger(node, [], "")
    allocations, version = await store.read_ledger(node)
    assert (allocations, version) == ((a,), v1)
    v2 = await store.write_ledger(node, [], v1)
    with pytest.raises(Conflict):  # stale version
        await store.write_ledger(node, [a], v1)
    assert await store.read_ledger(node) == ((), v2)


async def test_concurrent_ledger_writers_one_wins(store: KubeStore) -> None:
    node = node_name()
    v = await store.write_ledger(node, [], "")
    writes = [
        store.write_ledger(node, [Allocation(holder(f"p{i}"), (GpuUuid("GPU-0"),), "t")], v)
        for i in range(5)
    ]
    results = await asyncio.gather(*writes, return_exceptions=True)
    assert sum(not isinstance(r, BaseException) for r in results) == 1
    assert all(isinstance(r, Conflict) for r in results if isinstance(r, BaseException))


async def test_bind_writes_the_annotations_in_the_same_update(store: KubeStore, api: Api) -> None:
    ns = await api.namespace()
    pod = await api.create_pod(ns, builders.pod("p", 1))
    uid = pod["metadata"]["uid"]
    devices = {contract.ANN_DEVICES: "GPU-1", contract.ANN_DEVICE_NODE: "node-1"}
    with pytest.raises((Conflict, InvalidInput)):
        await store.bind_pod(ns, "p", "not-the-uid", "node-1", devices)
    got = await store.get_pod(ns, "p")
    assert got is not None
    assert contract.ANN_DEVICES not in (got["metadata"].get("annotations") or {})
    assert not got["spec"].get("nodeName")
    await store.bind_pod(ns, "p", uid, "node-1", devices)
    with pytest.raises(Conflict):
        await store.bind_pod(ns, "p", uid, "node-2", {contract.ANN_DEVICES: "GPU-9"})
    got = await store.get_pod(ns, "p")
    assert got is not None
    assert got["spec"]["nodeName"] == "node-1"
    assert got["metadata"]["annotations"][contract.ANN_DEVICES] == "GPU-1"
    assert got["metadata"]["annotations"][contract.ANN_DEVICE_NODE] == "node-1"
    assert await store.get_pod(ns, "missing") is None
    with pytest.raises(NotFound):
        await store.bind_pod(ns, "missing", "u", "node-1")


async def test_watch_lists_then_follows(store: KubeStore, api: Api) -> None:
    name = node_name()
    await api.put_gpu_node(builders.gpu_node(name, builders.devices(name, 2)))
    events: list[tuple[str, str, str]] = []
    synced: set[str] = set()
    stream = store.watch()
    changed = asyncio.Condition()

    async def consume() -> None:
        async for kind, event, obj in stream:
            if event == "SYNCED":
                synced.add(kind)
            else:
                events.append((kind, event, (obj.get("metadata") or {}).get("name", "")))
            async with changed:
                changed.notify_all()

    task = asyncio.create_task(consume())
    try:
        async with asyncio.timeout(20):
            async with changed:
                await changed.wait_for(
                    lambda: synced == set(KINDS)  # the granted Namespaces among them
                )
            assert ("GpuNode", "ADDED", name) in events
            other = node_name()
            await store.write_ledger(other, [], "")
            await api.call(
                "DELETE", f"/apis/{contract.API_VERSION}/{contract.PLURAL_GPU_NODE}/{name}"
            )
            wanted = {("GpuAllocation", "ADDED", other), ("GpuNode", "DELETED", name)}
            async with changed:
                await changed.wait_for(lambda: wanted <= set(events))
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await stream.aclose()  # type: ignore[attr-defined]


async def test_two_extender_replicas_on_the_real_api_server(apiserver: ApiServer, api: Api) -> None:
    """Two replicas over one API server bind concurrently; no device is handed out twice, and a
    restarted replica sees every allocation."""
    ns = await api.namespace()
    name = node_name()
    await api.put_gpu_node(builders.gpu_node(name, builders.devices(name, 8)))
    pods = [await api.create_pod(ns, builders.pod(f"p{i}", 2)) for i in range(6)]
    settings = ExtenderSettings(host="127.0.0.1", port=0)
    stores = [await KubeStore.connect(apiserver.kubeconfig) for _ in range(2)]
    try:
        async with (
            serve(store=stores[0], settings=settings) as one,
            serve(store=stores[1], settings=settings) as two,
            aiohttp.ClientSession() as session,
        ):

            async def bind(i: int, pod: dict[str, Any]) -> str:
                url = (one if i % 2 else two).url
                body = {
                    "PodName": pod["metadata"]["name"],
                    "PodNamespace": ns,
                    "PodUID": pod["metadata"]["uid"],
                    "Node": name,
                }
                async with session.post(f"{url}/bind", json=body) as resp:
                    assert resp.status == 200
                    return str((await resp.json())["Error"])

            errors = await asyncio.gather(*(bind(i, p) for i, p in enumerate(pods)))
        assert sum(e == "" for e in errors) == 4, errors
        held: list[str] = []
        for p in pods:
            got = await stores[0].get_pod(ns, p["metadata"]["name"])
            assert got is not None
            ann = got["metadata"].get("annotations", {})
            if got["spec"].get("nodeName"):
                held.extend(ann[contract.ANN_DEVICES].split(","))
        assert len(held) == len(set(held)) == 8
        ledger, _ = await stores[0].read_ledger(name)
        assert sorted(u for a in ledger for u in a.devices) == sorted(held)
        # A new replica (a restart) learns all of it from the API server.
        async with serve(store=stores[0], settings=settings) as again:
            state = again.app.cluster.get(name)
            assert state is not None
            assert state.free_total == 0
    finally:
        for s in stores:
            await s.close()
