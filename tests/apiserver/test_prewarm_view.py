"""The prewarm controller, with no GpuLease in the cluster, watches GpuLeases and nothing else:
ledgers written by binds cost it nothing. Seen from the API server's side, in its own gauge of
open watches (apiserver_longrunning_requests) and its count of LIST calls. Started under real
leader election, as `tidelease controllers` runs it: a first LIST of the GpuNodes finds a
directive a deleted lease left behind, the view clears it and stops; then a GpuLease appears
and GpuNodes and ledgers are watched, until it is deleted."""

from __future__ import annotations

import contextlib
import time
import uuid

import pytest
from prometheus_client import CollectorRegistry

from common import builders, contract
from common.kubeclient import KubeClient
from common.model import Allocation, GpuUuid, Holder, NodeName, PodUid, Priority
from common.objects import gpu_allocation_object
from common.prewarmwire import Directive, directives_json
from extender.cluster.kubestore import KubeStore
from extender.controllers import Enabled, controllers, elector_for
from extender.leasing.kubeworld import KubeWorld
from extender.prewarm.policy import PrewarmSettings
from extender.scheduler.settings import ExtenderSettings
from tests.apiserver.conftest import ApiServer
from tests.apiserver.test_leasing_view import (
    api_metric,
    leases_of,
    no_gpu_lease_left,
    setup,
    watching,
)
from tests.polling import eventually

pytestmark = pytest.mark.apiserver

GPN = f"/apis/{contract.API_VERSION}/{contract.PLURAL_GPU_NODE}"
LEDGERS = f"/apis/{contract.API_VERSION}/{contract.PLURAL_GPU_ALLOCATION}"
BINDS = 60


async def lists(kube: KubeClient, resource: str) -> float:
    return await api_metric(
        kube, "apiserver_request_total", verb="LIST", resource=resource, scope="cluster"
    )


async def create_node(kube: KubeClient, name: str, directive: Directive) -> None:
    obj = builders.gpu_node(name, builders.devices(name, 4))
    obj["spec"]["prewarm"] = directives_json([directive])
    created = await kube.json("POST", GPN, body={**obj, "status": None})
    await kube.json("PUT", f"{GPN}/{name}/status", body={**created, "status": obj["status"]})


async def bind(kube: KubeClient, node: str, pods: int) -> None:
    """Write the node's ledger as binds do, one pod more each time."""
    path = f"{LEDGERS}/{node}"
    for i in range(pods):
        allocations = [
            Allocation(
                Holder(PodUid(f"{node}-{j}"), "batch", f"p{j}", Priority.LOW, 0),
                (GpuUuid(builders.device_uuid(node, j % 4)),),
            )
            for j in range(i + 1)
        ]
        obj = gpu_allocation_object(NodeName(node), allocations)
        if i == 0:
            await kube.json("POST", LEDGERS, body=obj)
        else:
            current = await kube.json("GET", path)
            obj["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
            await kube.json("PUT", path, body=obj)


async def test_no_gpulease_no_node_or_ledger_watch_then_a_lease_brings_them(
    apiserver: ApiServer,
) -> None:
    kube = await KubeClient.connect(apiserver.kubeconfig)
    store = await KubeStore.connect(apiserver.kubeconfig)
    ns = f"pv-{uuid.uuid4().hex[:8]}"
    node = f"{ns}-n1"
    registry = CollectorRegistry()

    def view_active() -> float | None:
        return registry.get_sample_value("tidelease_prewarm_view_active")

    try:
        await no_gpu_lease_left(kube)
        lease = await setup(kube, ns)
        now = time.time()
        await create_node(
            kube, node, Directive("ml/deleted", "Standby", ("i:v1",), (), now, now + 600, 20.0)
        )
        nodes_watched = await watching(kube, "gpunodes")
        ledgers_watched = await watching(kube, "gpuallocations")
        leases_watched = await watching(kube, "gpuleases")
        node_lists = await lists(kube, "gpunodes")
        async with controllers(
            store=store,
            world=KubeWorld(kube),
            kube=kube,
            settings=ExtenderSettings(),
            enabled=Enabled(prewarm=PrewarmSettings()),
            elect=elector_for(kube, ns),
            registry=registry,
        ):

            async def watches(resource: str, want: float) -> bool:
                return await watching(kube, resource) == want

            async def cleared() -> bool:
                obj = await kube.json("GET", f"{GPN}/{node}")
                return "prewarm" not in obj["spec"]

            async def stopped() -> bool:
                return view_active() == 0

            # Leading, the controller watches the GpuLeases; the directive left behind is
            # found by a LIST, cleared by the view, which then stops.
            await eventually(lambda: watches("gpuleases", leases_watched + 1), within_s=30)
            await eventually(cleared, within_s=20)
            await eventually(stopped, within_s=10)
            assert await lists(kube, "gpunodes") == node_lists + 2  # the look, the view's list
            await eventually(lambda: watches("gpunodes", nodes_watched), within_s=10)
            await eventually(lambda: watches("gpuallocations", ledgers_watched), within_s=10)

            # Binds write ledgers: no watch, no list of them, nothing started.
            ledger_lists = await lists(kube, "gpuallocations")
            await bind(kube, node, BINDS)
            assert await watching(kube, "gpunodes") == nodes_watched
            assert await watching(kube, "gpuallocations") == ledgers_watched
            assert await lists(kube, "gpuallocations") == ledger_lists
            assert await lists(kube, "gpunodes") == node_lists + 2
            assert view_active() == 0

            # A GpuLease: GpuNodes and ledgers are listed and watched.
            await kube.json("POST", leases_of(ns), body=lease)
            await eventually(lambda: watches("gpunodes", nodes_watched + 1), within_s=20)
            await eventually(lambda: watches("gpuallocations", ledgers_watched + 1), within_s=10)
            assert await lists(kube, "gpuallocations") == ledger_lists + 1
            assert view_active() == 1

            # The last GpuLease deleted: their watches end.
            await kube.json("DELETE", f"{leases_of(ns)}/recsys")
            await eventually(stopped, within_s=10)
            await eventually(lambda: watches("gpunodes", nodes_watched), within_s=10)
            await eventually(lambda: watches("gpuallocations", ledgers_watched), within_s=10)
    finally:
        for path in (f"{GPN}/{node}", f"{LEDGERS}/{node}", f"/api/v1/namespaces/{ns}"):
            with contextlib.suppress(Exception):
                await kube.json("DELETE", path)
        await store.close()
        await kube.close()
