"""DRA kubelet plugin settings: a frozen tree with named defaults and a pure ``validate()``.

The kubelet dials the DRA socket at the absolute path the registration names, on the host: the
agent must see the kubelet's dirs at the same paths (hostPath mounts at the same place).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from common.coercion import finite, whole
from common.deviceattributes import DRIVER  # the driver name of slices, classes and allocations

# The gRPC service the plugin serves, as the registration names it: "<last element of the proto
# package>.<service>". The v1.35 kubelet accepts "v1.DRAPlugin" and "v1beta1.DRAPlugin".
DRA_SERVICE = "v1.DRAPlugin"
PLUGIN_TYPE = "DRAPlugin"  # PluginInfo.type of a DRA driver's plugin
DEFAULT_REGISTRY_DIR = Path("/var/lib/kubelet/plugins_registry")
DEFAULT_PLUGINS_DIR = Path("/var/lib/kubelet/plugins")
DEFAULT_CDI_DIR = Path("/var/run/cdi")
DRA_SOCKET_NAME = "dra.sock"
CDI_KIND = "tidelease.io/gpu"  # vendor/class of the CDI devices the plugin writes
MIB = 1 << 20
_UNIX_PATH_MAX = 107  # sun_path holds 108 bytes with the terminating NUL
# A DNS subdomain, as Kubernetes requires of a DRA driver name.
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
# CDI's vendor and class names: a letter first, a letter or digit last, "_.-" between.
_CDI_NAME = r"[A-Za-z]([A-Za-z0-9_.-]*[A-Za-z0-9])?"
_CDI_KIND = re.compile(rf"^{_CDI_NAME}/{_CDI_NAME}$")


@dataclass(frozen=True, slots=True)
class DraPluginSettings:
    node_name: str = ""  # the node this agent runs on: the pool of its ResourceSlice; required
    driver: str = DRIVER
    registry_dir: Path = DEFAULT_REGISTRY_DIR  # the kubelet's plugins_registry dir
    # The DRA socket and the checkpoint live in <plugins_dir>/<driver>/.
    plugins_dir: Path = DEFAULT_PLUGINS_DIR
    cdi_dir: Path = DEFAULT_CDI_DIR  # where the container runtime reads CDI specs
    cdi_kind: str = CDI_KIND
    # Device nodes every prepared claim gives its containers besides its GPUs' own, e.g.
    # ("/dev/nvidiactl", "/dev/nvidia-uvm"); empty leaves them to the NVIDIA container runtime.
    control_devices: tuple[str, ...] = ()
    device_permissions: str = "rw"
    # Where the host's "/" is for device nodes: "" on a real node; a test node with fake GPUs
    # sets a directory holding dev/nvidiaN stand-ins, as for the device plugin.
    host_device_root: str = ""
    # Bound on each ResourceClaim read (the kubelet waits 45 s for a whole prepare call).
    api_timeout_s: float = 10.0
    max_claims_per_call: int = 64  # a pod's claims for one driver come in one call
    max_message_bytes: int = 4 * MIB  # largest gRPC message received or sent
    max_concurrent_rpcs: int = 16  # calls beyond this are refused (RESOURCE_EXHAUSTED)
    serve_backoff_s: float = 0.5  # first retry delay when a socket cannot be bound; doubles
    serve_backoff_max_s: float = 10.0
    stop_grace_s: float = 2.0  # in-flight calls get this long when the servers stop

    @property
    def plugin_dir(self) -> Path:
        """The plugin's own dir: the DRA socket and the checkpoint of prepared claims."""
        return self.plugins_dir / self.driver

    @property
    def dra_socket_path(self) -> Path:
        return self.plugin_dir / DRA_SOCKET_NAME

    @property
    def registration_socket_path(self) -> Path:
        return self.registry_dir / f"{self.driver}-reg.sock"

    @property
    def checkpoint_path(self) -> Path:
        return self.plugin_dir / "checkpoint.json"

    def validate(self) -> list[str]:
        """Every problem at once; empty when the settings are usable."""
        problems = []
        if not self.node_name:
            problems.append("node_name is required (the node this agent runs on)")
        if len(self.driver) > 63 or not _DNS_SUBDOMAIN.match(self.driver):
            problems.append(f"driver {self.driver!r} is not a DNS subdomain of at most 63 chars")
        for name in ("registry_dir", "plugins_dir", "cdi_dir"):
            if not getattr(self, name).is_absolute():
                problems.append(f"{name} {getattr(self, name)} is not an absolute path")
        for socket in (self.dra_socket_path, self.registration_socket_path):
            if len(str(socket).encode()) > _UNIX_PATH_MAX:
                problems.append(f"socket path {socket} is longer than a unix socket allows")
        if not _CDI_KIND.match(self.cdi_kind):
            problems.append(f"cdi_kind {self.cdi_kind!r} is not vendor/class")
        if not self.device_permissions or set(self.device_permissions) - set("rwm"):
            problems.append(f"device_permissions {self.device_permissions!r}: want some of r, w, m")
        if self.host_device_root and not self.host_device_root.startswith("/"):
            problems.append(f"host_device_root {self.host_device_root!r} is not an absolute path")
        for path in self.control_devices:
            if not path.startswith("/dev/"):
                problems.append(f"control device {path!r} is not under /dev/")
        for name in ("max_claims_per_call", "max_message_bytes", "max_concurrent_rpcs"):
            value = getattr(self, name)
            if not whole(value) or value < 1:
                problems.append(f"{name} must be a positive integer")
        for name in ("api_timeout_s", "serve_backoff_s", "serve_backoff_max_s"):
            if not finite(getattr(self, name)) or getattr(self, name) <= 0:
                problems.append(f"{name} must be a positive finite number")
        if not finite(self.stop_grace_s) or self.stop_grace_s < 0:
            problems.append("stop_grace_s must be a finite number, not negative")
        return problems
