"""The device plugin against a fake kubelet speaking deviceplugin v1beta1 over unix sockets.

The fake kubelet serves Registration on ``kubelet.sock`` in a temporary device-plugin dir and,
like the real one, dials the plugin back after Register: GetDevicePluginOptions, then a
ListAndWatch stream it keeps reading. Waits poll a condition with a deadline; no fixed sleeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest

from common import contract
from common.errors import Unavailable
from nodeagent.deviceplugin import api_pb2 as pb
from nodeagent.deviceplugin import api_pb2_grpc
from nodeagent.deviceplugin.devices import InMemoryDeviceSource
from nodeagent.deviceplugin.plugin import run_device_plugin
from nodeagent.deviceplugin.settings import DevicePluginSettings
from nodeagent.deviceplugin.testing import (
    NODE,
    InMemoryPodLookup,
    gpus,
    placed_pod,
    uuids,
)

TIMEOUT_S = 10.0


async def eventually(condition: Callable[[], bool], what: str, within: float = TIMEOUT_S) -> None:
    """Poll ``condition`` until true; fail naming ``what`` after ``within`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not condition():
        if loop.time() > deadline:
            pytest.fail(f"timed out after {within} s waiting for {what}")
        await asyncio.sleep(0.01)


@dataclass
class FakeKubelet:
    """Registration server plus the kubelet's side of each registered plugin's connection."""

    plugin_dir: Path
    registrations: list[pb.RegisterRequest] = field(default_factory=list)
    options: list[pb.DevicePluginOptions] = field(default_factory=list)
    updates: list[list[tuple[str, str]]] = field(default_factory=list)  # per ListAndWatch message
    stub: Any = None  # DevicePluginStub of the latest registered plugin
    _channels: list[grpc.aio.Channel] = field(default_factory=list)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    refuse: bool = False
    refused: int = 0

    async def Register(self, request: pb.RegisterRequest, context: Any) -> pb.Empty:
        if self.refuse:
            self.refused += 1
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "resource already registered")
        self.registrations.append(request)
        # The real kubelet dials back asynchronously once Register has answered.
        self._tasks.append(asyncio.create_task(self._connect(request.endpoint)))
        return pb.Empty()

    async def _connect(self, endpoint: str) -> None:
        channel = grpc.aio.insecure_channel(f"unix://{self.plugin_dir / endpoint}")
        self._channels.append(channel)
        stub = api_pb2_grpc.DevicePluginStub(channel)  # type: ignore[no-untyped-call]
        self.options.append(await stub.GetDevicePluginOptions(pb.Empty(), timeout=TIMEOUT_S))
        self.stub = stub
        with contextlib.suppress(grpc.aio.AioRpcError):
            async for response in stub.ListAndWatch(pb.Empty()):
                self.updates.append([(d.ID, d.health) for d in response.devices])

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for channel in self._channels:
            await channel.close()


@contextlib.asynccontextmanager
async def fake_kubelet(plugin_dir: Path) -> AsyncIterator[FakeKubelet]:
    kubelet = FakeKubelet(plugin_dir)
    server = grpc.aio.server()
    api_pb2_grpc.add_RegistrationServicer_to_server(kubelet, server)  # type: ignore[no-untyped-call]
    server.add_insecure_port(f"unix://{plugin_dir / 'kubelet.sock'}")
    await server.start()
    try:
        yield kubelet
    finally:
        await kubelet.close()
        await server.stop(None)


@pytest.fixture
def plugin_dir() -> Iterator[Path]:
    # Short: a unix socket path must fit in 108 bytes, pytest's tmp_path may not.
    path = Path(tempfile.mkdtemp(prefix="tl-dp-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def settings_for(plugin_dir: Path, **overrides: Any) -> DevicePluginSettings:
    values: dict[str, Any] = {
        "node_name": NODE,
        "plugin_dir": plugin_dir,
        "control_devices": ("/dev/nvidiactl", "/dev/nvidia-uvm"),
        "api_timeout_s": 1.0,
        "register_backoff_s": 0.05,
        "register_backoff_max_s": 0.2,
        "socket_poll_s": 0.05,
        "stop_grace_s": 0.5,
    }
    values.update(overrides)
    return DevicePluginSettings(**values)


@dataclass
class Running:
    kubelet: FakeKubelet
    source: InMemoryDeviceSource
    lookup: InMemoryPodLookup
    settings: DevicePluginSettings
    task: asyncio.Task[None]


@contextlib.asynccontextmanager
async def running_plugin(
    plugin_dir: Path, lookup: InMemoryPodLookup | None = None, **overrides: Any
) -> AsyncIterator[Running]:
    source = InMemoryDeviceSource(gpus(4))
    lookup = lookup or InMemoryPodLookup()
    settings = settings_for(plugin_dir, **overrides)
    async with fake_kubelet(plugin_dir) as kubelet:
        ready = asyncio.Event()
        task = asyncio.create_task(
            run_device_plugin(source=source, lookup=lookup, settings=settings, ready=ready)
        )
        try:
            await asyncio.wait_for(ready.wait(), TIMEOUT_S)
            await eventually(lambda: bool(kubelet.updates), "the first ListAndWatch message")
            yield Running(kubelet, source, lookup, settings, task)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def test_registers_with_version_resource_and_options(plugin_dir: Path) -> None:
    async with running_plugin(plugin_dir) as r:
        [request] = r.kubelet.registrations
        assert request.version == "v1beta1"
        assert request.endpoint == "tidelease-gpu.sock"
        assert request.resource_name == contract.DEFAULT_GPU_RESOURCE
        assert request.options.get_preferred_allocation_available
        assert not request.options.pre_start_required
        [options] = r.kubelet.options
        assert options.get_preferred_allocation_available
        assert (plugin_dir / "tidelease-gpu.sock").is_socket()
    assert not (plugin_dir / "tidelease-gpu.sock").exists(), "socket left behind"


async def test_list_and_watch_sends_devices_then_health_changes(plugin_dir: Path) -> None:
    async with running_plugin(plugin_dir) as r:
        ids = uuids(0, 1, 2, 3)
        assert r.kubelet.updates[0] == [(u, "Healthy") for u in ids]
        r.source.set_health(ids[2], False)
        await eventually(lambda: len(r.kubelet.updates) >= 2, "the health update")
        assert r.kubelet.updates[1] == [
            (ids[0], "Healthy"),
            (ids[1], "Healthy"),
            (ids[2], "Unhealthy"),
            (ids[3], "Healthy"),
        ]
        r.source.set(gpus(2))  # two GPUs gone
        await eventually(lambda: len(r.kubelet.updates) >= 3, "the shrunk list")
        assert r.kubelet.updates[2] == [(ids[0], "Healthy"), (ids[1], "Healthy")]


async def test_preferred_allocation_and_allocate_follow_the_extender(plugin_dir: Path) -> None:
    chosen = uuids(3, 1)
    lookup = InMemoryPodLookup.bound(
        [
            placed_pod("train-0", chosen, uid="uid-train-0"),
            placed_pod("other-node", uuids(0, 2), node="node-b"),
        ]
    )
    async with running_plugin(plugin_dir, lookup) as r:
        stub = r.kubelet.stub
        preferred = await stub.GetPreferredAllocation(
            pb.PreferredAllocationRequest(
                container_requests=[
                    pb.ContainerPreferredAllocationRequest(
                        available_deviceIDs=uuids(0, 1, 2, 3), allocation_size=2
                    )
                ]
            ),
            timeout=TIMEOUT_S,
        )
        assert list(preferred.container_responses[0].deviceIDs) == list(chosen)

        # The kubelet allocates them (its order may differ) and creates the container.
        response = await stub.Allocate(
            pb.AllocateRequest(
                container_requests=[pb.ContainerAllocateRequest(devices_ids=sorted(chosen))]
            ),
            timeout=TIMEOUT_S,
        )
        [container] = response.container_responses
        assert dict(container.envs) == {"NVIDIA_VISIBLE_DEVICES": ",".join(chosen)}
        assert [(d.container_path, d.host_path, d.permissions) for d in container.devices] == [
            ("/dev/nvidia3", "/dev/nvidia3", "rw"),
            ("/dev/nvidia1", "/dev/nvidia1", "rw"),
            ("/dev/nvidiactl", "/dev/nvidiactl", "rw"),
            ("/dev/nvidia-uvm", "/dev/nvidia-uvm", "rw"),
        ]
        assert dict(container.annotations) == {contract.ANN_DEVICES: ",".join(chosen)}
        assert r.lookup.annotations("default", "train-0")[contract.ANN_DEVICES_ASSIGNED] == "true"
        assert r.lookup.patches == [("default/train-0", "uid-train-0")]

        # Marked: the pod's choice is no longer offered.
        again = await stub.GetPreferredAllocation(
            pb.PreferredAllocationRequest(
                container_requests=[
                    pb.ContainerPreferredAllocationRequest(
                        available_deviceIDs=uuids(0, 2), allocation_size=1
                    )
                ]
            ),
            timeout=TIMEOUT_S,
        )
        assert list(again.container_responses[0].deviceIDs) == [uuids(0)[0]]


async def test_allocate_without_a_recorded_choice_honours_the_kubelet(plugin_dir: Path) -> None:
    lookup = InMemoryPodLookup([placed_pod("plain", None)])
    async with running_plugin(plugin_dir, lookup) as r:
        response = await r.kubelet.stub.Allocate(
            pb.AllocateRequest(
                container_requests=[pb.ContainerAllocateRequest(devices_ids=uuids(2))]
            ),
            timeout=TIMEOUT_S,
        )
        [container] = response.container_responses
        assert dict(container.envs) == {"NVIDIA_VISIBLE_DEVICES": uuids(2)[0]}
        assert r.lookup.patches == []


async def test_allocate_answers_when_the_api_server_hangs_or_fails(plugin_dir: Path) -> None:
    lookup = InMemoryPodLookup.bound([placed_pod("train-0", uuids(1))])
    async with running_plugin(plugin_dir, lookup, api_timeout_s=0.2) as r:
        lookup.delay_s = 60.0  # far beyond api_timeout_s: the plugin must not wait for it
        request = pb.AllocateRequest(
            container_requests=[pb.ContainerAllocateRequest(devices_ids=uuids(1))]
        )
        response = await r.kubelet.stub.Allocate(request, timeout=TIMEOUT_S)
        assert dict(response.container_responses[0].envs) == {"NVIDIA_VISIBLE_DEVICES": uuids(1)[0]}
        lookup.delay_s = 0.0
        lookup.fail_with = Unavailable("apiserver down")
        response = await r.kubelet.stub.Allocate(request, timeout=TIMEOUT_S)
        assert dict(response.container_responses[0].envs) == {"NVIDIA_VISIBLE_DEVICES": uuids(1)[0]}
        assert lookup.patches == []


async def test_allocate_refuses_devices_the_ledger_gives_another_pod(plugin_dir: Path) -> None:
    """A tenant rewrote its pending pod's devices annotation to name the devices the ledger gives
    another tenant's pod: the kubelet, steered to them, gets an error naming both pods."""
    victim = placed_pod("train-0", uuids(0, 1), namespace="team-a", created="2025-01-02T00:00:00Z")
    thief = placed_pod("sneaky", uuids(0, 1), namespace="team-b", created="2025-01-01T00:00:00Z")
    lookup = InMemoryPodLookup([victim, thief])
    lookup.record(victim)
    lookup.record(thief, uuids(2, 3))
    async with running_plugin(plugin_dir, lookup) as r:
        stub = r.kubelet.stub
        preferred = await stub.GetPreferredAllocation(
            pb.PreferredAllocationRequest(
                container_requests=[
                    pb.ContainerPreferredAllocationRequest(
                        available_deviceIDs=uuids(0, 1, 2, 3), allocation_size=2
                    )
                ]
            ),
            timeout=TIMEOUT_S,
        )
        assert list(preferred.container_responses[0].deviceIDs) == list(uuids(0, 1))
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Allocate(
                pb.AllocateRequest(
                    container_requests=[pb.ContainerAllocateRequest(devices_ids=uuids(0, 1))]
                ),
                timeout=TIMEOUT_S,
            )
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        details = err.value.details() or ""
        assert f"refused to pod team-b/sneaky on node {NODE}" in details
        assert f"{uuids(0)[0]} is pod team-a/train-0's" in details
        assert r.lookup.patches == []


async def test_allocate_of_an_unknown_device_is_refused(plugin_dir: Path) -> None:
    async with running_plugin(plugin_dir) as r:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await r.kubelet.stub.Allocate(
                pb.AllocateRequest(
                    container_requests=[pb.ContainerAllocateRequest(devices_ids=["GPU-nope"])]
                ),
                timeout=TIMEOUT_S,
            )
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "GPU-nope" in (err.value.details() or "")
        # The plugin is still serving.
        options = await r.kubelet.stub.GetDevicePluginOptions(pb.Empty(), timeout=TIMEOUT_S)
        assert options.get_preferred_allocation_available


async def test_kubelet_restart_removing_the_socket_makes_it_register_again(
    plugin_dir: Path,
) -> None:
    async with running_plugin(plugin_dir) as r:
        socket = plugin_dir / "tidelease-gpu.sock"
        socket.unlink()  # what a starting kubelet does to every socket in its dir
        await eventually(lambda: len(r.kubelet.registrations) >= 2, "the second registration")
        assert socket.is_socket()
        # The new server streams the devices to the new connection.
        await eventually(lambda: len(r.kubelet.options) >= 2, "the kubelet dialling back")
        seen = len(r.kubelet.updates)
        r.source.set_health(uuids(0)[0], False)
        await eventually(lambda: len(r.kubelet.updates) > seen, "an update on the new stream")
        assert (uuids(0)[0], "Unhealthy") in r.kubelet.updates[-1]


async def test_registration_waits_for_the_kubelet_socket(plugin_dir: Path) -> None:
    source = InMemoryDeviceSource(gpus(1))
    ready = asyncio.Event()
    task = asyncio.create_task(
        run_device_plugin(
            source=source,
            lookup=InMemoryPodLookup(),
            settings=settings_for(plugin_dir),
            ready=ready,
        )
    )
    try:
        await eventually(
            lambda: (plugin_dir / "tidelease-gpu.sock").exists(), "the plugin's socket"
        )
        assert not ready.is_set()
        async with fake_kubelet(plugin_dir) as kubelet:
            await asyncio.wait_for(ready.wait(), TIMEOUT_S)
            assert len(kubelet.registrations) == 1
            await eventually(lambda: bool(kubelet.updates), "ListAndWatch")
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert not (plugin_dir / "tidelease-gpu.sock").exists()


async def test_refused_registration_is_retried(plugin_dir: Path) -> None:
    async with fake_kubelet(plugin_dir) as kubelet:
        kubelet.refuse = True
        ready = asyncio.Event()
        task = asyncio.create_task(
            run_device_plugin(
                source=InMemoryDeviceSource(gpus(1)),
                lookup=InMemoryPodLookup(),
                settings=settings_for(plugin_dir),
                ready=ready,
            )
        )
        try:
            await eventually(lambda: kubelet.refused >= 2, "a retry after a refusal")
            assert not ready.is_set()
            assert not task.done()
            kubelet.refuse = False
            await asyncio.wait_for(ready.wait(), TIMEOUT_S)
            assert len(kubelet.registrations) == 1
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def test_a_socket_dir_it_cannot_use_is_retried_not_fatal(
    plugin_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocked = plugin_dir / "dp"
    blocked.write_text("a file where the dir should be")
    ready = asyncio.Event()
    task = asyncio.create_task(
        run_device_plugin(
            source=InMemoryDeviceSource(gpus(1)),
            lookup=InMemoryPodLookup(),
            settings=settings_for(blocked),
            ready=ready,
        )
    )
    try:
        await eventually(lambda: "cannot serve on" in caplog.text, "the bind error logged")
        assert not task.done()
        blocked.unlink()
        blocked.mkdir()
        async with fake_kubelet(blocked) as kubelet:
            await asyncio.wait_for(ready.wait(), TIMEOUT_S)
            assert len(kubelet.registrations) == 1
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
