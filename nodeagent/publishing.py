"""Where the agent's view goes: the node's ``GpuNode`` status and its heartbeat ``Lease``.

The agent is the only writer of ``GpuNode.status``; the leasing controller writes ``spec``. A
status write replaces the whole status (PUT on the status subresource), retried on a conflict
with a fresh read. The heartbeat is a ``coordination.k8s.io/v1`` Lease named
``tidelease-agent-<node>`` whose ``renewTime`` the extender watches: a node whose agent has been
silent for longer than the extender's timeout offers no devices.
"""

from __future__ import annotations

import copy
import logging
from typing import Any, Protocol

from common import contract
from common.errors import Conflict, NotFound
from common.kubeclient import KubeClient
from common.timefmt import microtime

log = logging.getLogger(__name__)

LEASE_LABEL = {contract.AGENT_LABEL_KEY: contract.AGENT_LABEL_VALUE}
_GPU_NODES = f"/apis/{contract.API_VERSION}/{contract.PLURAL_GPU_NODE}"


def lease_object(namespace: str, node: str, now: float, duration_s: int) -> dict[str, Any]:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": contract.AGENT_LEASE_PREFIX + node,
            "namespace": namespace,
            "labels": LEASE_LABEL,
        },
        "spec": {
            "holderIdentity": node,
            "leaseDurationSeconds": duration_s,
            "renewTime": microtime(now),
        },
    }


class Publisher(Protocol):
    async def load(self) -> dict[str, Any] | None:
        """The node's GpuNode object as stored, or None."""
        ...

    async def publish(self, status: dict[str, Any]) -> None: ...

    async def heartbeat(self, now: float) -> None: ...


class KubePublisher:
    def __init__(
        self, kube: KubeClient, *, node: str, namespace: str, lease_duration_s: int = 60
    ) -> None:
        self._kube = kube
        self._node = node
        self._namespace = namespace
        self._lease_duration_s = lease_duration_s

    async def load(self) -> dict[str, Any] | None:
        try:
            return await self._kube.json("GET", f"{_GPU_NODES}/{self._node}")
        except NotFound:
            return None

    async def _ensure(self) -> dict[str, Any]:
        current = await self.load()
        if current is not None:
            return current
        body = {
            "apiVersion": contract.API_VERSION,
            "kind": contract.KIND_GPU_NODE,
            "metadata": {"name": self._node},
            "spec": {},
        }
        try:
            return await self._kube.json("POST", _GPU_NODES, body=body)
        except Conflict:  # created meanwhile (by a controller tagging devices)
            return await self._kube.json("GET", f"{_GPU_NODES}/{self._node}")

    async def publish(self, status: dict[str, Any]) -> None:
        for _ in range(5):
            obj = copy.deepcopy(await self._ensure())
            obj["status"] = keep_others_conditions(obj.get("status"), status)
            try:
                await self._kube.json("PUT", f"{_GPU_NODES}/{self._node}/status", body=obj)
                return
            except Conflict:
                log.info("GpuNode %s changed while publishing its status; retrying", self._node)
        raise Conflict(f"GpuNode {self._node}: status kept conflicting")

    async def heartbeat(self, now: float) -> None:
        path = f"/apis/coordination.k8s.io/v1/namespaces/{self._namespace}/leases"
        name = contract.AGENT_LEASE_PREFIX + self._node
        lease = lease_object(self._namespace, self._node, now, self._lease_duration_s)
        try:
            await self._kube.json(
                "PATCH",
                f"{path}/{name}",
                body={"spec": lease["spec"]},
                content_type="application/merge-patch+json",
            )
        except NotFound:
            await self._kube.json("POST", path, body=lease)


def keep_others_conditions(stored: object, status: dict[str, Any]) -> dict[str, Any]:
    """``status`` with the stored conditions of other writers kept (the control plane's
    AgentReady): the agent owns the condition types it writes, nothing else."""
    mine = {c.get("type") for c in status.get("conditions") or []}
    old = stored.get("conditions") if isinstance(stored, dict) else None
    others = [
        c for c in old if isinstance(c, dict) and c.get("type") not in mine
    ] if isinstance(old, list) else []  # fmt: skip
    if not others:
        return status
    return {**status, "conditions": [*(status.get("conditions") or []), *others]}


class MemoryPublisher:
    """Keeps what would be published; for tests and for running without an API server."""

    def __init__(self, stored: dict[str, Any] | None = None) -> None:
        self.stored = copy.deepcopy(stored)
        self.statuses: list[dict[str, Any]] = []
        self.heartbeats: list[float] = []

    async def load(self) -> dict[str, Any] | None:
        return copy.deepcopy(self.stored)

    async def publish(self, status: dict[str, Any]) -> None:
        self.statuses.append(copy.deepcopy(status))
        base = self.stored or {"metadata": {}, "spec": {}}
        self.stored = {
            **base,
            "status": copy.deepcopy(keep_others_conditions(base.get("status"), status)),
        }

    async def heartbeat(self, now: float) -> None:
        self.heartbeats.append(now)
