"""Where the extender reads and writes cluster state: the :class:`Store` protocol.

Two implementations: :class:`extender.cluster.kubestore.KubeStore` talks to the API server;
:class:`MemoryStore` holds the same objects in memory for ``--snapshot`` dry runs, the embedded
demo and tests. Both give the same guarantees: ledger writes are compare-and-swap on the
object's ``resourceVersion`` (:class:`~common.errors.Conflict` when another writer got there
first), and every change reaches subscribers as a watch event, in order.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any, Literal, Protocol

from common import contract
from common.errors import Conflict, InvalidInput, NotFound
from common.model import Allocation, NodeName
from common.objects import allocation_spec, parse_gpu_allocation, resource_version

Kind = Literal["Pod", "GpuNode", "GpuAllocation", "Lease", "GpuLease", "Namespace", "ResourceClaim"]
# What the extender watches (Namespaces: those an admin granted online jobs, common.tenancy).
# ResourceClaims (resource.k8s.io) only the leasing controller watches, and only in DRA mode
# (extender/leasing/controller.py).
KINDS: tuple[Kind, ...] = ("Pod", "GpuNode", "GpuAllocation", "Lease", "GpuLease", "Namespace")
EVERY_KIND: tuple[Kind, ...] = (*KINDS, "ResourceClaim")
EventType = Literal["ADDED", "MODIFIED", "DELETED", "SYNCED"]
"""SYNCED (with an empty object) follows the initial ADDED events of each kind."""
WatchEvent = tuple[Kind, EventType, dict[str, Any]]


class Store(Protocol):
    async def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    async def read_ledger(self, node: NodeName) -> tuple[tuple[Allocation, ...], str]:
        """The node's allocations and the ledger's resourceVersion ("" if it does not exist)."""
        ...

    async def write_ledger(
        self, node: NodeName, allocations: Iterable[Allocation], version: str
    ) -> str:
        """Replace the ledger if it is still at ``version``; return the new version."""
        ...

    async def bind_pod(
        self,
        namespace: str,
        name: str,
        uid: str,
        node: str,
        annotations: Mapping[str, str] | None = None,
    ) -> None:
        """Bind the pod (UID as a precondition) and write ``annotations`` on it in the same
        update: the API server copies a Binding's annotations onto the pod it binds."""
        ...

    def watch(self, kinds: Iterable[Kind] = KINDS) -> AsyncIterator[WatchEvent]:
        """Every object of ``kinds`` as ADDED, SYNCED once per kind, then every change of
        them, until cancelled. A kind left out costs nothing: it is neither listed nor
        watched."""
        ...

    async def reachable(self) -> bool:
        """Whether the store answers now and is ready (the API server's /readyz): while it does
        not, the watched view may be stale."""
        ...


def _key(obj: dict[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return (str(meta.get("namespace", "")), str(meta.get("name", "")))


class MemoryStore:
    """An in-memory object store with the API server's concurrency semantics.

    Serves ``tidelease extender --snapshot FILE`` and the embedded demo; several extenders may
    share one to act as replicas. Events are delivered through per-subscriber queues, so a
    replica sees another's writes late, as it would through a real watch.
    """

    def __init__(self, objects: Iterable[dict[str, Any]] = ()) -> None:
        self._objects: dict[Kind, dict[tuple[str, str], dict[str, Any]]] = {
            k: {} for k in EVERY_KIND
        }
        self._rv = itertools.count(1)
        # every open watch: the kinds it follows, and its queue
        self._subscribers: list[tuple[frozenset[Kind], asyncio.Queue[WatchEvent]]] = []
        self.writes = 0
        self._up = asyncio.Event()  # cleared by tests: the store stops answering
        self._up.set()
        for obj in objects:
            self.put(obj)

    # --- object access, synchronous (for loading and for tests) ---
    def put(self, obj: dict[str, Any]) -> dict[str, Any]:
        kind = obj.get("kind")
        if kind not in self._objects:
            raise InvalidInput(f"unsupported kind {kind!r} (want one of {', '.join(EVERY_KIND)})")
        obj = copy.deepcopy(obj)
        obj.setdefault("metadata", {})["resourceVersion"] = str(next(self._rv))
        table = self._objects[kind]
        key = _key(obj)
        event: EventType = "MODIFIED" if key in table else "ADDED"
        table[key] = obj
        self._emit(kind, event, obj)
        return obj

    def delete(self, kind: Kind, namespace: str, name: str) -> None:
        obj = self._objects[kind].pop((namespace, name), None)
        if obj is not None:
            self._emit(kind, "DELETED", obj)

    def get(self, kind: Kind, namespace: str, name: str) -> dict[str, Any] | None:
        obj = self._objects[kind].get((namespace, name))
        return copy.deepcopy(obj) if obj is not None else None

    def objects(self, kind: Kind) -> list[dict[str, Any]]:
        return [copy.deepcopy(o) for o in self._objects[kind].values()]

    def watchers(self, kind: Kind) -> int:
        """How many open watches follow ``kind`` (tests: who watches what)."""
        return sum(kind in kinds for kinds, _ in self._subscribers)

    def _emit(self, kind: Kind, event: EventType, obj: dict[str, Any]) -> None:
        for kinds, q in self._subscribers:
            if kind in kinds:
                q.put_nowait((kind, event, copy.deepcopy(obj)))

    # --- the Store protocol ---
    async def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        await asyncio.sleep(0)
        return self.get("Pod", namespace, name)

    async def read_ledger(self, node: NodeName) -> tuple[tuple[Allocation, ...], str]:
        await asyncio.sleep(0)
        obj = self._objects["GpuAllocation"].get(("", node))
        if obj is None:
            return (), ""
        return parse_gpu_allocation(obj)[1], resource_version(obj)

    async def write_ledger(
        self, node: NodeName, allocations: Iterable[Allocation], version: str
    ) -> str:
        await asyncio.sleep(0)  # a round trip: other tasks run meanwhile
        current = self._objects["GpuAllocation"].get(("", node))
        current_version = resource_version(current) if current is not None else ""
        if current_version != version:
            raise Conflict(f"GpuAllocation {node}: at {current_version!r}, not {version!r}")
        self.writes += 1
        obj = self.put(
            {
                "apiVersion": contract.API_VERSION,
                "kind": contract.KIND_GPU_ALLOCATION,
                "metadata": {"name": node},
                "spec": allocation_spec(allocations),
            }
        )
        return resource_version(obj)

    def _pod(self, namespace: str, name: str, uid: str) -> dict[str, Any]:
        pod = self._objects["Pod"].get((namespace, name))
        if pod is None:
            raise NotFound(f"pod {namespace}/{name} not found")
        if uid and pod.get("metadata", {}).get("uid") != uid:
            raise Conflict(f"pod {namespace}/{name} is no longer UID {uid}")
        return copy.deepcopy(pod)

    async def bind_pod(
        self,
        namespace: str,
        name: str,
        uid: str,
        node: str,
        annotations: Mapping[str, str] | None = None,
    ) -> None:
        await asyncio.sleep(0)
        await self._up.wait()  # an API server that stopped answering: the call hangs
        pod = self._pod(namespace, name, uid)
        spec = pod.setdefault("spec", {})
        if spec.get("nodeName"):
            raise Conflict(f"pod {namespace}/{name} is already bound to {spec['nodeName']}")
        spec["nodeName"] = node
        if annotations:
            pod["metadata"].setdefault("annotations", {}).update(annotations)
        self.put(pod)

    @property
    def down(self) -> bool:
        return not self._up.is_set()

    @down.setter
    def down(self, value: bool) -> None:
        """Tests: the store stops answering (reachable says no, binds hang) or answers again."""
        if value:
            self._up.clear()
        else:
            self._up.set()

    async def reachable(self) -> bool:
        await asyncio.sleep(0)
        return self._up.is_set()

    async def watch(self, kinds: Iterable[Kind] = KINDS) -> AsyncIterator[WatchEvent]:
        followed = frozenset(kinds)
        queue: asyncio.Queue[WatchEvent] = asyncio.Queue()
        for kind in (k for k in EVERY_KIND if k in followed):
            for obj in self._objects[kind].values():
                queue.put_nowait((kind, "ADDED", copy.deepcopy(obj)))
            queue.put_nowait((kind, "SYNCED", {}))
        subscriber = (followed, queue)
        self._subscribers.append(subscriber)
        try:
            while True:
                item = await queue.get()
                yield item
                queue.task_done()  # the consumer has applied it and asks for the next
        finally:
            self._subscribers.remove(subscriber)

    async def settle(self) -> None:
        """Wait until every watcher has applied every event so far."""
        for _, queue in list(self._subscribers):
            await queue.join()
