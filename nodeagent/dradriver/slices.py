"""The node's ResourceSlice, mirrored from its GpuNode (:mod:`common.deviceattributes` says what
it holds).

:class:`SliceMirror` list-watches the node's ``GpuNode`` and its own ResourceSlice (one object
each, by name) and after every event reconciles: it reads both afresh and makes the slice what
:func:`common.deviceattributes.resource_slice` wants,

* created when the GpuNode lists devices (owned by the Node, when the Node exists, so that the
  garbage collector removes it with the Node);
* updated when the stored spec differs from the wanted one, the pool generation one higher when
  the devices changed (kept otherwise); labels, annotations and owners of others are kept;
* deleted when the GpuNode lists no devices, does not parse (logged: like the extender, tidelease
  offers none of such a node's devices) or is gone.

A node whose devices are all withdrawn (none healthy) keeps a slice with no devices. Writes are
compare-and-swap on the slice's ``resourceVersion``; the reconcile loop
(:class:`common.reconcile.ReconcileLoop`, one key: the node) retries a conflict at once with a
fresh read, any other failure (the API server unavailable) with exponential backoff, and
reconciles every ``resync_s`` anyway. :func:`sync_once` is one pass, for tests and tools.

The agent needs: ``get``, ``list``, ``watch`` on its GpuNode; ``get`` on its Node; ``get``,
``list``, ``watch``, ``create``, ``update``, ``delete`` on ``resourceslices``
(``resource.k8s.io``).
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry

from common import contract, deviceattributes
from common.errors import InvalidInput, NotFound
from common.kubeclient import KubeClient
from common.logsetup import log_context
from common.reconcile import ReconcileLoop, ReconcileSettings, Result, Wait, wait_for_wakeup
from common.watches import Watches

log = logging.getLogger(__name__)

CONTROLLER = "dra-slices"
GPU_NODES = f"/apis/{contract.API_VERSION}/{contract.PLURAL_GPU_NODE}"
NODES = "/api/v1/nodes"
# Conflicts are retried at once; other errors after 0.5 s, doubling up to 30 s; every 5 minutes
# the slice is compared anyway (an edit whose event was missed).
DEFAULT_SETTINGS = ReconcileSettings(
    resync_s=300.0, retry_base_s=0.5, retry_cap_s=30.0, conflict_retry_s=0.05
)


def _devices_of(slice_obj: Mapping[str, Any]) -> list[str]:
    return [
        str(d.get("name"))
        for d in deviceattributes.stored_devices(slice_obj)
        if isinstance(d, dict)
    ]


def _immutable(spec: Mapping[str, Any]) -> tuple[object, object, object]:
    pool = spec.get("pool")
    return spec.get("driver"), spec.get("nodeName"), (pool or {}).get("name")


class SliceMirror:
    """Keeps ``node``'s ResourceSlice equal to what its GpuNode says; :meth:`run` until
    cancelled, or :meth:`sync` for one pass."""

    def __init__(
        self,
        client: KubeClient,
        node: str,
        *,
        settings: ReconcileSettings = DEFAULT_SETTINGS,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.monotonic,
        wait: Wait = wait_for_wakeup,
    ) -> None:
        self._kube = client
        self.node = node
        self.name = deviceattributes.slice_name(node)
        self._slice_path = f"{deviceattributes.SLICES_PATH}/{self.name}"
        # The highest pool generation written: a re-created slice goes on from it.
        self.generation = 0
        self.loop = ReconcileLoop(
            CONTROLLER,
            self._reconcile,
            keys=lambda: (node,),
            settings=settings,
            registry=registry,
            clock=clock,
            wait=wait,
        )

    async def run(self, *, ready: asyncio.Event | None = None) -> None:
        """Mirror until cancelled; ``ready`` is set once the first pass is over."""
        with log_context(controller=CONTROLLER, name=self.name):
            async with Watches(self._kube, f"{CONTROLLER}-{self.node}") as watches:

                def changed(_event: str, _obj: dict[str, Any]) -> None:
                    self.loop.add(self.node)

                watches.add(
                    "gpunode", GPU_NODES, changed, {"fieldSelector": f"metadata.name={self.node}"}
                )
                watches.add(
                    "resourceslice",
                    deviceattributes.SLICES_PATH,
                    changed,
                    {"fieldSelector": f"metadata.name={self.name}"},
                )
                await watches.wait_synced()
                loop_task = asyncio.create_task(self.loop.run(ready=ready), name=CONTROLLER)
                try:
                    while not loop_task.done():
                        watches.check()
                        await asyncio.wait({loop_task}, timeout=1.0)
                    loop_task.result()
                finally:
                    loop_task.cancel()
                    await asyncio.gather(loop_task, return_exceptions=True)

    async def _reconcile(self, _key: str) -> Result:
        await self.sync()
        return None

    async def sync(self) -> dict[str, Any]:
        """One pass: the slice as stored afterwards ({} when there is none). Raises what the
        API server answered (:class:`common.errors.Conflict` when the slice changed meanwhile)."""
        devices = await self._wanted_devices()
        stored = await self._get(self._slice_path)
        if stored is not None and _immutable(stored.get("spec") or {}) != (
            deviceattributes.DRIVER,
            self.node,
            self.node,
        ):
            # Driver, node and pool cannot change: a slice of that name that is not ours.
            await self._delete(stored, "its driver, node or pool is not ours")
            stored = None
        if devices is None:
            if stored is not None:
                await self._delete(stored, "the GpuNode offers no devices")
            return {}
        generation = deviceattributes.next_generation(stored, devices, self.generation)
        spec = deviceattributes.slice_spec(self.node, devices, generation)
        if stored is not None and stored.get("spec") == spec:
            self.generation = max(self.generation, generation)
            return stored
        node_uid = await self._node_uid()
        wanted = deviceattributes.slice_object(self.node, node_uid, spec)
        if stored is None:
            written = await self._kube.json("POST", deviceattributes.SLICES_PATH, body=wanted)
            what = "created"
        else:
            body = {**wanted, "metadata": _merged_metadata(stored, wanted)}
            written = await self._kube.json("PUT", self._slice_path, body=body)
            what = "updated"
        self.generation = max(self.generation, generation)
        log.info(
            "ResourceSlice %s %s: pool %s generation %d, devices %s",
            self.name,
            what,
            self.node,
            generation,
            ", ".join(_devices_of(written)) or "none (all withdrawn)",
        )
        return written

    async def _wanted_devices(self) -> list[dict[str, Any]] | None:
        """The devices to publish; None when no slice is wanted."""
        gpunode = await self._get(f"{GPU_NODES}/{self.node}")
        if gpunode is None:
            return None
        status = gpunode.get("status")
        if not isinstance(status, dict) or not status.get("devices"):
            return None
        try:
            return deviceattributes.slice_devices(gpunode)
        except InvalidInput as e:
            log.warning(
                "GpuNode %s does not parse; publishing none of its devices: %s", self.node, e
            )
            return None

    async def _get(self, path: str) -> dict[str, Any] | None:
        try:
            return await self._kube.json("GET", path)
        except NotFound:
            return None

    async def _node_uid(self) -> str | None:
        node = await self._get(f"{NODES}/{self.node}")
        uid = ((node or {}).get("metadata") or {}).get("uid")
        if not isinstance(uid, str) or not uid:
            log.info("Node %s not found: its ResourceSlice gets no owner", self.node)
            return None
        return uid

    async def _delete(self, stored: Mapping[str, Any], why: str) -> None:
        meta = stored.get("metadata") or {}
        preconditions = {k: meta[k] for k in ("uid", "resourceVersion") if meta.get(k)}
        try:
            await self._kube.json("DELETE", self._slice_path, body={"preconditions": preconditions})
        except NotFound:
            return
        log.info("ResourceSlice %s deleted: %s", self.name, why)


def _merged_metadata(stored: Mapping[str, Any], wanted: Mapping[str, Any]) -> dict[str, Any]:
    """The stored metadata (its resourceVersion: the write is a compare-and-swap) with our
    labels, and our Node owner in place of any other Node owner (when we know the Node)."""
    meta = copy.deepcopy(dict(stored.get("metadata") or {}))
    ours = wanted["metadata"]
    meta["labels"] = {**(meta.get("labels") or {}), **ours["labels"]}
    if "ownerReferences" in ours:
        others = [r for r in meta.get("ownerReferences") or [] if r.get("kind") != "Node"]
        meta["ownerReferences"] = others + ours["ownerReferences"]
    return meta


async def run_slice_mirror(
    *,
    client: KubeClient,
    node: str,
    settings: ReconcileSettings = DEFAULT_SETTINGS,
    registry: CollectorRegistry | None = None,
    ready: asyncio.Event | None = None,
) -> None:
    """``node``'s :class:`SliceMirror` until cancelled (the agent's TaskGroup runs it)."""
    await SliceMirror(client, node, settings=settings, registry=registry).run(ready=ready)


async def sync_once(client: KubeClient, node: str) -> dict[str, Any]:
    """One pass of ``node``'s mirror: the slice as stored afterwards ({} when there is none)."""
    return await SliceMirror(client, node).sync()
