"""The device plugin's lifecycle: serve on a unix socket, register, re-register after restarts.

One round: start the gRPC server on ``<plugin_dir>/<socket_name>``, register with the kubelet
(retrying while it is away), then watch the socket file. A kubelet that starts deletes every
socket in its dir, so the file disappearing (or being replaced) means a new kubelet that does not
know the plugin: stop the server and begin the next round. The socket is removed on the way out.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from pathlib import Path

import grpc

from common.errors import InvalidInput
from nodeagent.deviceplugin import api_pb2_grpc, sockets
from nodeagent.deviceplugin.allocating import Allocator
from nodeagent.deviceplugin.devices import DeviceSource
from nodeagent.deviceplugin.pods import PodLookup
from nodeagent.deviceplugin.registering import register
from nodeagent.deviceplugin.servicer import DevicePluginServicer
from nodeagent.deviceplugin.settings import DevicePluginSettings

log = logging.getLogger(__name__)


def _add(servicer: DevicePluginServicer, server: grpc.aio.Server) -> None:
    api_pb2_grpc.add_DevicePluginServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]


async def _until_removed(path: Path, ours: sockets.FileId, poll_s: float) -> None:
    """Return once the socket file at ``path`` is gone or is another one (polled)."""
    while True:
        await asyncio.sleep(poll_s)
        if not sockets.is_ours(path, ours):
            return


async def run_device_plugin(
    *,
    source: DeviceSource,
    lookup: PodLookup,
    settings: DevicePluginSettings,
    ready: asyncio.Event | None = None,
) -> None:
    """Serve and stay registered until cancelled; ``ready`` is set on the first registration.

    Raises InvalidInput at once for unusable settings. Failures to bind the socket are logged
    and retried with backoff, so the rest of the agent keeps running.
    """
    problems = settings.validate()
    if problems:
        raise InvalidInput(problems)
    allocator = Allocator(source=source, lookup=lookup, settings=settings)
    path = settings.socket_path
    delay = settings.register_backoff_s
    while True:
        servicer = DevicePluginServicer(source=source, allocator=allocator)
        try:
            server, ours = await sockets.start_unix_server(path, functools.partial(_add, servicer))
        except (OSError, RuntimeError) as e:
            log.error("cannot serve on %s, trying again in %.1f s: %s", path, delay, e)
            await asyncio.sleep(delay)
            delay = min(delay * 2, settings.register_backoff_max_s)
            continue
        delay = settings.register_backoff_s
        try:
            if await register(
                settings, still_serving=functools.partial(sockets.is_ours, path, ours)
            ):
                if ready is not None:
                    ready.set()
                await _until_removed(path, ours, settings.socket_poll_s)
            log.warning("plugin socket %s was removed (kubelet restart): serving anew", path)
        finally:
            servicer.close()
            await server.stop(settings.stop_grace_s)
            sockets.remove_if_ours(path, ours)
