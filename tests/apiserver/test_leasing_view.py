"""The controllers with no GpuLease in the cluster watch GpuLeases and nothing else: GPU pods
being created cost them nothing. Seen from the API server's side, in its own gauge of open
watches (apiserver_longrunning_requests) and its count of LIST calls; then a GpuLease appears
and the leasing view is listed, watched and ready, and goes away with the lease."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from common import builders, contract
from common.errors import TooManyRequests
from common.kubeclient import KubeClient
from extender.cluster.kubestore import KubeStore
from extender.controllers import Enabled, controllers
from extender.leasing.kubeworld import KubeWorld
from extender.scheduler.settings import ExtenderSettings
from tests.apiserver.conftest import ApiServer
from tests.polling import eventually

pytestmark = pytest.mark.apiserver

GPU_LEASES = f"/apis/{contract.API_VERSION}/{contract.PLURAL_GPU_LEASE}"
PODS = 100


def leases_of(ns: str) -> str:
    return f"/apis/{contract.API_VERSION}/namespaces/{ns}/{contract.PLURAL_GPU_LEASE}"


async def api_metric(kube: KubeClient, name: str, **labels: str) -> float:
    """The API server's own metric ``name``, summed over the samples with ``labels``."""
    resp = await kube.raw("GET", "/metrics")
    try:
        text = await resp.text()
    finally:
        resp.release()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and labels.items() <= sample.labels.items()
    )


async def watching(kube: KubeClient, resource: str) -> float:
    """Open cluster-wide watches of ``resource``."""
    return await api_metric(
        kube, "apiserver_longrunning_requests", verb="WATCH", resource=resource, scope="cluster"
    )


async def pod_lists(kube: KubeClient) -> float:
    return await api_metric(
        kube, "apiserver_request_total", verb="LIST", resource="pods", scope="cluster"
    )


async def no_gpu_lease_left(kube: KubeClient) -> None:
    """Earlier tests' rigs leave their GpuLeases behind (no namespace controller here). A
    fresh API server answers 429 while the CRD's storage is being set up."""

    async def listed() -> dict[str, Any] | None:
        try:
            return await kube.json("GET", GPU_LEASES)
        except TooManyRequests:
            return None

    for lease in (await eventually(listed, within_s=30)).get("items") or []:
        meta = lease["metadata"]
        await kube.json("DELETE", f"{leases_of(meta['namespace'])}/{meta['name']}")


async def setup(kube: KubeClient, ns: str) -> dict[str, Any]:
    """The namespace, an online job's StatefulSet (2 replicas) and its GpuLease, not created."""
    await kube.json("POST", "/api/v1/namespaces", body=builders.namespace(ns))
    sts = builders.statefulset("recsys", ns, replicas=2)
    await kube.json("POST", f"/apis/apps/v1/namespaces/{ns}/statefulsets", body=sts)
    return builders.gpu_lease("recsys", ns, gpus_per_replica=4, desired_gpus=8)


async def create_gpu_pods(kube: KubeClient, ns: str) -> None:
    for i in range(PODS):
        pod = builders.pod(f"p{i}", 1, namespace=ns)
        del pod["metadata"]["uid"]
        pod.pop("status", None)
        await kube.json("POST", f"/api/v1/namespaces/{ns}/pods", body=pod)


async def test_no_gpulease_no_pod_watch_then_a_lease_brings_the_view(apiserver: ApiServer) -> None:
    kube = await KubeClient.connect(apiserver.kubeconfig)
    store = await KubeStore.connect(apiserver.kubeconfig)
    ns = f"t-{uuid.uuid4().hex[:8]}"
    settings = ExtenderSettings(probe_host="127.0.0.1", probe_port=0)
    try:
        await no_gpu_lease_left(kube)
        lease = await setup(kube, ns)
        pods_watched = await watching(kube, "pods")
        leases_watched = await watching(kube, "gpuleases")
        listed = await pod_lists(kube)
        async with (
            controllers(
                store=store,
                world=KubeWorld(kube),
                kube=kube,
                settings=settings,
                enabled=Enabled(leasing=True),
            ) as running,
            aiohttp.ClientSession() as http,
        ):
            view = running.view
            assert view is not None

            async def readyz() -> int:
                async with http.get(f"{running.probe_url}/readyz") as resp:
                    return resp.status

            async def watches(resource: str, want: float) -> bool:
                return await watching(kube, resource) == want

            async def stopped() -> bool:
                return not view.active

            assert await readyz() == 200
            await eventually(lambda: watches("gpuleases", leases_watched + 1), within_s=10)
            await create_gpu_pods(kube, ns)
            assert await watching(kube, "pods") == pods_watched
            assert await pod_lists(kube) == listed
            assert not view.active
            assert len(view.pods.by_uid) == 0

            # A GpuLease: the view lists and watches the pods, and readiness waits for it.
            await kube.json("POST", leases_of(ns), body=lease)
            await asyncio.wait_for(view.synced.wait(), 20)
            assert sum(p.namespace == ns for p in view.pods.by_uid.values()) == PODS
            assert await pod_lists(kube) == listed + 1
            await eventually(lambda: watches("pods", pods_watched + 1), within_s=10)
            assert await readyz() == 200

            # The last GpuLease deleted: the view's watches end.
            await kube.json("DELETE", f"{leases_of(ns)}/recsys")
            await eventually(stopped, within_s=10)
            await eventually(lambda: watches("pods", pods_watched), within_s=10)
            assert len(view.pods.by_uid) == 0
            assert await readyz() == 200
    finally:
        await store.close()
        await kube.close()
