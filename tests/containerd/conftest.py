"""A real containerd (hack/containerd.sh) once per session, for the CRI tests (marker:
containerd), and helpers to run pod sandboxes and the test app in it.

containerd runs in a temporary directory with its CRI socket, its own bridge and subnet, and the
images of hack/images.py (pause, app:v1, app:v2: busybox httpd on :8080 answering /version);
the session ends it with SIGTERM, and the script also stops when this process dies. Every
sandbox a test runs is stopped and removed in ``finally``.
"""

from __future__ import annotations

import asyncio
import os
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import pytest

from common.errors import TideleaseError
from nodeagent.cri import api_pb2 as pb
from nodeagent.cri.client import GrpcRuntime
from nodeagent.cri.runtime import Runtime
from tests.background import running

ROOT = Path(__file__).resolve().parents[2]
APP_V1 = "docker.io/local/app:v1"
APP_V2 = "docker.io/local/app:v2"
ABSENT = "docker.io/local/absent:v1"


@dataclass(frozen=True)
class Containerd:
    sock: str
    cgroup: str
    subnet: str
    pid: int
    log: Path


def start_containerd(base: Path, name: str) -> Iterator[Containerd]:
    """hack/containerd.sh in ``base/name`` until the generator is closed."""
    state_dir = base / name
    env = {**os.environ, "TL_CTRD_PARENT_PID": str(os.getpid())}
    with running(
        [str(ROOT / "hack" / "containerd.sh"), "-D", str(state_dir)],
        state=state_dir / "containerd.env",
        log=base / f"{name}.log",
        what="hack/containerd.sh",
        start_timeout_s=120,
        stop_timeout_s=60,
        env=env,
    ) as facts:
        yield Containerd(
            sock=facts["TL_CTRD_SOCK"],
            cgroup=facts["TL_CTRD_CGROUP"],
            subnet=facts["TL_CTRD_SUBNET"],
            pid=int(facts["TL_CTRD_PID"]),
            log=Path(facts["TL_CTRD_LOG"]),
        )


@pytest.fixture(scope="session")
def containerd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Containerd]:
    yield from start_containerd(tmp_path_factory.mktemp("ctrd"), "containerd")


@pytest.fixture
async def runtime(containerd: Containerd) -> AsyncIterator[GrpcRuntime]:
    async with GrpcRuntime(containerd.sock, timeout_s=10, pull_timeout_s=20) as rt:
        yield rt


def sandbox_config(ctrd: Containerd, name: str, logs: Path) -> pb.PodSandboxConfig:
    return pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(name=name, uid=f"uid-{name}", namespace="tests"),
        hostname=name,
        log_directory=str(logs),
        labels={"tidelease.io/test": name},
        linux=pb.LinuxPodSandboxConfig(cgroup_parent=f"{ctrd.cgroup}/{name}"),
    )


def app_config(image: str, data: Path, attempt: int = 0) -> pb.ContainerConfig:
    """The app, with a host-path volume served by its httpd under /data/."""
    return pb.ContainerConfig(
        metadata=pb.ContainerMetadata(name="app", attempt=attempt),
        image=pb.ImageSpec(image=image),
        envs=[pb.KeyValue(key="ROLE", value="worker")],
        mounts=[pb.Mount(container_path="/www/data", host_path=str(data))],
        labels={"app": "trainer"},
        annotations={"tidelease.io/owner": "job-a"},
        log_path=f"app_{attempt}.log",
    )


@dataclass(frozen=True)
class Pod:
    sandbox_id: str
    config: pb.PodSandboxConfig
    data: Path  # host path mounted at /www/data
    app_id: str


@asynccontextmanager
async def pod(
    runtime: Runtime, ctrd: Containerd, tmp: Path, name: str, image: str = APP_V1
) -> AsyncIterator[Pod]:
    """A sandbox running the app; stopped and removed on exit, whatever happened."""
    logs, data = tmp / f"{name}-logs", tmp / f"{name}-data"
    logs.mkdir()
    data.mkdir()
    config = sandbox_config(ctrd, name, logs)
    sandbox_id = await runtime.run_sandbox(config)
    try:
        app = await runtime.create_container(sandbox_id, app_config(image, data), config)
        await runtime.start_container(app)
        yield Pod(sandbox_id, config, data, app)
    finally:
        await remove_sandbox(runtime, sandbox_id)


async def remove_sandbox(runtime: Runtime, sandbox_id: str) -> None:
    with suppress(TideleaseError):
        await runtime.stop_sandbox(sandbox_id)
    with suppress(TideleaseError):
        await runtime.remove_sandbox(sandbox_id)


def _get(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=1) as reply:
            return str(reply.read().decode().strip())
    except (urllib.error.URLError, OSError):
        return None


async def http_get(url: str, *, within_s: float = 10.0) -> str:
    """The body at ``url`` once it answers; fails the test after ``within_s``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while True:
        body = await asyncio.to_thread(_get, url)
        if body is not None:
            return body
        if loop.time() > deadline:
            raise AssertionError(f"{url} did not answer within {within_s} s")
        await asyncio.sleep(0.05)
