"""The DevicePlugin gRPC service: translates between the kubelet's messages and the plugin.

No decisions here: devices come from the :class:`DeviceSource`, allocations from the
:class:`Allocator`. ListAndWatch streams end when :meth:`DevicePluginServicer.close` is called,
so stopping the server does not wait on them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc

from common.errors import InvalidInput
from common.model import Health
from nodeagent.deviceplugin import api_pb2 as pb
from nodeagent.deviceplugin.allocating import Allocator, DevicesRefused
from nodeagent.deviceplugin.devices import DeviceSource, PluginDevice
from nodeagent.deviceplugin.granting import ContainerGrant

log = logging.getLogger(__name__)

# The options registered with the kubelet and answered by GetDevicePluginOptions.
OPTIONS = pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)


def device_message(device: PluginDevice) -> pb.Device:
    health = Health.HEALTHY if device.healthy else Health.UNHEALTHY
    message = pb.Device(ID=device.uuid, health=health.value)
    if device.numa_node is not None:
        message.topology.nodes.add(ID=device.numa_node)
    return message


def list_message(devices: Sequence[PluginDevice]) -> pb.ListAndWatchResponse:
    return pb.ListAndWatchResponse(devices=[device_message(d) for d in devices])


def grant_message(grant: ContainerGrant) -> pb.ContainerAllocateResponse:
    return pb.ContainerAllocateResponse(
        envs=dict(grant.envs),
        devices=[
            pb.DeviceSpec(
                container_path=d.container_path, host_path=d.host_path, permissions=d.permissions
            )
            for d in grant.devices
        ],
        annotations=dict(grant.annotations),
    )


class DevicePluginServicer:
    """Implements v1beta1.DevicePlugin (see api.proto); register with add_to_server."""

    def __init__(self, *, source: DeviceSource, allocator: Allocator) -> None:
        self._source = source
        self._allocator = allocator
        self._closing = asyncio.Event()

    def close(self) -> None:
        """End every ListAndWatch stream (the server is about to stop)."""
        self._closing.set()

    async def GetDevicePluginOptions(
        self, request: pb.Empty, context: Any
    ) -> pb.DevicePluginOptions:
        return OPTIONS

    async def ListAndWatch(
        self, request: pb.Empty, context: Any
    ) -> AsyncIterator[pb.ListAndWatchResponse]:
        version = await self._source.changed(-1)
        sent: tuple[PluginDevice, ...] | None = None
        log.info("kubelet opened ListAndWatch")
        while not self._closing.is_set():
            devices = self._source.current()
            if devices != sent:
                healthy = sum(d.healthy for d in devices)
                log.info("ListAndWatch: %d device(s), %d healthy", len(devices), healthy)
                yield list_message(devices)
                sent = devices
            next_version = await self._next_version(version)
            if next_version is None:
                break
            version = next_version

    async def _next_version(self, after: int) -> int | None:
        """The source's next version, or None once the servicer is closing."""
        changed = asyncio.ensure_future(self._source.changed(after))
        closing = asyncio.ensure_future(self._closing.wait())
        try:
            await asyncio.wait((changed, closing), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (changed, closing):
                task.cancel()
        return changed.result() if changed.done() and not changed.cancelled() else None

    async def GetPreferredAllocation(
        self, request: pb.PreferredAllocationRequest, context: Any
    ) -> pb.PreferredAllocationResponse:
        response = pb.PreferredAllocationResponse()
        for container in request.container_requests:
            devices = await self._allocator.preferred(
                list(container.available_deviceIDs),
                list(container.must_include_deviceIDs),
                container.allocation_size,
            )
            response.container_responses.add(deviceIDs=devices)
        return response

    async def Allocate(self, request: pb.AllocateRequest, context: Any) -> pb.AllocateResponse:
        response = pb.AllocateResponse()
        for container in request.container_requests:
            try:
                grant = await self._allocator.allocate(list(container.devices_ids))
            except InvalidInput as e:
                log.error("Allocate refused: %s", e)
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
                raise  # abort() raises; not reached
            except DevicesRefused as e:
                log.error("Allocate refused: %s", e)
                await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(e))
                raise  # abort() raises; not reached
            response.container_responses.append(grant_message(grant))
        return response

    async def PreStartContainer(
        self, request: pb.PreStartContainerRequest, context: Any
    ) -> pb.PreStartContainerResponse:
        return pb.PreStartContainerResponse()
