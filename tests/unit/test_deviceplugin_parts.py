"""The device source, the allocator over the fake pod lookup (and its ledger), and the settings."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
from pathlib import Path

import pytest

from common import contract
from common.errors import InvalidInput, Unavailable
from nodeagent.agent import AgentSettings, run_agent
from nodeagent.deviceplugin.allocating import Allocator, DevicesRefused
from nodeagent.deviceplugin.confirming import NodeLedger
from nodeagent.deviceplugin.devices import InMemoryDeviceSource
from nodeagent.deviceplugin.matching import NodePod
from nodeagent.deviceplugin.pods import NullPodLookup, PodLookup
from nodeagent.deviceplugin.settings import DevicePluginSettings
from nodeagent.deviceplugin.testing import (
    NODE,
    InMemoryPodLookup,
    ManualTime,
    gpu,
    gpus,
    lost_gpu,
    placed_pod,
    uuids,
)
from nodeagent.nvml import NvmlReader
from nodeagent.nvmlfake import FakeNvml, layout
from nodeagent.publishing import MemoryPublisher

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


def allocator(lookup: PodLookup, time: ManualTime | None = None) -> Allocator:
    time = time or ManualTime()
    return Allocator(
        source=InMemoryDeviceSource(gpus(4)),
        lookup=lookup,
        settings=SETTINGS,
        clock=time.clock,
        sleep=time.sleep,
    )


async def test_allocate_marks_the_pod_and_grants_its_devices() -> None:
    lookup = InMemoryPodLookup.bound([placed_pod("a", [U[2], U[0]], uid="uid-a")])
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
    lookup = InMemoryPodLookup.bound(
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
    lookup = InMemoryPodLookup.bound([placed_pod("a", [U[1]], uid="uid-old")])

    class Recreating:
        """The pod is deleted and re-created between the list and the patch."""

        async def pods_on_node(self, node: str) -> tuple[NodePod, ...]:
            pods = await lookup.pods_on_node(node)
            lookup.put(placed_pod("a", [U[1]], uid="uid-new"))
            return pods

        async def ledger(self, node: str) -> NodeLedger:
            return await lookup.ledger(node)

        async def mark_assigned(self, pod: NodePod) -> None:
            await lookup.mark_assigned(pod)

    grant = await allocator(Recreating()).allocate([U[1]])
    assert grant.envs == {"NVIDIA_VISIBLE_DEVICES": U[1]}
    assert lookup.patches == []
    assert "re-created" in caplog.text


async def test_api_failure_falls_back_to_the_kubelets_pick(
    caplog: pytest.LogCaptureFixture,
) -> None:
    lookup = InMemoryPodLookup.bound([placed_pod("a", [U[1]])])
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
    lookup = InMemoryPodLookup.bound([placed_pod("a", ["GPU-gone"])])
    with pytest.raises(InvalidInput, match="GPU-gone"):
        await allocator(lookup).allocate(["GPU-gone"])
    assert lookup.patches == []


# --- the ledger's confirmation --------------------------------------------------------------------


async def test_a_device_the_ledger_gives_another_pod_is_refused(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A tenant rewrote its pod's annotation to name another tenant's devices: the kubelet is
    steered to them, but Allocate refuses, names the holder, logs it and marks nothing."""
    victim = placed_pod("train-0", [U[0], U[1]], namespace="team-a", created="2025-01-02T00:00:00Z")
    thief = placed_pod("sneaky", [U[0], U[1]], namespace="team-b", created="2025-01-01T00:00:00Z")
    lookup = InMemoryPodLookup([victim, thief])
    lookup.record(victim)
    lookup.record(thief, [U[2], U[3]])  # what the extender chose for it
    alloc = allocator(lookup)
    assert await alloc.preferred(list(U), [], 2) == (U[0], U[1])  # the oldest: the thief
    with pytest.raises(DevicesRefused) as refused:
        await alloc.allocate([U[0], U[1]])
    message = str(refused.value)
    for part in (
        f"refused to pod team-b/sneaky on node {NODE}",
        f"gives it {U[2]},{U[3]}",
        f"{U[0]} is pod team-a/train-0's",
    ):
        assert part in message, message
    assert lookup.patches == []
    assert f"to pod team-b/sneaky on node {NODE} (mismatch)" in caplog.text
    # The kubelet fails the thief's pod; the victim then gets its devices.
    thief["status"]["phase"] = "Failed"
    lookup.put(thief)
    grant = await alloc.allocate([U[1], U[0]])
    assert grant.envs == {"NVIDIA_VISIBLE_DEVICES": f"{U[0]},{U[1]}"}
    assert lookup.patches == [("team-a/train-0", victim["metadata"]["uid"])]


async def test_the_grant_follows_the_ledgers_order() -> None:
    pod = placed_pod("a", [U[2], U[0]])
    lookup = InMemoryPodLookup([pod])
    lookup.record(pod, [U[0], U[2]])
    grant = await allocator(lookup).allocate([U[2], U[0]])
    assert grant.envs == {"NVIDIA_VISIBLE_DEVICES": f"{U[0]},{U[2]}"}


async def test_a_ledger_entry_that_arrives_late_is_waited_for() -> None:
    pod = placed_pod("a", [U[1]], uid="uid-a")
    lookup = InMemoryPodLookup([pod])

    class Lagging:
        """The ledger shows the pod's entry from the third read on."""

        async def pods_on_node(self, node: str) -> tuple[NodePod, ...]:
            return await lookup.pods_on_node(node)

        async def ledger(self, node: str) -> NodeLedger:
            if lookup.ledger_reads == 2:
                lookup.record(pod)
            return await lookup.ledger(node)

        async def mark_assigned(self, pod: NodePod) -> None:
            await lookup.mark_assigned(pod)

    time = ManualTime()
    grant = await allocator(Lagging(), time).allocate([U[1]])
    assert grant.envs == {"NVIDIA_VISIBLE_DEVICES": U[1]}
    assert lookup.ledger_reads == 3
    assert time.slept == [SETTINGS.ledger_poll_s] * 2
    assert lookup.patches == [("default/a", "uid-a")]


@pytest.mark.parametrize(
    ("ledger", "reason", "outcome"),
    [
        pytest.param("none", "the node has no allocation ledger", "no-entry", id="no-ledger"),
        pytest.param("other", "has no entry for its UID", "no-entry", id="no-entry"),
        pytest.param("failing", "could not be read: connection refused", "unreadable", id="down"),
    ],
)
async def test_a_ledger_that_never_confirms_is_waited_for_a_bounded_time_then_refused(
    ledger: str, reason: str, outcome: str, caplog: pytest.LogCaptureFixture
) -> None:
    pod = placed_pod("a", [U[1]])
    lookup = InMemoryPodLookup([pod])
    if ledger == "other":
        lookup.record(placed_pod("b", [U[2]]))

    class FailingLedger:
        async def pods_on_node(self, node: str) -> tuple[NodePod, ...]:
            return await lookup.pods_on_node(node)

        async def ledger(self, node: str) -> NodeLedger:
            lookup.ledger_reads += 1
            raise Unavailable("connection refused")

        async def mark_assigned(self, pod: NodePod) -> None:
            await lookup.mark_assigned(pod)

    time = ManualTime()
    alloc = allocator(FailingLedger() if ledger == "failing" else lookup, time)
    start = time.now
    with pytest.raises(DevicesRefused, match=reason):
        await alloc.allocate([U[1]])
    assert time.now - start <= SETTINGS.api_timeout_s
    assert lookup.ledger_reads == int(SETTINGS.api_timeout_s / SETTINGS.ledger_poll_s) + 1
    assert lookup.patches == []
    assert f"to pod default/a on node {NODE} ({outcome})" in caplog.text


async def test_a_ledger_read_that_hangs_is_bounded_and_refused() -> None:
    lookup = InMemoryPodLookup.bound([placed_pod("a", [U[1]])])
    settings = dataclasses.replace(SETTINGS, api_timeout_s=0.05)
    pods = await lookup.pods_on_node(NODE)
    lookup.delay_s = 60.0  # the pods were listed; every call from now on hangs

    class Listed:
        async def pods_on_node(self, node: str) -> tuple[NodePod, ...]:
            return pods

        async def ledger(self, node: str) -> NodeLedger:
            return await lookup.ledger(node)

        async def mark_assigned(self, pod: NodePod) -> None:
            await lookup.mark_assigned(pod)

    alloc = Allocator(source=InMemoryDeviceSource(gpus(4)), lookup=Listed(), settings=settings)
    with pytest.raises(DevicesRefused, match=re.escape("within 0.05 s")):
        await asyncio.wait_for(alloc.allocate([U[1]]), 10)


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
        ledger_poll_s=float("nan"),
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
        "ledger_poll_s",
        "socket_poll_s",
        "stop_grace_s",
    ):
        assert any(needle in p for p in problems), (needle, problems)


async def test_the_agent_gives_the_plugin_its_topology_for_pods_placed_without_the_extender() -> (
    None
):
    """The agent reads the fake 2-socket layout (GPUs 0-1, 2-3, 4-5, 6-7 behind one PCIe switch
    each) and hands it to the device source, as nodeagent.main wires them: with GPU 0 taken,
    a pod no extender placed gets the pair 2-3, not GPUs 1 and 2."""
    gpus_of = layout("pcie-2socket-8")
    source = InMemoryDeviceSource()
    ready = asyncio.Event()
    task = asyncio.create_task(
        run_agent(
            reader=NvmlReader(FakeNvml(gpus_of)),
            publisher=MemoryPublisher(),
            settings=AgentSettings(node=NODE, cycle_s=0.01, heartbeat_s=60),
            on_change=source.set,
            on_topology=source.set_topology,
            ready=ready,
        )
    )
    try:
        await asyncio.wait_for(ready.wait(), 5)
        uuids_of = [d.uuid for d in source.current()]
        assert len(uuids_of) == 8
        assert source.topology() is not None
        alloc = Allocator(source=source, lookup=InMemoryPodLookup(), settings=SETTINGS)
        assert await alloc.preferred(uuids_of[1:], [], 2) == (uuids_of[2], uuids_of[3])
        bare = Allocator(
            source=InMemoryDeviceSource(source.current()),
            lookup=InMemoryPodLookup(),
            settings=SETTINGS,
        )
        assert await bare.preferred(uuids_of[1:], [], 2) == (uuids_of[1], uuids_of[2])
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
