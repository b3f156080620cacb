"""Each GpuNode's AgentReady condition on a real API server: True while its agent renews its
Lease, False once it is silent past the timeout, Unknown without a Lease; written only when it
changes, and kept by the agent's own status writes."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest

from common import builders, contract
from common.kubeclient import KubeClient
from extender.agents.controller import AgentConditions, stored_key
from nodeagent.publishing import KubePublisher
from tests.apiserver.conftest import ApiServer

pytestmark = pytest.mark.apiserver

GPN = f"/apis/{contract.API_VERSION}/{contract.PLURAL_GPU_NODE}"
NOW = 1_800_000_000.0


@pytest.fixture
async def kube(apiserver: ApiServer) -> AsyncIterator[KubeClient]:
    kube = await KubeClient.connect(apiserver.kubeconfig)
    try:
        yield kube
    finally:
        await kube.close()


async def test_agent_ready_follows_the_heartbeat_and_survives_the_agents_writes(
    kube: KubeClient,
) -> None:
    ns = f"agents-{uuid.uuid4().hex[:6]}"
    await kube.json("POST", "/api/v1/namespaces", body=builders.namespace(ns))
    fresh, stale, none = (f"{ns}-{n}" for n in ("fresh", "stale", "none"))
    publishers = {}
    for node in (fresh, stale, none):
        publishers[node] = KubePublisher(kube, node=node, namespace=ns)
        obj = builders.gpu_node(node, builders.devices(node, 2))
        await publishers[node].publish(obj["status"])
    await publishers[fresh].heartbeat(NOW - 5)
    await publishers[stale].heartbeat(NOW - 300)

    now = [NOW]
    agents = AgentConditions(kube, namespace=ns, timeout_s=60, clock=lambda: now[0])

    async def stored(node: str) -> tuple[str, str] | None:
        return stored_key(await kube.json("GET", f"{GPN}/{node}"))

    assert await agents.sync_once() >= 3  # other tests' GpuNodes may be there too
    assert await stored(fresh) == ("True", "Heartbeating")
    assert await stored(stale) == ("False", "AgentSilent")
    assert await stored(none) == ("Unknown", "NoHeartbeat")
    # Nothing changed: nothing written, and the second pass read names only.
    assert await agents.sync_once() == 0

    # The agent publishes its status again (DevicesHealthy and the rest): AgentReady stays.
    obj = builders.gpu_node(fresh, builders.devices(fresh, 2))
    status = {**obj["status"], "conditions": [{"type": "DevicesHealthy", "status": "True",
              "reason": "AllHealthy", "message": "2 of 2 healthy",
              "lastTransitionTime": "2027-01-15T08:00:00Z"}]}  # fmt: skip
    await publishers[fresh].publish(status)
    written = await kube.json("GET", f"{GPN}/{fresh}")
    assert {c["type"] for c in written["status"]["conditions"]} == {
        "DevicesHealthy",
        "AgentReady",
    }

    # The silent agent is back; the fresh one falls silent as time passes.
    await publishers[stale].heartbeat(NOW + 100)
    now[0] = NOW + 100
    assert await agents.sync_once() == 2
    assert await stored(stale) == ("True", "Heartbeating")
    assert await stored(fresh) == ("False", "AgentSilent")

    # A controller of a new leadership term reads what is stored and writes nothing new.
    again = AgentConditions(kube, namespace=ns, timeout_s=60, clock=lambda: now[0])
    assert await again.sync_once() == 0
