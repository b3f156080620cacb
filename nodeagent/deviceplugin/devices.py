"""What the device plugin publishes: the node's GPUs and their health, from the rest of the agent.

The agent's NVML inventory and health watcher feed a :class:`DeviceSource`; the plugin reads the
list when ListAndWatch starts and again after every change. :class:`InMemoryDeviceSource` is the
implementation the agent and the tests use: whoever learns of a change calls :meth:`set` or
:meth:`set_health` (from the event loop's thread) and every open ListAndWatch stream sends the new
list. An empty one is the null source: a node without GPUs advertises none and keeps running.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Protocol

from common.model import GpuUuid
from common.topology import NodeTopology


@dataclass(frozen=True, slots=True)
class PluginDevice:
    """One GPU as the kubelet sees it: its id (the UUID) and health, and how a container gets it."""

    uuid: GpuUuid
    index: int  # NVML index, the N of /dev/nvidiaN
    healthy: bool = True
    paths: tuple[str, ...] = ()  # device nodes given to a container, e.g. ("/dev/nvidia0",)
    numa_node: int | None = None  # reported as the device's topology when known


def nvidia_device(
    uuid: str, index: int, *, healthy: bool = True, numa_node: int | None = None
) -> PluginDevice:
    """A GPU with the NVIDIA driver's device node, ``/dev/nvidia<index>``."""
    return PluginDevice(GpuUuid(uuid), index, healthy, (f"/dev/nvidia{index}",), numa_node)


class DeviceSource(Protocol):
    def current(self) -> tuple[PluginDevice, ...]:
        """The devices now, in a stable order."""
        ...

    async def changed(self, after: int) -> int:
        """Wait until the version passes ``after``; the new version (at once if it already has).

        ``changed(-1)`` answers the current version without waiting.
        """
        ...

    def topology(self) -> NodeTopology | None:
        """How the devices are connected, by NVML index; None where the node does not say."""
        ...


class InMemoryDeviceSource:
    """A :class:`DeviceSource` whose list is set by its owner; the version counts the changes."""

    def __init__(self, devices: Iterable[PluginDevice] = ()) -> None:
        self._devices = _ordered(devices)
        self._version = 0
        self._event = asyncio.Event()  # set, and replaced, on every change
        self._topology: NodeTopology | None = None

    @property
    def version(self) -> int:
        return self._version

    def current(self) -> tuple[PluginDevice, ...]:
        return self._devices

    def topology(self) -> NodeTopology | None:
        return self._topology

    def set_topology(self, topology: NodeTopology | None) -> None:
        """The node's topology, as the agent read it (once, at its start)."""
        self._topology = topology

    async def changed(self, after: int) -> int:
        while self._version <= after:
            await self._event.wait()
        return self._version

    def set(self, devices: Iterable[PluginDevice]) -> int:
        """Replace the list; the version after (unchanged when the list is the same)."""
        fresh = _ordered(devices)
        if fresh != self._devices:
            self._devices = fresh
            self._version += 1
            self._event.set()
            self._event = asyncio.Event()
        return self._version

    def set_health(self, uuid: str, healthy: bool) -> int:
        """Mark one device healthy or unhealthy; unknown UUIDs change nothing."""
        return self.set(replace(d, healthy=healthy) if d.uuid == uuid else d for d in self._devices)


def _ordered(devices: Iterable[PluginDevice]) -> tuple[PluginDevice, ...]:
    return tuple(sorted(devices, key=lambda d: (d.index, d.uuid)))
