"""The swap of tests/certswap.py with the rotation's real Secrets (KubeSecrets) on the real API
server: the CA and both leaves created there, replaced with their resourceVersions as they
come due, read back by the kubelet-like volume sync, while the client's calls all succeed."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from common.kubeclient import KubeClient
from extender.certrotation.controller import NOT_AFTER, KubeSecrets
from extender.certrotation.policy import SERVING_SECRET
from tests.apiserver.conftest import ApiServer
from tests.certswap import assert_renewed_without_a_failed_call, swap

pytestmark = pytest.mark.apiserver


@pytest.fixture
async def namespace(apiserver: ApiServer) -> AsyncIterator[tuple[KubeClient, str]]:
    kube = await KubeClient.connect(apiserver.kubeconfig)
    name = f"certswap-{uuid.uuid4().hex[:8]}"
    body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    await kube.json("POST", "/api/v1/namespaces", body=body)
    try:
        yield kube, name
    finally:
        await kube.json("DELETE", f"/api/v1/namespaces/{name}")
        await kube.close()


async def test_certificates_renewed_in_the_api_server_are_served_without_a_failed_call(
    namespace: tuple[KubeClient, str], tmp_path: Path
) -> None:
    kube, ns = namespace
    result = await swap(KubeSecrets(kube, ns), tmp_path, namespace=ns)
    assert_renewed_without_a_failed_call(result)
    secret = await kube.json("GET", f"/api/v1/namespaces/{ns}/secrets/{SERVING_SECRET}")
    assert secret["type"] == "kubernetes.io/tls"
    assert int(secret["metadata"]["resourceVersion"]) > 0
    assert NOT_AFTER in secret["metadata"]["annotations"]
