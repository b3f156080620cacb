"""Answering the kubelet's allocation calls: look up the node's pods, decide, mark, grant.

The decisions are :mod:`~nodeagent.deviceplugin.matching`'s; this module does the I/O around
them and keeps the kubelet moving: every API call is bounded by ``api_timeout_s`` and any failure
of it is logged and answered with the kubelet's own pick, never with an error.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from common.errors import Conflict, NotFound
from common.model import GpuUuid
from nodeagent.deviceplugin.devices import DeviceSource
from nodeagent.deviceplugin.granting import ContainerGrant, container_grant
from nodeagent.deviceplugin.matching import NodePod, match_allocation, prefer
from nodeagent.deviceplugin.pods import PodLookup
from nodeagent.deviceplugin.settings import DevicePluginSettings

log = logging.getLogger(__name__)


class Allocator:
    def __init__(
        self, *, source: DeviceSource, lookup: PodLookup, settings: DevicePluginSettings
    ) -> None:
        self._source = source
        self._lookup = lookup
        self._settings = settings
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
        choice = prefer(await self._pods(), self._settings.node_name, available, must_include, size)
        if choice.pod is None:
            log.info(
                "preferred allocation of %d device(s): %s (%s)", size, choice.devices, choice.reason
            )
        else:
            log.info(
                "preferred allocation for pod %s: %s", choice.pod.key, ",".join(choice.devices)
            )
        return choice.devices

    async def allocate(self, requested: Sequence[str]) -> ContainerGrant:
        """Allocate for one container. Raises InvalidInput for IDs this plugin never listed."""
        known = {d.uuid: d for d in self._source.current()}
        async with self._lock:
            match = match_allocation(await self._pods(), self._settings.node_name, requested)
            # Checked before marking, so a request that cannot be granted leaves the pod waiting.
            grant = container_grant(
                match.devices,
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
                log.info("allocated devices %s to pod %s", ",".join(match.devices), match.pod.key)
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
