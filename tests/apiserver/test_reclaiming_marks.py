"""The leasing controller's ``reclaiming`` marks (DRA mode) on a real API server's GpuNode: set
and cleared by KubeWorld.mark_reclaiming, kept by a retag of a device that stays lent, gone with
the owner tag, refused by the CRD on a device no owner lent; the node's slice says so."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from common import builders as b
from common import contract, deviceattributes
from common.errors import InvalidInput
from common.kubeclient import KubeClient
from common.model import GpuUuid, NodeName
from extender.cluster.state import ClusterState
from extender.leasing import claimpinning as pinning
from extender.leasing.decisions import TagChange
from extender.leasing.kubeworld import KubeWorld
from tests.apiserver.conftest import ApiServer

pytestmark = pytest.mark.apiserver

PATH = f"/apis/{contract.API_VERSION}/{contract.PLURAL_GPU_NODE}"


@pytest.fixture
async def node(apiserver: ApiServer) -> AsyncIterator[tuple[KubeClient, NodeName]]:
    kube = await KubeClient.connect(apiserver.kubeconfig)
    name = NodeName(f"marks-{uuid.uuid4().hex[:6]}")
    obj = b.gpu_node(name, b.devices(name, 3))
    status = obj.pop("status")
    await kube.json("POST", PATH, body=obj)
    stored = await kube.json("GET", f"{PATH}/{name}")
    await kube.json("PUT", f"{PATH}/{name}/status", body={**stored, "status": status})
    try:
        yield kube, name
    finally:
        await kube.json("DELETE", f"{PATH}/{name}")
        await kube.close()


async def tags(kube: KubeClient, node: str) -> dict[str, dict[str, Any]]:
    obj = await kube.json("GET", f"{PATH}/{node}")
    return {e["uuid"]: e for e in (obj.get("spec") or {}).get("devices") or []}


def marks(node: NodeName, **on: bool) -> pinning.MarkReclaiming:
    by_uuid = {GpuUuid(b.device_uuid(node, int(k[1:]))): v for k, v in on.items()}
    return pinning.MarkReclaiming({node: by_uuid})


async def test_marks_are_set_kept_while_lent_and_gone_with_the_owner_tag(
    node: tuple[KubeClient, NodeName],
) -> None:
    kube, name = node
    world = KubeWorld(kube)
    d0, d1, d2 = (GpuUuid(b.device_uuid(name, i)) for i in range(3))
    await world.set_tags(
        [TagChange(name, d0, "job", False, "job-1"), TagChange(name, d1, "job", False, "job-1")]
    )
    # d2 has no owner: never marked (the CRD would refuse it).
    await world.mark_reclaiming(marks(name, d0=True, d1=True, d2=True))
    got = await tags(kube, name)
    assert {u: e.get("reclaiming") for u, e in got.items()} == {d0: True, d1: True}
    obj = await kube.json("GET", f"{PATH}/{name}")
    slice_devices = {
        d["attributes"][deviceattributes.qualified(deviceattributes.ATTR_UUID)]["string"]: d[
            "attributes"
        ][deviceattributes.qualified(deviceattributes.ATTR_RECLAIMING)]["bool"]
        for d in deviceattributes.slice_devices(obj)
    }
    assert slice_devices == {d0: True, d1: True, d2: False}
    # The controllers' view reads the marks back (what a restarted controller starts from).
    state = ClusterState()
    state.apply_gpu_node("ADDED", obj)
    assert {u for s in state for u in s.reclaiming} == {d0, d1}

    # A retag that keeps the owner (a group renamed) keeps the mark; the owner's return clears
    # the tags and the mark with them.
    await world.set_tags(
        [TagChange(name, d0, "job", False, "job-3"), TagChange(name, d1, None, False)]
    )
    got = await tags(kube, name)
    assert got[d0] == {"uuid": d0, "owner": "job", "replica": "job-3", "reclaiming": True}
    assert d1 not in got
    # Cleared: the entry is the tags alone again; a write that changes nothing is not made.
    await world.mark_reclaiming(marks(name, d0=False))
    before = await kube.json("GET", f"{PATH}/{name}")
    assert (await tags(kube, name))[d0] == {"uuid": d0, "owner": "job", "replica": "job-3"}
    await world.mark_reclaiming(marks(name, d0=False))
    after = await kube.json("GET", f"{PATH}/{name}")
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]


async def test_the_crd_refuses_a_mark_on_a_device_no_owner_lent(
    node: tuple[KubeClient, NodeName],
) -> None:
    kube, name = node
    obj = await kube.json("GET", f"{PATH}/{name}")
    obj["spec"] = {"devices": [{"uuid": b.device_uuid(name, 0), "reclaiming": True}]}
    with pytest.raises(InvalidInput, match="only a device an owner lent is reclaimed"):
        await kube.json("PUT", f"{PATH}/{name}", body=obj)
