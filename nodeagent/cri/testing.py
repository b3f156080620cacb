"""A faithful in-memory CRI runtime for tests: :class:`FakeRuntime`.

It keeps images, sandboxes and containers as containerd does (a container's (name, attempt) is
unique in its sandbox; a stopped container cannot be started again; removing a sandbox removes
its containers), answers with the same errors (NotFound, RuntimeFailed), and can be told to fail:
``unpullable`` images fail to pull, containers of ``unstartable`` images fail to start,
``break_at`` makes the runtime unreachable (Unavailable for
every call) from a given call on, as when its socket goes away mid-way. No I/O, no sleeps.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import TypeVar

from google.protobuf.message import Message

from common.errors import NotFound, Unavailable
from nodeagent.cri import api_pb2 as pb
from nodeagent.cri.runtime import (
    ContainerState,
    ContainerStatus,
    ContainerSummary,
    ImageInfo,
    RuntimeFailed,
    SandboxStatus,
)

M = TypeVar("M", bound=Message)


@dataclass
class _Sandbox:
    id: str
    config: pb.PodSandboxConfig
    ip: str
    pid: int
    ready: bool = True


@dataclass
class _Container:
    id: str
    sandbox_id: str
    config: pb.ContainerConfig
    state: ContainerState = ContainerState.CREATED
    pid: int | None = None
    exit_code: int = 0


@dataclass
class FakeRuntime:
    images: set[str] = field(default_factory=lambda: {"docker.io/local/pause:v1"})
    unpullable: set[str] = field(default_factory=set)
    pullable: set[str] = field(default_factory=set)  # images a pull adds
    unstartable: set[str] = field(default_factory=set)  # images whose containers fail to start
    # Unreachable from the n-th call of this method on, e.g. ("RemoveContainer", 1).
    break_at: tuple[str, int] | None = None
    calls: list[str] = field(default_factory=list)
    sandboxes: dict[str, _Sandbox] = field(default_factory=dict)
    containers: dict[str, _Container] = field(default_factory=dict)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _broken: bool = False

    def _enter(self, method: str) -> None:
        self.calls.append(method)
        if self.break_at is not None and not self._broken:
            name, nth = self.break_at
            if name == method and self.calls.count(method) >= nth:
                self._broken = True
        if self._broken:
            raise Unavailable(f"CRI {method}: connection refused (fake runtime gone)")

    def _next(self, prefix: str) -> str:
        return f"{prefix}{next(self._ids):04d}"

    def _container(self, container_id: str) -> _Container:
        try:
            return self.containers[container_id]
        except KeyError:
            raise NotFound(f"CRI: container {container_id!r} not found") from None

    def _sandbox(self, sandbox_id: str) -> _Sandbox:
        try:
            return self.sandboxes[sandbox_id]
        except KeyError:
            raise NotFound(f"CRI: sandbox {sandbox_id!r} not found") from None

    def running(self, sandbox_id: str, name: str) -> list[_Container]:
        """Containers named ``name`` running in the sandbox (a test's check)."""
        return [
            c
            for c in self.containers.values()
            if c.sandbox_id == sandbox_id
            and c.config.metadata.name == name
            and c.state is ContainerState.RUNNING
        ]

    async def version(self) -> str:
        self._enter("Version")
        return "fake 0.0 (v1)"

    async def image_status(self, image: str) -> ImageInfo | None:
        self._enter("ImageStatus")
        return ImageInfo(f"sha256:{image}", (image,), 1) if image in self.images else None

    async def pull_image(self, image: str, sandbox: pb.PodSandboxConfig | None = None) -> str:
        self._enter("PullImage")
        if image in self.unpullable or (image not in self.pullable and image not in self.images):
            raise RuntimeFailed("PullImage", "UNKNOWN", f"failed to resolve reference {image}")
        self.images.add(image)
        return f"sha256:{image}"

    async def run_sandbox(self, config: pb.PodSandboxConfig) -> str:
        self._enter("RunPodSandbox")
        sid = self._next("sb")
        n = len(self.sandboxes) + 2
        self.sandboxes[sid] = _Sandbox(sid, _copy(config), f"10.0.0.{n}", 1000 + n)
        return sid

    async def stop_sandbox(self, sandbox_id: str) -> None:
        self._enter("StopPodSandbox")
        sb = self.sandboxes.get(sandbox_id)
        if sb is None:
            return
        sb.ready = False
        for c in self.containers.values():
            if c.sandbox_id == sandbox_id and c.state is ContainerState.RUNNING:
                c.state, c.exit_code, c.pid = ContainerState.EXITED, 137, None

    async def remove_sandbox(self, sandbox_id: str) -> None:
        self._enter("RemovePodSandbox")
        self.sandboxes.pop(sandbox_id, None)
        for cid in [c.id for c in self.containers.values() if c.sandbox_id == sandbox_id]:
            del self.containers[cid]

    async def sandbox_status(self, sandbox_id: str) -> SandboxStatus:
        self._enter("PodSandboxStatus")
        sb = self._sandbox(sandbox_id)
        meta = sb.config.metadata
        return SandboxStatus(
            id=sb.id,
            ready=sb.ready,
            ip=sb.ip,
            name=meta.name,
            namespace=meta.namespace,
            uid=meta.uid,
            pid=sb.pid,
            netns=f"/var/run/netns/cni-{sb.id}",
            config=_copy(sb.config),
        )

    async def create_container(
        self, sandbox_id: str, config: pb.ContainerConfig, sandbox: pb.PodSandboxConfig
    ) -> str:
        self._enter("CreateContainer")
        self._sandbox(sandbox_id)
        if config.image.image not in self.images:
            raise RuntimeFailed("CreateContainer", "UNKNOWN", f"image {config.image.image} absent")
        key = (config.metadata.name, config.metadata.attempt)
        for c in self.containers.values():
            if (
                c.sandbox_id == sandbox_id
                and (
                    c.config.metadata.name,
                    c.config.metadata.attempt,
                )
                == key
            ):
                raise RuntimeFailed("CreateContainer", "UNKNOWN", f"name {key} is reserved")
        cid = self._next("c")
        self.containers[cid] = _Container(cid, sandbox_id, _copy(config))
        return cid

    async def start_container(self, container_id: str) -> None:
        self._enter("StartContainer")
        c = self._container(container_id)
        if c.config.image.image in self.unstartable:
            raise RuntimeFailed("StartContainer", "UNKNOWN", "exec: no such file or directory")
        if c.state is not ContainerState.CREATED:
            raise RuntimeFailed(
                "StartContainer", "UNKNOWN", f"container is in {c.state.name} state"
            )
        c.state, c.pid = ContainerState.RUNNING, 5000 + len(self.calls)

    async def stop_container(self, container_id: str, timeout_s: int) -> None:
        self._enter("StopContainer")
        c = self._container(container_id)
        if c.state is ContainerState.RUNNING:
            c.state, c.exit_code, c.pid = ContainerState.EXITED, 0, None

    async def remove_container(self, container_id: str) -> None:
        self._enter("RemoveContainer")
        self.containers.pop(container_id, None)

    async def list_containers(self, sandbox_id: str = "") -> tuple[ContainerSummary, ...]:
        self._enter("ListContainers")
        return tuple(
            ContainerSummary(
                id=c.id,
                sandbox_id=c.sandbox_id,
                name=c.config.metadata.name,
                attempt=c.config.metadata.attempt,
                state=c.state,
                image=c.config.image.image,
            )
            for c in self.containers.values()
            if not sandbox_id or c.sandbox_id == sandbox_id
        )

    async def container_status(self, container_id: str) -> ContainerStatus:
        self._enter("ContainerStatus")
        c = self._container(container_id)
        return ContainerStatus(
            id=c.id,
            name=c.config.metadata.name,
            attempt=c.config.metadata.attempt,
            state=c.state,
            image=c.config.image.image,
            image_ref=f"sha256:{c.config.image.image}",
            exit_code=c.exit_code,
            reason="Completed" if c.state is ContainerState.EXITED else "",
            sandbox_id=c.sandbox_id,
            pid=c.pid,
            config=_copy(c.config),
        )


def _copy(message: M) -> M:
    out: M = type(message)()
    out.CopyFrom(message)
    return out
