"""KubePodLookup against a small fake API server on a loopback port: the requests it sends (field
selector, the node's ledger by name, merge patch with UID precondition) and how it maps failures
onto tidelease's errors."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web
from kubernetes_asyncio import client

from common import contract
from common.errors import Conflict, InvalidInput, NotFound, Unavailable
from common.kubeclient import KubeClient
from nodeagent.deviceplugin.pods import KubePodLookup
from nodeagent.deviceplugin.testing import NODE, gpu_allocation, ledger_entry, placed_pod, uuids


@dataclass
class FakeApiServer:
    pods: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    ledgers: dict[str, dict[str, Any]] = field(default_factory=dict)  # GpuAllocations by name
    reads: list[str] = field(default_factory=list)  # paths of GETs by name
    queries: list[dict[str, str]] = field(default_factory=list)
    patches: list[tuple[str, str, Any]] = field(default_factory=list)  # path, content type, body
    status: int = 200  # anything else: answer every request with this
    hang: asyncio.Event | None = None  # set: answer; unset: hold requests

    def add(self, obj: dict[str, Any]) -> None:
        self.pods[(obj["metadata"]["namespace"], obj["metadata"]["name"])] = obj

    async def _gate(self) -> web.Response | None:
        if self.hang is not None:
            await self.hang.wait()
        if self.status != 200:
            return web.json_response(
                {"kind": "Status", "message": "injected failure"}, status=self.status
            )
        return None

    async def list_pods(self, request: web.Request) -> web.Response:
        self.queries.append(dict(request.query))
        if (failed := await self._gate()) is not None:
            return failed
        selector = dict(
            part.split("=", 1) for part in request.query.get("fieldSelector", "").split(",") if part
        )
        items = [
            p
            for p in self.pods.values()
            if p["spec"].get("nodeName") == selector.get("spec.nodeName")
            and p["status"].get("phase") == selector.get("status.phase", p["status"]["phase"])
        ]
        return web.json_response({"kind": "PodList", "items": items})

    async def get_ledger(self, request: web.Request) -> web.Response:
        self.reads.append(request.path)
        if (failed := await self._gate()) is not None:
            return failed
        ledger = self.ledgers.get(request.match_info["name"])
        if ledger is None:
            return web.json_response({"kind": "Status", "message": "not found"}, status=404)
        return web.json_response(ledger)

    async def patch_pod(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.patches.append((request.path, request.content_type, body))
        if (failed := await self._gate()) is not None:
            return failed
        pod = self.pods.get((request.match_info["ns"], request.match_info["name"]))
        if pod is None:
            return web.json_response({"kind": "Status", "message": "not found"}, status=404)
        if body["metadata"].get("uid") != pod["metadata"]["uid"]:
            return web.json_response(
                {"kind": "Status", "message": "Precondition failed: UID"}, status=409
            )
        pod["metadata"]["annotations"].update(body["metadata"]["annotations"])
        return web.json_response(pod)


@pytest.fixture
async def apiserver() -> AsyncIterator[tuple[FakeApiServer, str]]:
    fake = FakeApiServer()
    app = web.Application()
    app.router.add_get("/api/v1/pods", fake.list_pods)
    app.router.add_patch("/api/v1/namespaces/{ns}/pods/{name}", fake.patch_pod)
    app.router.add_get("/apis/tidelease.io/v1alpha1/gpuallocations/{name}", fake.get_ledger)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        yield fake, f"http://{host}:{port}"
    finally:
        if fake.hang is not None:
            fake.hang.set()
        await runner.cleanup()


@pytest.fixture
async def lookup(apiserver: tuple[FakeApiServer, str]) -> AsyncIterator[KubePodLookup]:
    kube = KubeClient(client.ApiClient(configuration=client.Configuration(host=apiserver[1])))
    try:
        yield KubePodLookup(kube, timeout_s=0.5)
    finally:
        await kube.close()


async def test_lists_the_nodes_pending_pods(
    apiserver: tuple[FakeApiServer, str], lookup: KubePodLookup
) -> None:
    fake, _ = apiserver
    fake.add(placed_pod("mine", uuids(0, 1), uid="u1"))
    fake.add(placed_pod("running", uuids(2), phase="Running"))
    fake.add(placed_pod("theirs", uuids(3), node="node-b"))
    pods = await lookup.pods_on_node(NODE)
    assert [(p.name, p.uid, p.devices) for p in pods] == [("mine", "u1", uuids(0, 1))]
    assert fake.queries == [{"fieldSelector": f"spec.nodeName={NODE},status.phase=Pending"}]


async def test_marks_with_a_merge_patch_and_the_uid_as_precondition(
    apiserver: tuple[FakeApiServer, str], lookup: KubePodLookup
) -> None:
    fake, _ = apiserver
    fake.add(placed_pod("mine", uuids(0), uid="u1"))
    [pod] = await lookup.pods_on_node(NODE)
    await lookup.mark_assigned(pod)
    assert fake.patches == [
        (
            "/api/v1/namespaces/default/pods/mine",
            "application/merge-patch+json",
            {"metadata": {"uid": "u1", "annotations": {contract.ANN_DEVICES_ASSIGNED: "true"}}},
        )
    ]
    [marked] = await lookup.pods_on_node(NODE)
    assert marked.assigned

    fake.add(placed_pod("mine", uuids(0), uid="u2"))  # deleted and re-created
    with pytest.raises(Conflict, match="Precondition"):
        await lookup.mark_assigned(pod)
    del fake.pods[("default", "mine")]
    with pytest.raises(NotFound):
        await lookup.mark_assigned(pod)


async def test_reads_the_nodes_ledger_by_name(
    apiserver: tuple[FakeApiServer, str], lookup: KubePodLookup
) -> None:
    fake, _ = apiserver
    pod = placed_pod("mine", uuids(1, 0), uid="u1")
    fake.ledgers[NODE] = gpu_allocation(NODE, [ledger_entry(pod)])
    fake.ledgers["node-b"] = gpu_allocation("node-b", [ledger_entry(pod, uuids(3))])
    ledger = await lookup.ledger(NODE)
    assert fake.reads == [f"/apis/tidelease.io/v1alpha1/gpuallocations/{NODE}"]
    assert (ledger.node, ledger.exists) == (NODE, True)
    [entry] = ledger.allocations
    assert (entry.holder.pod_uid, entry.holder.key, entry.devices) == (
        "u1",
        "default/mine",
        uuids(1, 0),
    )


async def test_a_node_without_a_ledger_has_none_and_a_malformed_one_is_invalid(
    apiserver: tuple[FakeApiServer, str], lookup: KubePodLookup
) -> None:
    fake, _ = apiserver
    ledger = await lookup.ledger(NODE)
    assert (ledger.exists, ledger.allocations) == (False, ())
    fake.ledgers[NODE] = gpu_allocation(NODE, [{"podUID": "u1", "devices": "GPU-0"}])
    with pytest.raises(InvalidInput, match="needs podUID, namespace and name"):
        await lookup.ledger(NODE)


@pytest.mark.parametrize("status", [429, 500, 503])
async def test_server_errors_are_unavailable(
    apiserver: tuple[FakeApiServer, str], lookup: KubePodLookup, status: int
) -> None:
    apiserver[0].status = status
    with pytest.raises(Unavailable, match="injected failure"):
        await lookup.pods_on_node(NODE)
    with pytest.raises(Unavailable, match="injected failure"):
        await lookup.ledger(NODE)


async def test_a_hanging_server_is_unavailable_after_the_timeout(
    apiserver: tuple[FakeApiServer, str], lookup: KubePodLookup
) -> None:
    apiserver[0].hang = asyncio.Event()
    with pytest.raises(Unavailable):
        await asyncio.wait_for(lookup.pods_on_node(NODE), 10)
