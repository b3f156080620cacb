"""The device source, the allocator over the fake pod lookup, and the settings."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from common import contract
from common.errors import InvalidInput, Unavailable
from nodeagent.deviceplugin.allocating import Allocator
from nodeagent.deviceplugin.devices import InMemoryDeviceSource
from nodeagent.deviceplugin.matching import NodePod
from nodeagent.deviceplugin.pods import NullPodLookup, PodLookup
from nodeagent.deviceplugin.settings import DevicePluginSettings
from nodeagent.deviceplugin.testing import (
    NODE,
    InMemoryPodLookup,
    gpu,
    gpus,
    lost_gpu,
    placed_pod,
    uuids,
)

U = uuids(0, 1, 2, 3)

# --- the in-memory device source -----------------------------------------------------------------


async def test_source_versions_count_changes() -> None:
    source = InMemoryDeviceSource([gpu(1), gpu(0)])
    assert [d.index for d in source.current()] == [0, 1]
    assert await source.changed(-1) == 0
    assert source.set([gpu(0), gpu(1)]) == 0, "same list, no new version"
    assert source.set_health(U[1], False) == 1
    assert source.current()[1] == lost_gpu(1)
    assert source.set_health("GPU-unknown", False) == 1
    assert source.set([]) == 2
    assert await source.changed(1) == 2


async def test_source_wakes_waiters_on_change() -> None:
    source = InMemoryDeviceSource(gpus(2))
    waiter = asyncio.create_task(source.changed(0))
    await asyncio.sleep(0)
    assert not waiter.done()
    source.set_health(U[0], False)
    assert await asyncio.wait_for(waiter, 5) == 1


# --- the allocator -------------------------------------------------------------------------------

SETTINGS = DevicePluginSettings(node_name=NODE, control_devices=("/dev/nvidiactl",))


def allocator(lookup: PodLookup) -> Allocator:
    return Allocator(source=InMemoryDeviceSource(gpus(4)), lookup=lookup, settings=SETTINGS)


async def test_allocate_marks_the_pod_and_grants_its_devices() -> None:
    lookup = InMemoryPodLookup([placed_pod("a", [U[2], U[0]], uid="uid-a")])
    alloc = allocator(lookup)
    assert await alloc.preferred(list(U), [], 2) == (U[2], U[0])
    grant = await alloc.allocate([U[0], U[2]])
    assert grant.envs == {"NVIDIA_VISIBLE_DEVICES": f"{U[2]},{U[0]}"}
    assert [d.host_path for d in grant.devices] == [
        "/dev/nvidia2",
        "/dev/nvidia0",
        "/dev/nvidiactl",
    ]
    assert lookup.annotations("default", "a")[contract.ANN_DEVICES_ASSIGNED] == "true"
    assert lookup.patches == [("default/a", "uid-a")]


async def test_two_containers_with_the_same_count_get_their_own_pods() -> None:
    lookup = InMemoryPodLookup(
        [
            placed_pod("old", [U[1]], created="2025-01-01T00:00:00Z"),
            placed_pod("new", [U[3]], created="2025-01-02T00:00:00Z"),
        ]
    )
    alloc = allocator(lookup)
    assert await alloc.preferred(list(U), [], 1) == (U[1],)
    await alloc.allocate([U[1]])
    assert await alloc.preferred([U[0], U[2], U[3]], [], 1) == (U[3],)
    await alloc.allocate([U[3]])
    assert [key for key, _ in lookup.patches] == ["default/old", "default/new"]


async def test_a_recreated_pod_is_not_marked_but_the_container_starts(
    caplog: pytest.LogCaptureFixture,
) -> None:
    lookup = InMemoryPodLookup([placed_pod("a", [U[1]], uid="uid-old")])

    class Recreating:
        """The pod is deleted and re-created between the list and the patch."""

        async def pods_on_node(self, node: str) -> tuple[NodePod, ...]:
            pods = await lookup.pods_on_node(node)
            lookup.put(placed_pod("a", [U[1]], uid="uid-new"))
            return pods

        async def mark_assigned(self, pod: NodePod) -> None:
            await lookup.mark_assigned(pod)

    grant = await allocator(Recreating()).allocate([U[1]])
    assert grant.envs == {"NVIDIA_VISIBLE_DEVICES": U[1]}
    assert lookup.patches == []
    assert "re-created" in caplog.text


async def test_api_failure_falls_back_to_the_kubelets_pick(
    caplog: pytest.LogCaptureFixture,
) -> None:
    lookup = InMemoryPodLookup([placed_pod("a", [U[1]])])
    lookup.fail_with = Unavailable("connection refused")
    alloc = allocator(lookup)
    with caplog.at_level(logging.WARNING):
        assert await alloc.preferred(list(U), [], 1) == (U[0],)
        grant = await alloc.allocate([U[3]])
    assert grant.envs == {"NVIDIA_VISIBLE_DEVICES": U[3]}
    assert "connection refused" in caplog.text
    assert f"allocating devices {U[3]} as the kubelet chose them" in caplog.text


async def test_without_an_api_server_the_kubelet_decides() -> None:
    grant = await allocator(NullPodLookup()).allocate([U[3], U[1]])
    assert grant.envs == {"NVIDIA_VISIBLE_DEVICES": f"{U[3]},{U[1]}"}


async def test_unknown_device_is_refused_and_no_pod_is_marked() -> None:
    lookup = InMemoryPodLookup([placed_pod("a", ["GPU-gone"])])
    with pytest.raises(InvalidInput, match="GPU-gone"):
        await allocator(lookup).allocate(["GPU-gone"])
    assert lookup.patches == []


# --- settings ------------------------------------------------------------------------------------


def test_default_settings_need_only_the_node_name() -> None:
    assert DevicePluginSettings(node_name="n").validate() == []
    assert DevicePluginSettings().validate() == [
        "node_name is required (the node this agent runs on)"
    ]
    s = DevicePluginSettings(node_name="n")
    assert s.socket_path == Path("/var/lib/kubelet/device-plugins/tidelease-gpu.sock")
    assert s.kubelet_socket_path == Path("/var/lib/kubelet/device-plugins/kubelet.sock")
    assert s.resource_name == "nvidia.com/gpu"


def test_settings_report_every_problem_at_once() -> None:
    bad = DevicePluginSettings(
        node_name="",
        plugin_dir=Path("relative") / ("x" * 120),
        socket_name="a/b",
        kubelet_socket_name="kubelet.sock",
        resource_name="gpu",
        control_devices=("/tmp/x",),
        device_permissions="rwx",
        host_device_root="fakedev",
        api_timeout_s=0,
        socket_poll_s=-1,
        stop_grace_s=-1,
    )
    problems = bad.validate()
    for needle in (
        "node_name",
        "plugin_dir",
        "socket_name",
        "longer than a unix socket",
        "resource_name",
        "control device",
        "device_permissions",
        "host_device_root",
        "api_timeout_s",
        "socket_poll_s",
        "stop_grace_s",
    ):
        assert any(needle in p for p in problems), (needle, problems)
