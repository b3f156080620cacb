"""What a container is given for its GPUs: environment, device nodes, annotations. Pure.

``NVIDIA_VISIBLE_DEVICES`` names the GPUs by UUID for the NVIDIA container runtime; the device
nodes (``/dev/nvidiaN`` of each GPU, plus the driver's control devices when configured) let a
runtime without the NVIDIA hook expose exactly these devices; the container annotation
``tidelease.io/devices`` records the UUIDs for the runtime and for people reading the CRI state.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from common import contract
from common.errors import InvalidInput
from common.model import GpuUuid

if TYPE_CHECKING:
    from nodeagent.deviceplugin.devices import PluginDevice

VISIBLE_DEVICES_ENV = "NVIDIA_VISIBLE_DEVICES"


@dataclass(frozen=True, slots=True)
class DeviceNode:
    container_path: str
    host_path: str
    permissions: str


@dataclass(frozen=True, slots=True)
class ContainerGrant:
    envs: Mapping[str, str]
    devices: tuple[DeviceNode, ...]
    annotations: Mapping[str, str]


def container_grant(
    uuids: Sequence[GpuUuid],
    known: Mapping[GpuUuid, PluginDevice],
    *,
    control_devices: Sequence[str] = (),
    permissions: str = "rw",
    host_root: str = "",
) -> ContainerGrant:
    """The grant for ``uuids``, in that order. Raises InvalidInput naming unknown UUIDs.

    Device nodes keep their path in the container; on the host they are looked up under
    ``host_root`` (empty: the host's own /dev)."""
    unknown = [u for u in uuids if u not in known]
    if unknown:
        raise InvalidInput(f"unknown device IDs: {', '.join(unknown)}")
    paths = [p for u in uuids for p in known[u].paths]
    paths += [p for p in control_devices if p not in paths]
    listed = ",".join(uuids)
    return ContainerGrant(
        envs={VISIBLE_DEVICES_ENV: listed},
        devices=tuple(
            DeviceNode(p, host_root.rstrip("/") + p, permissions) for p in dict.fromkeys(paths)
        ),
        annotations={contract.ANN_DEVICES: listed},
    )
