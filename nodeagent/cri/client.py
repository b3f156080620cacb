"""The CRI runtime over gRPC: :class:`GrpcRuntime`, an async client on the runtime's unix socket.

Every call has a deadline (``timeout_s``; pulls ``pull_timeout_s``; a stop its grace period plus
``timeout_s``). gRPC errors map onto tidelease's: NOT_FOUND -> NotFound; UNAVAILABLE,
DEADLINE_EXCEEDED and CANCELLED (the socket is gone, the runtime does not answer) ->
Unavailable; INVALID_ARGUMENT -> InvalidInput; anything else -> RuntimeFailed.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc
import grpc.aio

from common.errors import InvalidInput, NotFound, Unavailable
from nodeagent.cri import api_pb2 as pb
from nodeagent.cri import api_pb2_grpc as pb_grpc
from nodeagent.cri import parsing
from nodeagent.cri.runtime import (
    ContainerStatus,
    ContainerSummary,
    ImageInfo,
    RuntimeFailed,
    SandboxStatus,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

_UNAVAILABLE = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.CANCELLED,
}


def target(endpoint: str) -> str:
    """A gRPC target for a runtime endpoint: ``unix:///run/x.sock`` or a bare socket path."""
    if endpoint.startswith("unix:"):
        return endpoint
    if endpoint.startswith("/"):
        return f"unix://{endpoint}"
    raise InvalidInput(f"CRI endpoint {endpoint!r}: want unix:///path/to/socket or /path")


def mapped(method: str, error: grpc.aio.AioRpcError) -> Exception:
    code = error.code()
    text = f"CRI {method}: {error.details() or code.name}"
    if code == grpc.StatusCode.NOT_FOUND:
        return NotFound(text)
    if code in _UNAVAILABLE:
        return Unavailable(text)
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return InvalidInput(text)
    return RuntimeFailed(method, code.name, error.details() or "")


class GrpcRuntime:
    """:class:`~nodeagent.cri.runtime.Runtime` over a gRPC channel; close it when done."""

    def __init__(
        self, endpoint: str, *, timeout_s: float = 10.0, pull_timeout_s: float = 600.0
    ) -> None:
        self.endpoint = endpoint
        self.timeout_s, self.pull_timeout_s = timeout_s, pull_timeout_s
        self._channel = grpc.aio.insecure_channel(target(endpoint))
        self._rt = pb_grpc.RuntimeServiceStub(self._channel)  # type: ignore[no-untyped-call]
        self._img = pb_grpc.ImageServiceStub(self._channel)  # type: ignore[no-untyped-call]

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> GrpcRuntime:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _call(
        self, method: str, call: Callable[..., Awaitable[T]], request: Any, deadline_s: float
    ) -> T:
        try:
            return await call(request, timeout=deadline_s)
        except grpc.aio.AioRpcError as e:
            raise mapped(method, e) from e

    # --- version ---
    async def version(self) -> str:
        reply = await self._call(
            "Version", self._rt.Version, pb.VersionRequest(version="v1"), self.timeout_s
        )
        return f"{reply.runtime_name} {reply.runtime_version} ({reply.runtime_api_version})"

    # --- images ---
    async def image_status(self, image: str) -> ImageInfo | None:
        reply = await self._call(
            "ImageStatus",
            self._img.ImageStatus,
            pb.ImageStatusRequest(image=pb.ImageSpec(image=image)),
            self.timeout_s,
        )
        return parsing.image_info(reply.image) if reply.HasField("image") else None

    async def pull_image(self, image: str, sandbox: pb.PodSandboxConfig | None = None) -> str:
        request = pb.PullImageRequest(image=pb.ImageSpec(image=image))
        if sandbox is not None:
            request.sandbox_config.CopyFrom(sandbox)
        reply = await self._call("PullImage", self._img.PullImage, request, self.pull_timeout_s)
        return str(reply.image_ref)

    # --- pod sandboxes ---
    async def run_sandbox(self, config: pb.PodSandboxConfig) -> str:
        reply = await self._call(
            "RunPodSandbox",
            self._rt.RunPodSandbox,
            pb.RunPodSandboxRequest(config=config),
            self.pull_timeout_s,  # may pull the pause image
        )
        return str(reply.pod_sandbox_id)

    async def stop_sandbox(self, sandbox_id: str) -> None:
        await self._call(
            "StopPodSandbox",
            self._rt.StopPodSandbox,
            pb.StopPodSandboxRequest(pod_sandbox_id=sandbox_id),
            self.timeout_s,
        )

    async def remove_sandbox(self, sandbox_id: str) -> None:
        await self._call(
            "RemovePodSandbox",
            self._rt.RemovePodSandbox,
            pb.RemovePodSandboxRequest(pod_sandbox_id=sandbox_id),
            self.timeout_s,
        )

    async def sandbox_status(self, sandbox_id: str) -> SandboxStatus:
        reply = await self._call(
            "PodSandboxStatus",
            self._rt.PodSandboxStatus,
            pb.PodSandboxStatusRequest(pod_sandbox_id=sandbox_id, verbose=True),
            self.timeout_s,
        )
        return parsing.sandbox_status(reply)

    # --- containers ---
    async def create_container(
        self, sandbox_id: str, config: pb.ContainerConfig, sandbox: pb.PodSandboxConfig
    ) -> str:
        reply = await self._call(
            "CreateContainer",
            self._rt.CreateContainer,
            pb.CreateContainerRequest(
                pod_sandbox_id=sandbox_id, config=config, sandbox_config=sandbox
            ),
            self.timeout_s,
        )
        return str(reply.container_id)

    async def start_container(self, container_id: str) -> None:
        await self._call(
            "StartContainer",
            self._rt.StartContainer,
            pb.StartContainerRequest(container_id=container_id),
            self.timeout_s,
        )

    async def stop_container(self, container_id: str, timeout_s: int) -> None:
        await self._call(
            "StopContainer",
            self._rt.StopContainer,
            pb.StopContainerRequest(container_id=container_id, timeout=timeout_s),
            timeout_s + self.timeout_s,
        )

    async def remove_container(self, container_id: str) -> None:
        await self._call(
            "RemoveContainer",
            self._rt.RemoveContainer,
            pb.RemoveContainerRequest(container_id=container_id),
            self.timeout_s,
        )

    async def list_containers(self, sandbox_id: str = "") -> tuple[ContainerSummary, ...]:
        reply = await self._call(
            "ListContainers",
            self._rt.ListContainers,
            pb.ListContainersRequest(filter=pb.ContainerFilter(pod_sandbox_id=sandbox_id)),
            self.timeout_s,
        )
        return tuple(parsing.container_summary(c) for c in reply.containers)

    async def container_status(self, container_id: str) -> ContainerStatus:
        reply = await self._call(
            "ContainerStatus",
            self._rt.ContainerStatus,
            pb.ContainerStatusRequest(container_id=container_id, verbose=True),
            self.timeout_s,
        )
        return parsing.container_status(reply)
