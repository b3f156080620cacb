"""Answering the kubelet's allocation calls: look up the node's pods, decide, confirm, mark, grant.

The decisions are :mod:`~nodeagent.deviceplugin.matching`'s and
:mod:`~nodeagent.deviceplugin.confirming`'s; this module does the I/O around them and keeps the
kubelet moving: every API call is bounded by ``api_timeout_s``, and a failure to list the node's
pods is logged and answered with the kubelet's own pick. A pod whose recorded devices match the
request gets them only once the node's allocation ledger confirms them: the ledger is read again
(every ``ledger_poll_s``, for up to ``api_timeout_s``) while it shows no entry for the pod or
cannot be read, and then the container is refused (:class:`DevicesRefused`), never given devices
on the strength of an annotation alone.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence

from common.errors import Conflict, NotFound, TideleaseError
from common.model import GpuUuid
from nodeagent.deviceplugin.confirming import Confirmation, confirm, unreadable
from nodeagent.deviceplugin.devices import DeviceSource
from nodeagent.deviceplugin.granting import ContainerGrant, container_grant
from nodeagent.deviceplugin.matching import NodePod, match_allocation, prefer
from nodeagent.deviceplugin.pods import PodLookup
from nodeagent.deviceplugin.settings import DevicePluginSettings

log = logging.getLogger(__name__)


class DevicesRefused(TideleaseError):
    """The container may not have the devices it was matched to: the ledger does not confirm them.

    The kubelet fails the pod's admission with this message.
    """


class Allocator:
    def __init__(
        self,
        *,
        source: DeviceSource,
        lookup: PodLookup,
        settings: DevicePluginSettings,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._source = source
        self._lookup = lookup
        self._settings = settings
        self._clock = clock
        self._sleep = sleep
        # Allocate calls are serialised, so two containers never match (and mark) the same pod.
        self._lock = asyncio.Lock()

    async def _pods(self) -> tuple[NodePod, ...]:
        node = self._settings.node_name
        try:
            async with asyncio.timeout(self._settings.api_timeout_s):
                return await self._lookup.pods_on_node(node)
        except TimeoutError:
            log.warning(
                "listing pods of node %s took over %.1f s; using the kubelet's pick",
                node,
                self._settings.api_timeout_s,
            )
        except Exception as e:  # the kubelet must get an answer whatever the API server does
            log.warning("listing pods of node %s failed; using the kubelet's pick: %s", node, e)
        return ()

    async def preferred(
        self, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> tuple[GpuUuid, ...]:
        """GetPreferredAllocation for one container."""
        choice = prefer(
            await self._pods(),
            self._settings.node_name,
            available,
            must_include,
            size,
            topology=self._source.topology(),
            index_of={d.uuid: d.index for d in self._source.current()},
        )
        if choice.pod is None:
            log.info(
                "preferred allocation of %d device(s): %s (%s)", size, choice.devices, choice.reason
            )
        else:
            log.info(
                "preferred allocation for pod %s: %s", choice.pod.key, ",".join(choice.devices)
            )
        return choice.devices

    async def _confirmed(self, pod: NodePod) -> Confirmation:
        """What the node's ledger says of the pod's devices, waiting a bounded time for an entry."""
        node = self._settings.node_name
        bound = self._settings.api_timeout_s
        deadline = self._clock() + bound
        while True:
            try:
                async with asyncio.timeout(max(0.0, min(bound, deadline - self._clock()))):
                    confirmation = confirm(pod, await self._lookup.ledger(node))
            except TimeoutError:
                confirmation = unreadable(f"could not be read within {bound:g} s")
            except Exception as e:  # the API server's failures, a malformed ledger: refuse
                confirmation = unreadable(f"could not be read: {e}")
            poll = self._settings.ledger_poll_s
            if not confirmation.may_catch_up or self._clock() + poll > deadline:
                return confirmation
            await self._sleep(poll)

    async def allocate(self, requested: Sequence[str]) -> ContainerGrant:
        """Allocate for one container. Raises InvalidInput for IDs this plugin never listed,
        DevicesRefused when they are a pod's recorded devices that its node's ledger does not
        confirm."""
        known = {d.uuid: d for d in self._source.current()}
        node = self._settings.node_name
        async with self._lock:
            match = match_allocation(await self._pods(), node, requested)
            devices = match.devices
            if match.pod is not None:
                confirmation = await self._confirmed(match.pod)
                if not confirmation.confirmed:
                    log.error(
                        "refusing devices %s to pod %s on node %s (%s): %s",
                        ",".join(requested),
                        match.pod.key,
                        node,
                        confirmation.outcome,
                        confirmation.reason,
                    )
                    raise DevicesRefused(
                        f"devices {','.join(requested)} refused to pod {match.pod.key} "
                        f"on node {node}: {confirmation.reason}"
                    )
                devices = confirmation.devices  # the same set, in the ledger's order
            # Checked before marking, so a request that cannot be granted leaves the pod waiting.
            grant = container_grant(
                devices,
                known,
                control_devices=self._settings.control_devices,
                permissions=self._settings.device_permissions,
                host_root=self._settings.host_device_root,
            )
            if match.pod is None:
                log.warning(
                    "allocating devices %s as the kubelet chose them: %s",
                    ",".join(requested),
                    match.reason,
                )
            else:
                await self._mark(match.pod)
                log.info("allocated devices %s to pod %s", ",".join(devices), match.pod.key)
        return grant

    async def _mark(self, pod: NodePod) -> None:
        try:
            async with asyncio.timeout(self._settings.api_timeout_s):
                await self._lookup.mark_assigned(pod)
        except (NotFound, Conflict) as e:
            log.warning("pod %s is gone or was re-created; not marked: %s", pod.key, e)
        except TimeoutError:
            log.warning(
                "marking pod %s assigned took over %.1f s; not marked",
                pod.key,
                self._settings.api_timeout_s,
            )
        except Exception as e:
            log.warning("marking pod %s assigned failed: %s", pod.key, e)
