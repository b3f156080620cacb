"""The kubelet device plugin of the node agent: the container gets the GPUs the extender chose.

Speaks deviceplugin v1beta1 over gRPC on a unix socket in the kubelet's device-plugin dir
(``api.proto``, generated modules from ``hack/gen-proto.sh``). It advertises the node's GPUs by
UUID with their health (ListAndWatch), steers the kubelet towards the devices the extender
recorded on the pod at bind time (GetPreferredAllocation), and in Allocate gives the container
those devices, once the node's allocation ledger confirms them (``confirming.py``: an annotation a
tenant rewrote is refused), and marks the pod ``tidelease.io/devices-assigned``.

Inputs from the rest of the agent: a :class:`DeviceSource` (the devices and their health) and a
:class:`PodLookup` (the node's pods and its ledger; :class:`KubePodLookup` over the API
server). Run it with :func:`run_device_plugin`.
"""

from __future__ import annotations

from nodeagent.deviceplugin.devices import (
    DeviceSource,
    InMemoryDeviceSource,
    PluginDevice,
    nvidia_device,
)
from nodeagent.deviceplugin.matching import NodePod
from nodeagent.deviceplugin.plugin import run_device_plugin
from nodeagent.deviceplugin.pods import KubePodLookup, NullPodLookup, PodLookup
from nodeagent.deviceplugin.settings import DevicePluginSettings

__all__ = [
    "DevicePluginSettings",
    "DeviceSource",
    "InMemoryDeviceSource",
    "KubePodLookup",
    "NodePod",
    "NullPodLookup",
    "PluginDevice",
    "PodLookup",
    "nvidia_device",
    "run_device_plugin",
]
