"""Registering with the kubelet: v1beta1.Registration/Register on ``kubelet.sock``.

The kubelet answers Register, then dials the plugin's socket (which must already be serving) for
GetDevicePluginOptions and ListAndWatch. While ``kubelet.sock`` is absent (the kubelet is down or
restarting), registration is retried with exponential backoff.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import grpc

from nodeagent.deviceplugin import api_pb2 as pb
from nodeagent.deviceplugin import api_pb2_grpc
from nodeagent.deviceplugin.servicer import OPTIONS
from nodeagent.deviceplugin.settings import API_VERSION, DevicePluginSettings

log = logging.getLogger(__name__)


class RegistrationFailed(Exception):
    """One Register call failed; ``absent`` when there was no kubelet socket to call."""

    def __init__(self, message: str, *, absent: bool = False) -> None:
        super().__init__(message)
        self.absent = absent


def register_request(settings: DevicePluginSettings) -> pb.RegisterRequest:
    return pb.RegisterRequest(
        version=API_VERSION,
        endpoint=settings.socket_name,
        resource_name=settings.resource_name,
        options=OPTIONS,
    )


async def register_once(settings: DevicePluginSettings) -> None:
    """One Register call. Raises RegistrationFailed."""
    path = settings.kubelet_socket_path
    if not path.exists():
        raise RegistrationFailed(f"no kubelet socket at {path}", absent=True)
    async with grpc.aio.insecure_channel(f"unix://{path}") as channel:
        stub = api_pb2_grpc.RegistrationStub(channel)  # type: ignore[no-untyped-call]
        try:
            await stub.Register(register_request(settings), timeout=settings.register_timeout_s)
        except grpc.aio.AioRpcError as e:
            absent = e.code() == grpc.StatusCode.UNAVAILABLE
            raise RegistrationFailed(f"{e.code().name}: {e.details()}", absent=absent) from e


async def _pause(settings: DevicePluginSettings, delay: float, *, wake: Callable[[], bool]) -> None:
    """Sleep ``delay``, cut short once ``wake()`` turns true (checked every ``socket_poll_s``)."""
    woke_at_start = wake()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + delay
    while (left := deadline - loop.time()) > 0:
        await asyncio.sleep(min(left, settings.socket_poll_s))
        if not woke_at_start and wake():
            return


async def register(
    settings: DevicePluginSettings, *, still_serving: Callable[[], bool] = lambda: True
) -> bool:
    """Register, retrying with backoff; False when ``still_serving()`` turns false first."""
    delay = settings.register_backoff_s
    while still_serving():
        try:
            await register_once(settings)
        except RegistrationFailed as e:
            if e.absent:
                log.info("kubelet not reachable, registering again in %.1f s: %s", delay, e)
            else:
                log.error("kubelet refused registration, trying again in %.1f s: %s", delay, e)
            await _pause(settings, delay, wake=settings.kubelet_socket_path.exists)
            delay = min(delay * 2, settings.register_backoff_max_s)
            continue
        log.info(
            "registered %s with the kubelet (endpoint %s, API %s)",
            settings.resource_name,
            settings.socket_name,
            API_VERSION,
        )
        return True
    return False
