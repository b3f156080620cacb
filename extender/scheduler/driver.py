"""A stand-in for kube-scheduler's extender client: the same requests, in the same order.

For one pod it calls filter, then prioritize on the nodes that passed, picks the best score (ties
by name), and binds; when no node passes but some could after preemption, it calls preempt with
every lower-priority pod on those nodes as the proposal, evicts the victims of the node with the
fewest, and tries again. The embedded demo, the HTTP tests and the benchmarks drive an extender
through it. The real kube-scheduler does the same against the local cluster in tests/e2e.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from common.errors import Unavailable

Evict = Callable[[str, list[str]], Awaitable[None]]  # node, victim pod UIDs


@dataclass(slots=True)
class Outcome:
    pod: str
    node: str = ""
    error: str = ""
    failed: dict[str, str] = field(default_factory=dict)
    unresolvable: dict[str, str] = field(default_factory=dict)
    scores: dict[str, int] = field(default_factory=dict)
    victims: dict[str, list[str]] = field(default_factory=dict)

    @property
    def bound(self) -> bool:
        return bool(self.node) and not self.error


class SchedulerDriver:
    def __init__(self, session: aiohttp.ClientSession, base_url: str) -> None:
        self._session = session
        self._base = base_url.rstrip("/")

    async def call(self, verb: str, body: object) -> tuple[int, Any]:
        try:
            async with self._session.post(f"{self._base}/{verb}", json=body) as resp:
                return resp.status, await resp.json(content_type=None)
        except aiohttp.ClientError as e:
            raise Unavailable(f"{verb}: {e}") from e

    async def filter(self, pod: dict[str, Any], nodes: Sequence[str]) -> dict[str, Any]:
        status, reply = await self.call("filter", {"Pod": pod, "Nodes": None, "NodeNames": nodes})
        if status != 200:
            raise Unavailable(f"filter answered {status}: {reply}")
        return dict(reply)

    async def schedule(
        self,
        pod: dict[str, Any],
        nodes: Sequence[str],
        *,
        victims_on: Callable[[str], list[dict[str, Any]]] | None = None,
        evict: Evict | None = None,
    ) -> Outcome:
        meta = pod["metadata"]
        out = Outcome(pod=f"{meta['namespace']}/{meta['name']}")
        for _ in range(2):  # once, and once more after a preemption
            reply = await self.filter(pod, nodes)
            out.failed = reply.get("FailedNodes") or {}
            out.unresolvable = reply.get("FailedAndUnresolvableNodes") or {}
            if reply.get("Error"):
                out.error = reply["Error"]
                return out
            passed = reply.get("NodeNames") or []
            if passed:
                status, scores = await self.call(
                    "prioritize", {"Pod": pod, "Nodes": None, "NodeNames": passed}
                )
                if status != 200:
                    raise Unavailable(f"prioritize answered {status}: {scores}")
                out.scores = {s["Host"]: s["Score"] for s in scores}
                best = min(passed, key=lambda n: (-out.scores.get(n, 0), n))
                status, result = await self.call(
                    "bind",
                    {
                        "PodName": meta["name"],
                        "PodNamespace": meta["namespace"],
                        "PodUID": meta["uid"],
                        "Node": best,
                    },
                )
                out.node, out.error = (
                    best,
                    result.get("Error", "") if status == 200 else str(result),
                )
                return out
            if not out.failed or victims_on is None or evict is None:
                out.error = "unschedulable"
                return out
            proposal = {
                node: {
                    "Pods": [{"UID": p["metadata"]["uid"]} for p in victims_on(node)],
                    "NumPDBViolations": 0,
                }
                for node in out.failed
            }
            status, answer = await self.call(
                "preempt", {"Pod": pod, "NodeNameToMetaVictims": proposal}
            )
            if status != 200:
                raise Unavailable(f"preempt answered {status}: {answer}")
            chosen = answer.get("NodeNameToMetaVictims") or {}
            if not chosen:
                out.error = "unschedulable: preemption cannot help"
                return out
            node = min(chosen, key=lambda n: (len(chosen[n]["Pods"]), n))
            out.victims = {node: [v["UID"] for v in chosen[node]["Pods"]]}
            await evict(node, out.victims[node])
        out.error = "unschedulable after preemption"
        return out
