"""What the CRDs themselves refuse, on a real API server (before any controller reads it)."""

from __future__ import annotations

from typing import Any

import pytest

from common import builders, contract
from common.errors import InvalidInput
from common.kubeclient import KubeClient
from extender.leasing.lease import MIN_GRACE_S
from tests.apiserver.conftest import ApiServer

pytestmark = pytest.mark.apiserver

LEASES = f"/apis/{contract.API_VERSION}/namespaces/default/{contract.PLURAL_GPU_LEASE}"


def lease(name: str, grace: int) -> dict[str, Any]:
    return builders.gpu_lease(
        name, "default", owner="recsys", gpus_per_replica=4, desired_gpus=8, grace_s=grace
    )


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
