"""Borrowers leave through the Eviction API, on a real API server; a PodDisruptionBudget that
refuses does not hold a reclaim back (right of return first): the pod is deleted, and a Warning
Event on it says why."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from common import builders
from common.kubeclient import KubeClient
from common.model import Holder, PodUid, Priority
from extender.leasing.kubeworld import DISRUPTION_REASON, KubeWorld
from extender.rightofreturn.lease import parse_gpu_lease
from tests.apiserver.conftest import ApiServer
from tests.polling import eventually

pytestmark = pytest.mark.apiserver

HOLD = "tidelease.test/hold"  # a finalizer: the pod stays readable once deleted


@pytest.fixture
async def kube(apiserver: ApiServer) -> AsyncIterator[KubeClient]:
    client = await KubeClient.connect(apiserver.kubeconfig)
    yield client
    await client.close()


def pod(ns: str, name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": {"app": name}},
        "spec": {"containers": [{"name": "c", "image": "local/app:v1"}]},
    }


async def events_of(kube: KubeClient, ns: str, name: str) -> list[str]:
    listed = await kube.json("GET", f"/api/v1/namespaces/{ns}/events")
    return [e["reason"] for e in listed.get("items") or [] if e["involvedObject"]["name"] == name]


async def borrowers(kube: KubeClient, *, hold: bool = False) -> tuple[str, dict[str, Holder]]:
    """A namespace of its own with two running borrowers, "free" and "budgeted", the second
    under a PodDisruptionBudget that allows nothing (with no disruption controller, its budget
    never allows one: the API server refuses every eviction of it with 429). ``hold``: a
    finalizer keeps each pod readable after its end."""
    ns = f"evict-{uuid.uuid4().hex[:6]}"
    await kube.json("POST", "/api/v1/namespaces", body=builders.namespace(ns))
    holders = {}
    for name in ("free", "budgeted"):
        body = pod(ns, name)
        if hold:
            body["metadata"]["finalizers"] = [HOLD]
        created = await kube.json("POST", f"/api/v1/namespaces/{ns}/pods", body=body)
        holders[name] = Holder(PodUid(created["metadata"]["uid"]), ns, name, Priority.LOW, 1000)
        # Running, as a borrower is (a pending pod's eviction ignores budgets).
        await kube.json(
            "PATCH",
            f"/api/v1/namespaces/{ns}/pods/{name}/status",
            body={"status": {"phase": "Running"}},
            content_type="application/merge-patch+json",
        )
    await kube.json(
        "POST",
        f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets",
        body={
            "metadata": {"name": "budgeted"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "budgeted"}}},
        },
    )
    return ns, holders


async def test_borrowers_are_evicted_and_a_refusing_budget_does_not_keep_them(
    kube: KubeClient,
) -> None:
    ns, holders = await borrowers(kube)
    world = KubeWorld(kube)
    lease = parse_gpu_lease(builders.gpu_lease("recsys", ns, gpus_per_replica=4, desired_gpus=8))
    for holder in holders.values():
        await world.evict(holder, lease)

    async def gone() -> bool:
        listed = await kube.json("GET", f"/api/v1/namespaces/{ns}/pods")
        return not listed.get("items")

    await eventually(gone, within_s=20)
    assert await events_of(kube, ns, "budgeted") == ["EvictedPastDisruptionBudget"]
    assert await events_of(kube, ns, "free") == []  # the Eviction API took it
    # A second eviction of a pod already gone is no error (the controller may repeat a step).
    await world.evict(holders["free"], lease)
    await kube.json("DELETE", f"/api/v1/namespaces/{ns}")


async def test_an_evicted_borrower_carries_the_condition_disruption_target(
    kube: KubeClient,
) -> None:
    """What a Job's podFailurePolicy (onPodConditions: DisruptionTarget) reads: the condition
    is on the pod when it ends, evicted or deleted past its budget. A finalizer keeps each pod
    readable after its end."""
    ns, holders = await borrowers(kube, hold=True)
    world = KubeWorld(kube)
    lease = parse_gpu_lease(builders.gpu_lease("recsys", ns, gpus_per_replica=4, desired_gpus=8))
    try:
        for holder in holders.values():
            await world.evict(holder, lease)
        for name in holders:
            got = await kube.json("GET", f"/api/v1/namespaces/{ns}/pods/{name}")
            assert got["metadata"].get("deletionTimestamp"), name
            (condition,) = [
                c for c in got["status"]["conditions"] if c["type"] == "DisruptionTarget"
            ]
            assert condition["status"] == "True"
            assert condition["reason"] == DISRUPTION_REASON, condition
            assert f"GpuLease {ns}/recsys" in condition["message"]
    finally:
        for name in holders:
            await kube.json(
                "PATCH",
                f"/api/v1/namespaces/{ns}/pods/{name}",
                body={"metadata": {"finalizers": None}},
                content_type="application/merge-patch+json",
            )
        await kube.json("DELETE", f"/api/v1/namespaces/{ns}")
