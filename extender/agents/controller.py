"""Writes each GpuNode's ``AgentReady`` condition (extender.agents.readiness) from the agents'
heartbeat Leases; one of ``tidelease controllers``, leader-elected.

Heartbeats come every few seconds from every node, so this controller does not watch them: it
lists the Leases every ``interval_s`` (a quarter of the timeout, at most 15 s) and the GpuNodes'
names (metadata only), and writes a node's condition only when its status or reason changes. At
the start of each leadership term it lists the GpuNodes whole once, to learn what is stored.
A write is a compare-and-swap of the GpuNode's status (the agent writes the same status; it
keeps conditions of other writers), so nothing is lost to a race, and a killed controller
resumes from what is stored.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from typing import Any

from common import contract
from common.conditions import set_condition
from common.errors import Conflict, NotFound, TideleaseError
from common.heartbeat import heartbeat
from common.kubeclient import KubeClient, api_error
from extender.agents.readiness import AgentReady, agent_ready

log = logging.getLogger(__name__)

CONDITION = "AgentReady"
LEADER_LEASE = "tidelease-agent-conditions"
_GPU_NODES = f"/apis/{contract.API_VERSION}/{contract.PLURAL_GPU_NODE}"
_METADATA_ONLY = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"


def stored_key(node: dict[str, Any]) -> tuple[str, str] | None:
    """The stored AgentReady condition's (status, reason), or None."""
    for c in (node.get("status") or {}).get("conditions") or []:
        if isinstance(c, dict) and c.get("type") == CONDITION:
            return str(c.get("status")), str(c.get("reason"))
    return None


class AgentConditions:
    def __init__(
        self,
        kube: KubeClient,
        *,
        namespace: str,
        timeout_s: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.kube, self.namespace, self.timeout_s, self.clock = kube, namespace, timeout_s, clock
        self.interval_s = min(15.0, timeout_s / 4)
        # What is stored, as far as this controller knows: node -> (status, reason).
        self.known: dict[str, tuple[str, str] | None] | None = None

    async def _renewals(self) -> dict[str, float | None]:
        leases = await self.kube.json(
            "GET",
            f"/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases",
            query={"labelSelector": f"{contract.AGENT_LABEL_KEY}={contract.AGENT_LABEL_VALUE}"},
        )
        return dict(heartbeat(lease) for lease in leases.get("items") or [])

    async def _node_names(self) -> list[str]:
        resp = await self.kube.raw("GET", _GPU_NODES, accept=_METADATA_ONLY)
        try:
            data = await resp.read()
            if resp.status != 200:
                raise api_error(resp.status, f"GET {_GPU_NODES}", data)
            body = json.loads(data)
        finally:
            resp.release()
        return [str(item["metadata"]["name"]) for item in body.get("items") or []]

    async def sync_once(self) -> int:
        """One pass: every GpuNode's condition as its agent's heartbeat says; how many were
        written."""
        renewed = await self._renewals()
        if self.known is None:
            nodes = await self.kube.json("GET", _GPU_NODES)
            known = {str(n["metadata"]["name"]): stored_key(n) for n in nodes.get("items") or []}
        else:
            names = await self._node_names()
            known = {name: self.known.get(name) for name in names}
        self.known = known
        now, written = self.clock(), 0
        for node in sorted(known):
            want = agent_ready(node, renewed.get(node), now, self.timeout_s)
            if known[node] == want.key:
                continue
            known[node] = await self._write(node, want)
            written += 1
        return written

    async def _write(self, node: str, want: AgentReady) -> tuple[str, str] | None:
        """Set the condition (compare-and-swap); what is stored after."""
        path = f"{_GPU_NODES}/{node}"
        for _ in range(5):
            try:
                obj = await self.kube.json("GET", path)
            except NotFound:
                return None
            if stored_key(obj) == want.key:
                return want.key
            status = obj.get("status") or {}
            status["conditions"] = set_condition(
                status.get("conditions"), CONDITION, want.status, want.reason, want.message,
                self.clock(),
            )  # fmt: skip
            obj["status"] = status
            try:
                await self.kube.json("PUT", f"{path}/status", body=obj)
            except NotFound:
                return None
            except Conflict:
                continue
            log.log(
                logging.WARNING if want.status != "True" else logging.INFO,
                "GpuNode %s: AgentReady %s (%s): %s",
                node,
                want.status,
                want.reason,
                want.message,
            )
            return want.key
        raise Conflict(f"GpuNode {node}: its status kept changing")

    async def run(self) -> None:
        """Pass after pass until cancelled (one leadership term: what is stored is read anew)."""
        self.known = None
        while True:
            try:
                await self.sync_once()
            except TideleaseError as e:
                log.warning(
                    "agent conditions: pass failed (next in %.0f s): %s", self.interval_s, e
                )
            await asyncio.sleep(self.interval_s)
