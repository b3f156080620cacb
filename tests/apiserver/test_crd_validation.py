"""What the CRDs themselves refuse, on a real API server (before any controller reads it)."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from common import builders, contract
from common.conditions import set_condition
from common.errors import InvalidInput
from common.kubeclient import KubeClient
from extender.rightofreturn.lease import MIN_GRACE_S
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


CRD = f"/apis/{contract.API_VERSION}"
NODES = f"{CRD}/{contract.PLURAL_GPU_NODE}"
LEDGERS = f"{CRD}/{contract.PLURAL_GPU_ALLOCATION}"
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io"  # what kubectl get asks for


def spec_lease(name: str, **spec: Any) -> dict[str, Any]:
    obj = builders.gpu_lease(name, "default", owner="recsys", gpus_per_replica=4)
    obj["spec"].update(spec)
    return obj


@pytest.mark.parametrize(
    ("spec", "refused"),
    [
        ({"desiredGPUs": 8}, None),
        ({"desiredGPUs": 6}, "desiredGPUs must be a multiple of gpusPerReplica"),
        ({"schedule": [{"at": "08:00", "gpus": 16}, {"at": "22:00", "gpus": 4}]}, None),
        (
            {"schedule": [{"at": "08:00", "gpus": 16}, {"at": "22:00", "gpus": 2}]},
            "every schedule entry's gpus must be a multiple of gpusPerReplica",
        ),
        (
            {"schedule": [{"at": "08:00", "gpus": 16}, {"at": "08:00", "gpus": 4}]},
            "two schedule entries have the same time",
        ),
        ({"schedule": [{"at": "24:00", "gpus": 4}]}, "spec.schedule[0].at"),
    ],
)
async def test_lease_counts_are_whole_replicas_and_schedule_times_distinct(
    apiserver: ApiServer, spec: dict[str, Any], refused: str | None
) -> None:
    kube = await KubeClient.connect(apiserver.kubeconfig)
    try:
        obj = spec_lease("rules", **spec)
        if refused is None:
            await kube.json("POST", f"{LEASES}?dryRun=All", body=obj)
        else:
            with pytest.raises(InvalidInput, match=re.escape(refused)):
                await kube.json("POST", f"{LEASES}?dryRun=All", body=obj)
    finally:
        await kube.close()


async def test_a_ledger_holds_one_allocation_per_pod_and_a_replica_tag_needs_its_owner(
    apiserver: ApiServer,
) -> None:
    kube = await KubeClient.connect(apiserver.kubeconfig)
    entry = {"podUID": "u1", "namespace": "ml", "name": "p", "devices": ["GPU-a"]}
    ledger = {
        "apiVersion": contract.API_VERSION,
        "kind": contract.KIND_GPU_ALLOCATION,
        "metadata": {"name": "n-rules"},
        "spec": {"allocations": [entry, {**entry, "devices": ["GPU-b"]}]},
    }
    node = builders.gpu_node("n-rules", builders.devices("n-rules", 1))
    node["spec"] = {"devices": [{"uuid": builders.device_uuid("n-rules", 0), "replica": "r-1"}]}
    try:
        with pytest.raises(InvalidInput, match="a pod has at most one allocation"):
            await kube.json("POST", f"{LEDGERS}?dryRun=All", body=ledger)
        ledger["spec"]["allocations"][1]["podUID"] = "u2"
        await kube.json("POST", f"{LEDGERS}?dryRun=All", body=ledger)
        with pytest.raises(InvalidInput, match="a replica tag needs the owner"):
            await kube.json("POST", f"{NODES}?dryRun=All", body=node)
        node["spec"]["devices"][0]["owner"] = "recsys"
        await kube.json("POST", f"{NODES}?dryRun=All", body=node)
    finally:
        await kube.close()


async def test_kubectl_get_shows_the_columns_an_admin_reads(apiserver: ApiServer) -> None:
    """Server-side printing, as kubectl asks for it (a Table)."""
    kube = await KubeClient.connect(apiserver.kubeconfig)
    try:
        for path, want in (
            (
                LEASES,
                ["Name", "Owner", "Phase", "Degraded", "Desired", "Replicas", "Reclaims", "Age"],
            ),
            (LEDGERS, ["Name", "Pods", "Age"]),
        ):
            resp = await kube.raw("GET", path, accept=TABLE)
            try:
                got = json.loads(await resp.read())
            finally:
                resp.release()
            assert [c["name"] for c in got["columnDefinitions"]] == want
    finally:
        await kube.close()


async def test_a_gpunode_keeps_its_devices_healthy_condition_and_shows_it(
    apiserver: ApiServer,
) -> None:
    """The agent's condition survives the schema (not pruned) and is a column of
    ``kubectl get gpunodes``."""
    kube = await KubeClient.connect(apiserver.kubeconfig)
    name = "n-condition"
    node = builders.gpu_node(name, builders.devices(name, 2))
    conditions = set_condition(None, "DevicesHealthy", "True", "AllHealthy", "2 of 2 healthy", 1e9)
    try:
        created = await kube.json("POST", NODES, body=node)
        created["status"] = {**node["status"], "conditions": conditions}
        written = await kube.json("PUT", f"{NODES}/{name}/status", body=created)
        assert written["status"]["conditions"] == conditions
        resp = await kube.raw("GET", f"{NODES}/{name}", accept=TABLE)
        try:
            table = json.loads(await resp.read())
        finally:
            resp.release()
        columns = [c["name"] for c in table["columnDefinitions"]]
        assert columns == ["Name", "Agent", "Healthy", "Reason", "Observed", "Age"]
        assert table["rows"][0]["cells"][:4] == [name, None, "True", "AllHealthy"]
    finally:
        await kube.json("DELETE", f"{NODES}/{name}")
        await kube.close()
