"""The pods bound to this node, for matching kubelet requests to the extender's device choice.

:class:`PodLookup` is what the plugin needs of the API server: the pods of a node, the node's
allocation ledger (``GpuAllocation``, which confirms the devices a pod's annotation names), and a
way to mark a pod as given its devices. :class:`KubePodLookup` talks to the API server through
:class:`common.kubeclient.KubeClient` (raw calls: objects stay JSON until :func:`parse_node_pod`
and :func:`parse_node_ledger`); :class:`NullPodLookup` knows no pods, so every container gets the
kubelet's pick. The faithful fake for tests is
:class:`nodeagent.deviceplugin.testing.InMemoryPodLookup`.

Errors follow :mod:`common.errors`: 404 NotFound, 409 Conflict (a UID precondition failed: the pod
was re-created), 429/5xx/network/timeouts Unavailable, other 4xx InvalidInput.
"""

from __future__ import annotations

from typing import Protocol

from common import contract
from common.errors import NotFound
from common.kubeclient import KubeClient
from nodeagent.deviceplugin.confirming import NodeLedger, parse_node_ledger
from nodeagent.deviceplugin.matching import NodePod, parse_node_pod

LEDGERS_PATH = f"/apis/{contract.API_VERSION}/{contract.PLURAL_GPU_ALLOCATION}"


class PodLookup(Protocol):
    async def pods_on_node(self, node: str) -> tuple[NodePod, ...]:
        """The node's pods that may still be waiting for devices (at least its Pending ones)."""
        ...

    async def ledger(self, node: str) -> NodeLedger:
        """The node's allocation ledger as the API server has it now (``exists=False``: none)."""
        ...

    async def mark_assigned(self, pod: NodePod) -> None:
        """Annotate ``tidelease.io/devices-assigned: "true"`` if the pod's UID still matches."""
        ...


class NullPodLookup:
    """No API server: no pod matches, every container gets the devices the kubelet picked."""

    async def pods_on_node(self, node: str) -> tuple[NodePod, ...]:
        return ()

    async def ledger(self, node: str) -> NodeLedger:
        return NodeLedger(node, exists=False)

    async def mark_assigned(self, pod: NodePod) -> None:
        return None


class KubePodLookup:
    """:class:`PodLookup` over the API server; every call is bounded by ``timeout_s``.

    The client is the caller's (shared with the rest of the agent), who also closes it.
    """

    def __init__(self, kube: KubeClient, *, timeout_s: float = 3.0) -> None:
        self._kube = kube
        self._timeout_s = timeout_s

    async def pods_on_node(self, node: str) -> tuple[NodePod, ...]:
        listed = await self._kube.json(
            "GET",
            "/api/v1/pods",
            query={"fieldSelector": f"spec.nodeName={node},status.phase=Pending"},
            request_timeout=self._timeout_s,
        )
        items = listed.get("items")
        if not isinstance(items, list):
            return ()
        return tuple(parse_node_pod(item) for item in items if isinstance(item, dict))

    async def ledger(self, node: str) -> NodeLedger:
        # A GET by name reads what the API server has committed, so a ledger entry written before
        # the bind that annotated the pod is always seen (no watch lag to wait out).
        try:
            obj = await self._kube.json(
                "GET", f"{LEDGERS_PATH}/{node}", request_timeout=self._timeout_s
            )
        except NotFound:
            return NodeLedger(node, exists=False)
        return parse_node_ledger(obj)

    async def mark_assigned(self, pod: NodePod) -> None:
        # The UID in a merge patch is a precondition: a re-created pod of that name gets a 409.
        patch = {
            "metadata": {"uid": pod.uid, "annotations": {contract.ANN_DEVICES_ASSIGNED: "true"}}
        }
        await self._kube.json(
            "PATCH",
            f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}",
            body=patch,
            content_type="application/merge-patch+json",
            request_timeout=self._timeout_s,
        )
