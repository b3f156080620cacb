"""What the CRDs themselves refuse, on a real API server (before any controller reads it)."""

from __future__ import annotations

from typing import Any

import pytest

from common import contract
from common.errors import InvalidInput
from common.kubeclient import KubeClient
from extender.leasing.lease import MIN_GRACE_S
from tests.apiserver.conftest import ApiServer

pytestmark = pytest.mark.apiserver

LEASES = f"/apis/{contract.API_VERSION}/namespaces/default/{contract.PLURAL_GPU_LEASE}"


def lease(name: str, grace: int) -> dict[str, Any]:
    return {
        "apiVersion": contract.API_VERSION,
        "kind": contract.KIND_GPU_LEASE,
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "owner": "recsys",
            "gpusPerReplica": 4,
            "desiredGPUs": 8,
            "graceSeconds": grace,
            "workload": {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "recsys"},
        },
    }


@pytest.mark.parametrize("grace", [0, 2, MIN_GRACE_S - 1, -1])
async def test_a_notice_shorter_than_the_minimum_is_refused(
    apiserver: ApiServer, grace: int
) -> None:
    kube = await KubeClient.connect(apiserver.kubeconfig)
    try:
        with pytest.raises(InvalidInput, match="graceSeconds"):
            await kube.json("POST", f"{LEASES}?dryRun=All", body=lease(f"short-{grace + 1}", grace))
        # At the minimum, and the default (no graceSeconds), the lease is taken.
        await kube.json("POST", f"{LEASES}?dryRun=All", body=lease("at-min", MIN_GRACE_S))
        default = lease("default-grace", MIN_GRACE_S)
        del default["spec"]["graceSeconds"]
        await kube.json("POST", f"{LEASES}?dryRun=All", body=default)
    finally:
        await kube.close()
