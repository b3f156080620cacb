"""The :class:`~extender.cluster.store.Store` backed by the Kubernetes API server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable, Mapping
from pathlib import Path
from typing import Any

from common import contract, deviceattributes, tenancy
from common.errors import NotFound, Unavailable
from common.kubeclient import KubeClient
from common.model import Allocation, NodeName
from common.objects import gpu_allocation_object, parse_gpu_allocation, resource_version
from extender.cluster.store import KINDS, EventType, Kind, WatchEvent

_CRD_BASE = f"/apis/{contract.GROUP}/{contract.VERSION}"
_LIST_PATHS: dict[Kind, str] = {
    "Pod": "/api/v1/pods",
    "GpuNode": f"{_CRD_BASE}/{contract.PLURAL_GPU_NODE}",
    "GpuAllocation": f"{_CRD_BASE}/{contract.PLURAL_GPU_ALLOCATION}",
    "GpuLease": f"{_CRD_BASE}/{contract.PLURAL_GPU_LEASE}",
    "ResourceClaim": f"/apis/{deviceattributes.API_VERSION}/resourceclaims",
}


class KubeStore:
    def __init__(
        self, kube: KubeClient, agent_namespace: str = contract.DEFAULT_AGENT_NAMESPACE
    ) -> None:
        self._kube = kube
        self._watches: dict[Kind, tuple[str, dict[str, Any] | None]] = {
            kind: (path, None) for kind, path in _LIST_PATHS.items()
        }
        # Only the Namespaces an admin granted online jobs: a label removed reads as DELETED.
        self._watches["Namespace"] = (
            "/api/v1/namespaces",
            {"labelSelector": f"{tenancy.LABEL_ONLINE}={tenancy.ONLINE_VALUE}"},
        )
        self._watches["Lease"] = (
            f"/apis/coordination.k8s.io/v1/namespaces/{agent_namespace}/leases",
            {"labelSelector": f"{contract.AGENT_LABEL_KEY}={contract.AGENT_LABEL_VALUE}"},
        )

    @classmethod
    async def connect(
        cls,
        kubeconfig: Path | None = None,
        agent_namespace: str = contract.DEFAULT_AGENT_NAMESPACE,
    ) -> KubeStore:
        return cls(await KubeClient.connect(kubeconfig), agent_namespace)

    async def close(self) -> None:
        await self._kube.close()

    async def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return await self._kube.json("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")
        except NotFound:
            return None

    async def read_ledger(self, node: NodeName) -> tuple[tuple[Allocation, ...], str]:
        try:
            obj = await self._kube.json("GET", f"{_LIST_PATHS['GpuAllocation']}/{node}")
        except NotFound:
            return (), ""
        return parse_gpu_allocation(obj)[1], resource_version(obj)

    async def write_ledger(
        self, node: NodeName, allocations: Iterable[Allocation], version: str
    ) -> str:
        obj = gpu_allocation_object(node, allocations, version)
        path = _LIST_PATHS["GpuAllocation"]
        if version:
            written = await self._kube.json("PUT", f"{path}/{node}", body=obj)
        else:  # create; a concurrent creator makes this 409 AlreadyExists, i.e. Conflict
            written = await self._kube.json("POST", path, body=obj)
        return resource_version(written)

    async def bind_pod(
        self,
        namespace: str,
        name: str,
        uid: str,
        node: str,
        annotations: Mapping[str, str] | None = None,
    ) -> None:
        # The UID is a precondition (a re-created pod of that name fails the binding), and the
        # API server writes the Binding's annotations on the pod in the same update as the node.
        metadata: dict[str, Any] = {"name": name, "namespace": namespace, "uid": uid}
        if annotations:
            metadata["annotations"] = dict(annotations)
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": metadata,
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        await self._kube.json(
            "POST", f"/api/v1/namespaces/{namespace}/pods/{name}/binding", body=binding
        )

    async def reachable(self) -> bool:
        """The API server's /readyz (open to every client): 200 within 3 s, or not reachable.
        A paused etcd fails it while the watches still look connected."""
        try:
            resp = await self._kube.raw("GET", "/readyz", request_timeout=3)
        except Unavailable:
            return False
        try:
            return resp.status == 200
        finally:
            resp.release()

    async def list_objects(self, kind: Kind) -> list[dict[str, Any]]:
        """Every object of a kind, as the watch of that kind lists them (one request)."""
        path, query = self._watches[kind]
        listed = await self._kube.json("GET", path, query=query)
        items = listed.get("items") or []
        return [item for item in items if isinstance(item, dict)]

    async def watch(self, kinds: Iterable[Kind] = KINDS) -> AsyncIterator[WatchEvent]:
        wanted = frozenset(kinds)
        queue: asyncio.Queue[WatchEvent] = asyncio.Queue(maxsize=10_000)

        async def pump(kind: Kind, path: str, query: dict[str, Any] | None) -> None:
            async for event, obj in self._kube.list_watch(path, query):
                etype: EventType = event  # type: ignore[assignment]
                await queue.put((kind, etype, obj))

        tasks = [
            asyncio.create_task(pump(kind, path, query), name=f"watch-{kind}")
            for kind, (path, query) in self._watches.items()
            if kind in wanted
        ]
        try:
            while True:
                yield await queue.get()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
