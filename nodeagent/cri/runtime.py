"""What tidelease asks of a node's container runtime, as a protocol, and the facts it gets back.

The protocol speaks CRI (runtime.v1) messages where they go to the runtime unchanged (sandbox and
container configurations) and frozen dataclasses for what comes back, parsed once at the
boundary. Errors: :class:`~common.errors.NotFound` for an unknown sandbox, container or image;
:class:`~common.errors.Unavailable` when the runtime cannot be reached or does not answer in
time (its socket gone, containerd stopped); :class:`RuntimeFailed` for a call the runtime
answered with an error (a pull that failed, a container that would not start).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Protocol

from common.errors import TideleaseError
from nodeagent.cri import api_pb2 as pb


class RuntimeFailed(TideleaseError):
    """The runtime answered a call with an error (gRPC code ``code``)."""

    def __init__(self, method: str, code: str, message: str) -> None:
        self.method, self.code, self.message = method, code, message
        super().__init__(f"CRI {method}: {code}: {message}")


class ContainerState(enum.Enum):
    CREATED = "Created"
    RUNNING = "Running"
    EXITED = "Exited"
    UNKNOWN = "Unknown"


@dataclass(frozen=True, slots=True)
class SandboxStatus:
    id: str
    ready: bool
    ip: str
    name: str
    namespace: str
    uid: str
    pid: int | None  # the pause process (verbose info), when the runtime tells
    netns: str  # network namespace path (verbose info), "" when not told
    # The configuration the sandbox was created with (verbose info), or None when the runtime
    # does not tell: CreateContainer needs it again. Read-only: copy before changing.
    config: pb.PodSandboxConfig | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class ContainerSummary:
    id: str
    sandbox_id: str
    name: str
    attempt: int
    state: ContainerState
    image: str


@dataclass(frozen=True, slots=True)
class ContainerStatus:
    id: str
    name: str
    attempt: int
    state: ContainerState
    image: str
    image_ref: str
    exit_code: int
    reason: str
    sandbox_id: str  # from verbose info; "" when not told
    pid: int | None
    # The configuration the container was created with (verbose info) and the top-level keys of
    # it this client's CRI subset does not know, which a re-creation would drop.
    config: pb.ContainerConfig | None = field(default=None, compare=False)
    unknown_config_keys: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ImageInfo:
    id: str
    tags: tuple[str, ...]
    size: int


class Runtime(Protocol):
    """A node's CRI runtime. Every call is bounded in time by the implementation."""

    async def version(self) -> str: ...

    # --- images ---
    async def image_status(self, image: str) -> ImageInfo | None: ...

    async def pull_image(self, image: str, sandbox: pb.PodSandboxConfig | None = None) -> str: ...

    # --- pod sandboxes ---
    async def run_sandbox(self, config: pb.PodSandboxConfig) -> str: ...

    async def stop_sandbox(self, sandbox_id: str) -> None: ...

    async def remove_sandbox(self, sandbox_id: str) -> None: ...

    async def sandbox_status(self, sandbox_id: str) -> SandboxStatus: ...

    # --- containers ---
    async def create_container(
        self, sandbox_id: str, config: pb.ContainerConfig, sandbox: pb.PodSandboxConfig
    ) -> str: ...

    async def start_container(self, container_id: str) -> None: ...

    async def stop_container(self, container_id: str, timeout_s: int) -> None: ...

    async def remove_container(self, container_id: str) -> None: ...

    async def list_containers(self, sandbox_id: str = "") -> tuple[ContainerSummary, ...]: ...

    async def container_status(self, container_id: str) -> ContainerStatus: ...
