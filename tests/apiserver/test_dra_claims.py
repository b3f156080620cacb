"""The DRA kubelet plugin preparing ResourceClaims read from a real kube-apiserver.

The claims are made with the resource.k8s.io/v1 API and allocated by hand (their status
subresource, as the scheduler writes it); the plugin reads them through the real KubeClient.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from common import builders
from common.kubeclient import KubeClient
from nodeagent.deviceplugin.testing import NODE, uuids
from nodeagent.dradriver.claims import RESOURCE_API
from nodeagent.dradriver.settings import DRIVER
from tests.apiserver.conftest import ApiServer
from tests.unit.test_dra_plugin import container, devices_of, nvidia, running, settings_in

pytestmark = pytest.mark.apiserver

U = uuids(0, 1, 2)


@pytest.fixture
def root() -> Iterator[Path]:
    """A short temporary dir: unix socket paths hold 107 bytes."""
    path = Path(tempfile.mkdtemp(prefix="dra-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@contextlib.asynccontextmanager
async def namespace(kube: KubeClient) -> AsyncIterator[str]:
    name = f"dra-{uuid.uuid4().hex[:8]}"
    await kube.json("POST", "/api/v1/namespaces", body=builders.namespace(name))
    try:
        yield name
    finally:
        await kube.json("DELETE", f"/api/v1/namespaces/{name}")


async def make_claim(
    kube: KubeClient, ns: str, name: str, requests: dict[str, int]
) -> dict[str, Any]:
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": request,
                        "exactly": {
                            "deviceClassName": DRIVER,
                            "allocationMode": "ExactCount",
                            "count": count,
                        },
                    }
                    for request, count in requests.items()
                ]
            }
        },
    }
    return await kube.json("POST", f"{RESOURCE_API}/namespaces/{ns}/resourceclaims", body=body)


async def allocate(
    kube: KubeClient, claim: dict[str, Any], results: list[tuple[str, str, str]]
) -> dict[str, Any]:
    """Write status.allocation as the scheduler does: (request, pool, device) of our driver."""
    meta = claim["metadata"]
    status = {
        "allocation": {
            "devices": {
                "results": [
                    {"request": r, "driver": DRIVER, "pool": pool, "device": d}
                    for r, pool, d in results
                ]
            },
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]}
                ]
            },
        }
    }
    return await kube.json(
        "PATCH",
        f"{RESOURCE_API}/namespaces/{meta['namespace']}/resourceclaims/{meta['name']}/status",
        body={"status": status},
        content_type="application/merge-patch+json",
    )


async def test_resource_v1_is_served(apiserver: ApiServer) -> None:
    kube = await KubeClient.connect(apiserver.kubeconfig)
    try:
        group = await kube.json("GET", RESOURCE_API)
    finally:
        await kube.close()
    assert {r["name"] for r in group["resources"]} >= {
        "resourceclaims",
        "resourceclaims/status",
        "resourceslices",
        "deviceclasses",
    }


async def test_prepare_claims_read_from_the_api_server(apiserver: ApiServer, root: Path) -> None:
    kube = await KubeClient.connect(apiserver.kubeconfig)
    try:
        async with namespace(kube) as ns:
            one = await allocate(
                kube,
                await make_claim(kube, ns, "one", {"gpus": 2}),
                [("gpus", NODE, "gpu-0"), ("gpus", NODE, "gpu-2")],
            )
            two = await allocate(
                kube,
                await make_claim(kube, ns, "two", {"small": 1, "other": 1}),
                [("small", NODE, "gpu-1"), ("other", "node-b", "gpu-0")],
            )
            pending = await make_claim(kube, ns, "pending", {"gpus": 1})
            replaced = await make_claim(kube, ns, "replaced", {"gpus": 1})
            old = {**replaced, "metadata": {**replaced["metadata"], "uid": str(uuid.uuid4())}}
            gone = {"metadata": {"namespace": ns, "name": "gone", "uid": str(uuid.uuid4())}}

            async with running(settings_in(root), kube) as kubelet:
                response = await kubelet.prepare(one, two, pending, old, gone)
                answers = response.claims
                first = answers[one["metadata"]["uid"]]
                assert first.error == ""
                assert devices_of(first) == [(["gpus"], NODE, "gpu-0"), (["gpus"], NODE, "gpu-2")]
                got = container(kubelet, first, "gpus")
                assert got.nodes == nvidia(0, 2)
                assert got.visible == [U[0], U[2]]
                second = answers[two["metadata"]["uid"]]
                assert devices_of(second) == [(["small"], NODE, "gpu-1")], "node-b's is not ours"
                assert container(kubelet, second, "small").visible == [U[1]]
                assert "not allocated" in answers[pending["metadata"]["uid"]].error
                assert "UID" in answers[old["metadata"]["uid"]].error
                assert "not found" in answers[gone["metadata"]["uid"]].error

                unprepared = await kubelet.unprepare(one, two)
                assert {c.error for c in unprepared.claims.values()} == {""}
                assert kubelet.spec_files() == set()
    finally:
        await kube.close()
